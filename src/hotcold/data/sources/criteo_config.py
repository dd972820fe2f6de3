"""How the Criteo logs are preprocessed (``CriteoConfig``): the options and their checks, apart from the
preprocessing (``criteo``), so that a workflow checks a config without loading it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from hotcold.config import from_mapping, is_int, require
from hotcold.data.sources.textparse import MAX_BAD_SHARE, WARN_BAD_SHARE, check_bad_line_options

KINDS = ("criteo-kaggle", "criteo-terabyte")
ENCODINGS = ("frequency", "modulo")


@dataclass(frozen=True)
class CriteoConfig:
    """How to preprocess Criteo; validated on construction.

    Conventions (also recorded in the manifest):

    - dense: ``log(1 + max(x, 0))`` as float32; a missing integer is 0.
    - ``frequency`` encoding: per table, ids seen at least ``min_frequency`` times
      in the train split get 1..n by descending train count (ties: ascending raw
      value); 0 is the shared bucket of missing, rare and unseen (val/test) ids.
      Cardinality n + 1.
    - ``modulo`` encoding (torchrec/DLRM hashing): ``int(hex, 16) % max_ind_range``,
      a missing id is read as ``"0"`` (id 0) as the DLRM reference does.
      Cardinality ``max_ind_range`` for every table.
    - splits: Kaggle's lines are cut into 7 "days" as DLRM does (``divmod(lines,
      7)``, the first ``lines % 7`` days one line longer); days 0-5 are train.
      Terabyte: all but the last given day file are train. The last day is halved
      into val then test with ``np.array_split`` rounding (val gets the odd line).
      Boundaries are on raw line numbers; skipped bad lines do not shift them.
    """

    kind: str                       # criteo-kaggle | criteo-terabyte
    encoding: str = "frequency"     # frequency | modulo
    min_frequency: int = 1          # frequency: train ids seen fewer times share bucket 0
    max_ind_range: int = 10_000_000  # modulo: rows per table
    on_bad_line: str = "skip"       # skip (count) | error (stop with file and line)
    warn_bad_share: float = WARN_BAD_SHARE  # warn when more than this share of the lines is malformed
    max_bad_share: float = MAX_BAD_SHARE    # fail when more than this share is (skip policy)
    chunk_lines: int = 1 << 16
    expected_rows: int | None = None  # raw lines the inputs must hold (checked when given)
    check_rows: bool = False        # inputs are the full dataset: check the known line count

    def __post_init__(self) -> None:
        w = "criteo config"
        require(self.kind in KINDS, w, f"unknown kind {self.kind!r}; allowed: {list(KINDS)}")
        require(self.encoding in ENCODINGS, w, f"encoding must be one of {list(ENCODINGS)}, got {self.encoding!r}")
        require(is_int(self.min_frequency) and self.min_frequency >= 1, w,
                     f"min_frequency must be an integer >= 1, got {self.min_frequency!r}")
        require(is_int(self.max_ind_range) and 1 <= self.max_ind_range < 2**31, w,
                     f"max_ind_range must be an integer in [1, 2**31), got {self.max_ind_range!r}")
        check_bad_line_options(w, self.on_bad_line, self.warn_bad_share, self.max_bad_share)
        require(is_int(self.chunk_lines) and self.chunk_lines >= 1, w,
                     f"chunk_lines must be a positive integer, got {self.chunk_lines!r}")
        require(self.expected_rows is None or (is_int(self.expected_rows) and self.expected_rows >= 0), w,
                     f"expected_rows must be a non-negative integer or null, got {self.expected_rows!r}")
        require(isinstance(self.check_rows, bool), w, f"check_rows must be true or false, got {self.check_rows!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CriteoConfig":
        return from_mapping(cls, d, "criteo config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
