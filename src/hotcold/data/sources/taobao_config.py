"""The Taobao preprocessor's options (``TaobaoConfig``) and the dataset's documented time period."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from hotcold.config import from_mapping, is_int, is_real, require
from hotcold.data.sources.textparse import MAX_BAD_SHARE, WARN_BAD_SHARE, check_bad_line_options

# The dataset's documented period (https://tianchi.aliyun.com/dataset/649): 25 Nov to 3 Dec 2017, China
# Standard Time (UTC+8), in epoch seconds [2017-11-25 00:00, 2017-12-04 00:00) UTC+8.
TAOBAO_PERIOD = (1_511_539_200, 1_512_316_800)
MAX_OUT_OF_RANGE_SHARE = 0.01   # more lines outside time_range than this share fail the run
_NO_RANGE = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class TaobaoConfig:
    """How to build Taobao samples; validated on construction."""

    max_length: int = 20            # history events per sample, at most
    min_history: int = 1            # earlier events a position needs to be a sample
    samples_per_user: int = 10      # most recent positions per user, at most
    negative_ratio: float = 1.0     # negatives per positive (fraction: drawn per positive)
    holdout_quantile: float = 0.7   # users whose last event is later are val/test
    seed: int = 0
    # epoch seconds [start, end): lines with a timestamp outside are dropped and counted, with a warning;
    # null keeps every timestamp. Default: the dataset's documented period (TAOBAO_PERIOD).
    time_range: tuple[int, int] | None = TAOBAO_PERIOD
    max_out_of_range_share: float = MAX_OUT_OF_RANGE_SHARE  # fail when more than this share is outside
    on_bad_line: str = "skip"       # skip (count) | error (stop with file and line)
    warn_bad_share: float = WARN_BAD_SHARE  # warn when more than this share of the lines is malformed
    max_bad_share: float = MAX_BAD_SHARE    # fail when more than this share is (skip policy)
    chunk_lines: int = 1 << 16

    def __post_init__(self) -> None:
        w = "taobao config"
        for name, low in (("max_length", 1), ("min_history", 0), ("samples_per_user", 1), ("seed", 0),
                          ("chunk_lines", 1)):
            v = getattr(self, name)
            require(is_int(v) and v >= low, w, f"{name} must be an integer >= {low}, got {v!r}")
        r = self.negative_ratio
        require(is_real(r) and 0 <= r < math.inf, w,
                     f"negative_ratio must be a finite number >= 0, got {r!r}")
        q = self.holdout_quantile
        require(is_real(q) and 0 < q < 1, w,
                     f"holdout_quantile must be in (0, 1), got {q!r}")
        check_bad_line_options(w, self.on_bad_line, self.warn_bad_share, self.max_bad_share)
        t = self.time_range
        require(t is None or (isinstance(t, (list, tuple)) and len(t) == 2 and all(is_int(x) for x in t)
                              and _NO_RANGE[0] <= t[0] < t[1] <= _NO_RANGE[1]), w,
                f"time_range must be null or [start, end] epoch seconds with start < end, got {t!r}")
        s = self.max_out_of_range_share
        require(is_real(s) and 0 <= s <= 1, w, f"max_out_of_range_share must be a number in [0, 1], got {s!r}")
        if t is not None:
            object.__setattr__(self, "time_range", (int(t[0]), int(t[1])))
        object.__setattr__(self, "negative_ratio", float(r))
        object.__setattr__(self, "holdout_quantile", float(q))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TaobaoConfig":
        return from_mapping(cls, d, "taobao config")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["time_range"] = None if self.time_range is None else list(self.time_range)
        return d

    @property
    def time_bounds(self) -> tuple[int, int]:
        """``[start, end)`` of the timestamps kept (every int64 when ``time_range`` is null)."""
        return _NO_RANGE if self.time_range is None else self.time_range
