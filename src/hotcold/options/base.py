"""Typed store options: one frozen dataclass per store, parsed and validated once.

A store declares its options class (``EmbeddingStore.Options``); the method
registry (``hotcold.methods``) reads it from there. ``parse`` turns the plain
mapping of a config file into the typed object, naming an unknown or bad key
in one line; the workflow schema's ``$defs.methods`` is pinned to these
classes by a test. Device budgets are given either in rows (or bytes) or as a
share of all rows, never both: ``check_budget`` and ``budget_rows``. The
budgets themselves are data here too (what a share of a table buys, the
caches' warm start, FAE's defaults), read by the options and the policies
alike; nothing here imports an algorithm.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

from hotcold.config import ConfigError, from_mapping, is_int, is_real, require

O = TypeVar("O", bound="StoreOptions")


# -- budgets as data: what a share of a table buys, the caches' warm start, FAE's defaults ----------------
def rows_for_share(ratio: float, num_rows: int) -> int:
    """Rows of a share of all rows, ``floor(ratio * N)`` at most N (the epsilon keeps ratio = k / N at k)."""
    return min(int(ratio * num_rows + 1e-9), num_rows)


def capacity_from_ratio(ratio: float, num_rows: int) -> int:
    """Cache slots for a share of all rows: at least 1."""
    return max(1, rows_for_share(ratio, num_rows))


def warm_count(capacity: int, warmup_ratio: float, num_rows: int) -> int:
    """Rows preloaded by ``freqcache``: ``ceil(C * warmup_ratio)``, as ColossalAI, at most N."""
    return min(math.ceil(capacity * warmup_ratio), num_rows, capacity)


DEFAULT_SAMPLE_FRACTION = 0.05
DEFAULT_BUDGET_RATIO = 0.124   # 256 MiB of full Criteo Kaggle's 2061 MiB of weights at D=16
EPOCH = "epoch"
#: a scale-out rank's memory budget, as a multiple of the row-wise shard
DEFAULT_HEADROOM = 1.25


def check_run_length(value: Any) -> int | str:
    """A positive integer or ``"epoch"``."""
    if value == EPOCH or (is_int(value) and value >= 1):
        return value
    raise ConfigError(f"fae: run_length must be a positive integer or {EPOCH!r}, got {value!r}")


# -- the options' base ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreOptions:
    """A store's options. Subclasses add fields (None: not given) and ``validate``."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def parse(cls: type[O], data: StoreOptions | Mapping[str, Any] | None, where: str) -> O:
        """The typed options from a mapping (an instance of ``cls`` is returned as it is).

        Unknown keys fail naming the allowed ones; a null value fails (in a
        config file a null removes an option before it reaches a store).
        """
        if isinstance(data, cls):
            return data
        if isinstance(data, StoreOptions):
            raise ConfigError(f"{where}: got {type(data).__name__}, expected {cls.__name__}")
        for key, value in (data or {}).items():
            require(value is not None, where, f"{key} must not be null (give a value, or leave it out)")
        return from_mapping(cls, data, where, "option")

    def validate(self, where: str) -> None:
        """Raise ``ConfigError`` naming the first bad option."""

    def device_share(self) -> float | None:
        """The share of all rows this variant keeps in device memory, where the options state one as a share."""
        return None

    def infeasible_on(self, device: str) -> str | None:
        """Why these options cannot run on a trainer device of type ``device`` (``cpu``, ``cuda``); None: they can.

        Known from the options alone, so the workflow writes such a run's
        ``infeasible`` record without starting a process.
        """
        return None


@dataclass(frozen=True)
class NoOptions(StoreOptions):
    """A store without options (``device``, ``hybrid``)."""


def check_budget(where: str, rows_key: str, rows: Any, ratio_key: str, ratio: Any, allow_zero: bool = False) -> None:
    """A device budget as an absolute ``rows_key`` or a share ``ratio_key`` of all rows, at most one given."""
    require(rows is None or ratio is None, where, f"{ratio_key} and {rows_key} are alternatives; give one of them, "
            "not both")
    low = 0 if allow_zero else 1
    if rows is not None:
        require(is_int(rows) and rows >= low, where, f"{rows_key} must be an integer >= {low}, got {rows!r}")
    if ratio is not None:
        require(is_real(ratio) and math.isfinite(ratio) and (0 <= ratio if allow_zero else 0 < ratio) and ratio <= 1,
                where, f"{ratio_key} must be in {'[' if allow_zero else '('}0, 1], got {ratio!r}")


def check_choice(where: str, key: str, value: Any, choices: tuple[Any, ...]) -> None:
    require(value in choices, where, f"{key} must be one of {list(choices)}, got {value!r}")


def budget_rows(rows: int | None, ratio: float | None, num_rows: int, *, default_ratio: float | None = None,
                unit_bytes: int = 1, allow_zero: bool = False) -> int | None:
    """Rows of device memory a budget gives, at most ``num_rows`` (checked options, see ``check_budget``).

    From ``rows`` (in rows, or in bytes with ``unit_bytes`` the bytes of one
    row) or ``ratio`` (a share of all rows, ``floor(ratio * N)``), else
    ``default_ratio``; None when there is none. Without ``allow_zero`` at
    least one row.
    """
    if rows is not None:
        n = int(rows) // unit_bytes
    elif ratio is not None or default_ratio is not None:
        n = rows_for_share(ratio if ratio is not None else default_ratio, num_rows)
    else:
        return None
    return min(max(n, 0 if allow_zero else 1), num_rows)
