"""Configuration of the generated datasets: ``GeneratorConfig``, the real table sizes, splits.

Kinds: ``criteo-kaggle-style``, ``criteo-terabyte-style``, ``taobao-style`` and
``criteo-multihot-style`` (MLPerf's DLRM-DCNv2 data: Terabyte-style first ids
over MLPerf's 26 tables, each table's bag filled out as MLPerf does,
``generators.bags``).

Knobs: ``exponent`` and ``holdout_fraction`` default per kind
(``None`` resolves them); ``max_length`` and ``interest_drift`` apply to
``taobao-style`` only and are rejected for the Criteo kinds.

Two models of row popularity (``docs/datasets.md``): with tables capped
(``max_rows_per_table`` an integer, the default workflow's datasets) every
sample draws its ids independently from a power law; at the real table sizes
(``max_rows_per_table: null``) every kind uses a full-size model
(``generators.occurrences``; Taobao: ``generators.taobao_fullsize``), whose
dataset of ``rows`` samples is the first ``rows`` samples of a full dataset
of ``full_samples`` samples in which every row occurs at least once (Taobao:
``full_samples`` counts the full dataset's clicks, the behaviours of the real
log; ``full_rows`` its samples). ``scale`` shrinks that full dataset (every
table and ``full_samples``) for tests and quick looks at the same construction.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from hotcold.config import ConfigError, is_int, is_real

KINDS = ("criteo-kaggle-style", "criteo-terabyte-style", "taobao-style", "criteo-multihot-style")
DEFAULT_NAMES = {"criteo-kaggle-style": "kaggle", "criteo-terabyte-style": "terabyte", "taobao-style": "taobao",
                 "criteo-multihot-style": "multihot"}

# Rows per table of the Criteo Kaggle display-advertising data (C1..C26).
CRITEO_KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]
# Rows per table of Criteo Terabyte preprocessed with DLRM's --max-ind-range=10000000.
CRITEO_TERABYTE_CARDINALITIES = [
    9980333, 36084, 17217, 7378, 20134, 3, 7112, 1442, 61, 9758201, 1333352, 313829, 10,
    2208, 11156, 122, 4, 970, 14, 9994222, 7267859, 9946608, 415421, 12420, 101, 36,
]
# Rows per table of MLPerf Training's DLRM-DCNv2 (recommendation_v2, Criteo 1TB hashed to at most 40M rows a table)
# and the size of each table's multi-hot bag (MLPerf's --multi_hot_sizes): 204,184,588 rows, 214 lookups a sample.
MLPERF_CARDINALITIES = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976,
    14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]
MLPERF_BAGS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
# Users, items and categories of Taobao UserBehavior, as TBSM's --arch-embedding-size.
TAOBAO_CARDINALITIES = [987994, 4162024, 9439]
# Samples of the real datasets: Criteo Kaggle's train.txt (7 days), Criteo
# Terabyte's 24 day files, Taobao UserBehavior's behaviours.
REAL_SAMPLES = {"criteo-kaggle-style": 45_840_617, "criteo-terabyte-style": 4_373_472_329,
                "taobao-style": 100_150_807, "criteo-multihot-style": 4_373_472_329}
FULL_CARDINALITIES = {
    "criteo-kaggle-style": CRITEO_KAGGLE_CARDINALITIES,
    "criteo-terabyte-style": CRITEO_TERABYTE_CARDINALITIES,
    "taobao-style": TAOBAO_CARDINALITIES,
    "criteo-multihot-style": MLPERF_CARDINALITIES,
}

# Per-kind defaults of the knobs left as None. Criteo's 1.3 puts ~90% of the
# lookups of a capped big table on its top 1% of rows (see generators.criteo);
# Taobao's item popularity is flatter (see generators.taobao). Terabyte's holdout is
# its last day of 24, Kaggle's the DLRM reference's 10% tail.
DEFAULT_EXPONENTS = {"criteo-kaggle-style": 1.3, "criteo-terabyte-style": 1.3, "taobao-style": 1.0,
                     "criteo-multihot-style": 1.3}
# Exponent of the full-size model (real table sizes): fitted so that, over Kaggle's
# 45,840,617 samples, 998,921 rows occur more than 10 times, as measured on the real
# file (``generators.occurrences.KAGGLE_ROWS_SEEN_OVER_10``); Terabyte assumes Kaggle's.
# Taobao keeps its item exponent (no published count of rarely seen items found; docs/datasets.md).
FULL_SIZE_EXPONENTS = {"criteo-kaggle-style": 1.146, "criteo-terabyte-style": 1.146, "taobao-style": 1.0,
                       "criteo-multihot-style": 1.146}
DEFAULT_HOLDOUT = {"criteo-kaggle-style": 0.1, "criteo-terabyte-style": 1 / 24, "taobao-style": 0.1,
                   "criteo-multihot-style": 1 / 24}
TAOBAO_DEFAULTS = {"max_length": 20, "interest_drift": 0.02}


@dataclass(frozen=True)
class GeneratorConfig:
    """Parameters of one synthetic dataset; validated on construction, None resolved per kind."""

    name: str | None = None                # default: "kaggle", "terabyte" or "taobao"
    kind: str = "criteo-kaggle-style"
    rows: int = 500_000                    # total samples
    max_rows_per_table: int | None = 100_000  # cap on each table's cardinality; None: real sizes
    exponent: float | None = None          # power-law exponent of row (Taobao: item) popularity
    drift: float = 0.05                    # fraction of hot ranks re-assigned per segment boundary
    drift_segments: int = 20
    holdout_fraction: float | None = None  # share of samples for val + test (Criteo: the tail; Taobao: latest users)
    seed: int = 0
    max_length: int | None = None          # taobao-style: history events per sample (default 20)
    interest_drift: float | None = None    # taobao-style: chance a click replaces a favourite category
    full_samples: int | None = None        # real table sizes only: samples (Taobao: clicks) of the full dataset
    #                                        (default: the real one's)
    scale: float | None = None             # real table sizes only: every table and full_samples times this (default 1)

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"generator config: {msg}")

        def resolve(field: str, default: Any) -> None:
            if getattr(self, field) is None:
                object.__setattr__(self, field, default)

        need(self.kind in KINDS, f"unknown kind {self.kind!r}; allowed kinds: {list(KINDS)}")
        full_size = self.max_rows_per_table is None
        resolve("name", DEFAULT_NAMES[self.kind])
        resolve("exponent", (FULL_SIZE_EXPONENTS if full_size else DEFAULT_EXPONENTS)[self.kind])
        resolve("holdout_fraction", DEFAULT_HOLDOUT[self.kind])
        if self.kind == "taobao-style":
            for field, default in TAOBAO_DEFAULTS.items():
                resolve(field, default)
        else:
            given = [f for f in TAOBAO_DEFAULTS if getattr(self, f) is not None]
            need(not given, f"{given} only apply to kind 'taobao-style', not {self.kind!r}")
        need(isinstance(self.name, str) and bool(self.name), f"name must be a non-empty string, got {self.name!r}")
        need(is_int(self.rows) and self.rows > 0, f"rows must be a positive integer, got {self.rows!r}")
        need(self.max_rows_per_table is None or (is_int(self.max_rows_per_table) and self.max_rows_per_table > 0),
             f"max_rows_per_table must be a positive integer or null, got {self.max_rows_per_table!r}")
        need(is_real(self.exponent) and 0 < self.exponent < math.inf,
             f"exponent must be a finite number > 0, got {self.exponent!r}")
        need(is_real(self.drift) and 0 <= self.drift < 1, f"drift must be in [0, 1), got {self.drift!r}")
        need(is_int(self.drift_segments) and self.drift_segments >= 1,
             f"drift_segments must be an integer >= 1, got {self.drift_segments!r}")
        need(is_real(self.holdout_fraction) and 0 < self.holdout_fraction < 1,
             f"holdout_fraction must be in (0, 1), got {self.holdout_fraction!r}")
        need(is_int(self.seed) and self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
        floats, ints = ["exponent", "drift", "holdout_fraction"], ["rows", "drift_segments", "seed"]
        if self.kind == "taobao-style":
            need(is_int(self.max_length) and self.max_length >= 1,
                 f"max_length must be an integer >= 1, got {self.max_length!r}")
            need(is_real(self.interest_drift) and 0 <= self.interest_drift <= 1,
                 f"interest_drift must be in [0, 1], got {self.interest_drift!r}")
            need(self.max_rows_per_table is None or self.max_rows_per_table >= 2,
                 "taobao-style needs max_rows_per_table >= 2 (a negative is an item other than the click)")
            floats.append("interest_drift")
            ints.append("max_length")
        if full_size:
            resolve("scale", 1.0)
            need(is_real(self.scale) and 0 < self.scale <= 1, f"scale must be in (0, 1], got {self.scale!r}")
            object.__setattr__(self, "scale", float(self.scale))
            resolve("full_samples", max(1, round(REAL_SAMPLES[self.kind] * self.scale)))
            least = max(self.cardinalities)
            if self.kind == "taobao-style":   # every user clicks twice: a first click (history only) and a sample
                least = max(least, 2 * self.cardinalities[0])
            need(is_int(self.full_samples) and self.full_samples >= least,
                 f"full_samples must be an integer >= {least} (every row occurs at least once"
                 f"{', every user clicks twice' if self.kind == 'taobao-style' else ''}), got {self.full_samples!r}")
            object.__setattr__(self, "full_samples", int(self.full_samples))
            need(self.rows <= self.full_rows, f"rows={self.rows} exceeds the full dataset's {self.full_rows} "
                 f"samples (full_samples={self.full_samples}): a dataset is a prefix of the full one")
        else:
            given = [f for f in ("full_samples", "scale") if getattr(self, f) is not None]
            need(not given, f"{given} apply only at the real table sizes (max_rows_per_table: null)")
        for f in floats:
            object.__setattr__(self, f, float(getattr(self, f)))
        for f in ints:
            object.__setattr__(self, f, int(getattr(self, f)))
        sizes = split_sizes(self.rows, self.holdout_fraction)
        need(min(sizes) >= 1, f"rows={self.rows} with holdout_fraction={self.holdout_fraction} leaves an empty "
             f"split (train/val/test sizes {list(sizes)})")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GeneratorConfig":
        """Build from a plain dict, rejecting unknown keys by name."""
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ConfigError(f"generator config: unknown key(s) {unknown}; allowed: {allowed}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``full_samples`` and ``scale`` only where they apply (capped manifests stay as they were)."""
        d = dataclasses.asdict(self)
        for f in ("full_samples", "scale"):
            if d[f] is None:
                del d[f]
        return d

    @property
    def full_size(self) -> bool:
        """True at the real table sizes: the full-size model (``generators.occurrences``)."""
        return self.full_samples is not None

    @property
    def full_rows(self) -> int | None:
        """Samples of the full dataset: ``full_samples``; Taobao: 2 per click after a user's first."""
        if self.full_samples is None:
            return None
        if self.kind == "taobao-style":
            return 2 * (self.full_samples - self.cardinalities[0])
        return self.full_samples

    @property
    def bags(self) -> list[int] | None:
        """Multi-hot kinds: each table's ids a sample (MLPerf's bag sizes); None: one id per table."""
        return list(MLPERF_BAGS) if self.kind == "criteo-multihot-style" else None

    @property
    def full_cardinalities(self) -> list[int]:
        """Per-table rows of the real dataset this kind imitates."""
        return list(FULL_CARDINALITIES[self.kind])

    @property
    def cardinalities(self) -> list[int]:
        """Per-table rows after the cap (or, at real sizes, times ``scale``, rounded up)."""
        cap = self.max_rows_per_table
        if cap is None:
            scale = 1.0 if self.scale is None else self.scale
            return [c if scale == 1 else math.ceil(c * scale) for c in self.full_cardinalities]
        return [min(c, cap) for c in self.full_cardinalities]


def split_sizes(rows: int, holdout_fraction: float) -> tuple[int, int, int]:
    """(train, val, test) sizes: the holdout tail is halved into val then test.

    This mirrors the DLRM reference, which halves the last day of Criteo
    Kaggle and of Criteo Terabyte into validation and test.
    """
    hold = int(round(rows * holdout_fraction))
    return rows - hold, hold // 2, hold - hold // 2


def split_ranges(rows: int, holdout_fraction: float) -> dict[str, tuple[int, int]]:
    """Contiguous row ranges of train, val and test (``split_sizes``)."""
    n_train, n_val, _ = split_sizes(rows, holdout_fraction)
    return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, rows)}
