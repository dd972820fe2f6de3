"""A real dataset's ``source`` section (``SourceConfig``): where it comes from, how it is preprocessed, checked
without loading the fetching or the preprocessing (``prepare``)."""
from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass, field
from typing import Any, Mapping

from hotcold.config import ConfigError, is_int
from hotcold.data.sources.criteo_config import CriteoConfig
from hotcold.data.sources.taobao_config import TaobaoConfig

KINDS = ("criteo-kaggle", "criteo-terabyte", "taobao", "mlperf-multihot")


@dataclass(frozen=True)
class SourceConfig:
    """Where a real dataset comes from and how it is preprocessed."""

    kind: str
    url: str | None = None            # Kaggle archive URL / Terabyte base URL; None: the public one
    sha256: str | Mapping[int, str] | None = None  # Kaggle archive / Taobao CSV; Terabyte: {day: sha256}
    days: tuple[int, ...] = tuple(range(24))  # Terabyte (and MLPerf's materialized) day files to use
    path: str | None = None           # Taobao: the local UserBehavior.csv (needs a login to get); mlperf-multihot:
    #                                   the directory of MLPerf's materialized day files (``sources.mlperf``)
    full: bool = False                # check the known row count of the complete source
    preprocess: dict[str, Any] = field(default_factory=dict)  # CriteoConfig / TaobaoConfig options

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SourceConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"source: unknown key(s) {unknown}; allowed: {sorted(names)}")
        if data.get("kind") not in KINDS:
            raise ConfigError(f"source: kind must be one of {KINDS}, got {data.get('kind')!r}")
        cfg = cls(**{**data, "days": tuple(data.get("days", range(24)))})
        cfg.preprocess_config()  # validate the preprocessing options early
        if cfg.kind == "mlperf-multihot" and not (cfg.path or "").strip():
            raise ConfigError("source: mlperf-multihot reads MLPerf's materialized day files: set source.path to "
                              "their directory (materialize_synthetic_multihot_dataset.py's --output_path)")
        return cfg

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha256", _checksums(self.kind, self.sha256))

    def preprocess_config(self) -> CriteoConfig | TaobaoConfig | None:
        if self.kind == "taobao":
            return TaobaoConfig.from_dict(self.preprocess)
        if self.kind == "mlperf-multihot":  # MLPerf's bags as materialized, MLPerf's rows: nothing to choose
            if self.preprocess:
                raise ConfigError(f"source: mlperf-multihot takes no preprocess options, got {sorted(self.preprocess)}")
            return None
        return CriteoConfig.from_dict({"kind": self.kind, **self.preprocess})


def _checksums(kind: str, sha256: Any) -> str | dict[int, str] | None:
    """The configured checksum(s) in canonical form: one lowercase hex string, or {day: hex} for Terabyte."""
    if sha256 is None:
        return None
    if kind == "criteo-terabyte":
        if not isinstance(sha256, Mapping):
            raise ConfigError("source: criteo-terabyte has one file per day, so sha256 must map days to "
                              "checksums, e.g. {0: <sha256 of day_0.gz>, 23: <sha256 of day_23.gz>}")
        out = {}
        for day, digest in sha256.items():
            d = int(day) if isinstance(day, str) and day.isdigit() else day
            if not is_int(d) or not 0 <= d <= 23:
                raise ConfigError(f"source: sha256 keys must be Terabyte days 0..23, got {day!r}")
            out[int(d)] = _hex(digest, f"sha256[{d}]")
        return out
    if isinstance(sha256, Mapping):
        raise ConfigError(f"source: {kind} has one file, so sha256 is one hex string, not a mapping")
    return _hex(sha256, "sha256")


def _hex(digest: Any, key: str) -> str:
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in string.hexdigits for c in digest)):
        raise ConfigError(f"source: {key} must be 64 hex digits, got {digest!r}")
    return digest.lower()
