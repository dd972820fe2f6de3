"""Real datasets from their sources: what to fetch, then how to preprocess it.

A dataset's ``source`` section in the workflow config is a ``SourceConfig``.
``fetch`` puts the raw files into a directory whose ``source.json`` records
where they came from (URL, size, sha256); ``preprocess`` turns them into the
on-disk dataset format with that provenance in the manifest.
"""
from __future__ import annotations

import dataclasses
import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse
from urllib.request import url2pathname

from hotcold.files import atomic_write_json
from hotcold.config import ConfigError, is_int
from hotcold.data.sources.criteo import CriteoConfig, preprocess_criteo
from hotcold.data.sources.catalog import (
    CRITEO_KAGGLE_URL,
    CRITEO_TERABYTE_BASE_URL,
    SOURCE_FILE,
    describe_local,
    fetch_criteo_kaggle,
    fetch_criteo_terabyte,
    locate_taobao,
)
from hotcold.data.sources.taobao import preprocess_taobao
from hotcold.data.sources.taobao_config import TaobaoConfig

KINDS = ("criteo-kaggle", "criteo-terabyte", "taobao")


@dataclass(frozen=True)
class SourceConfig:
    """Where a real dataset comes from and how it is preprocessed."""

    kind: str
    url: str | None = None            # Kaggle archive URL / Terabyte base URL; None: the public one
    sha256: str | Mapping[int, str] | None = None  # Kaggle archive / Taobao CSV; Terabyte: {day: sha256}
    days: tuple[int, ...] = tuple(range(24))  # Terabyte day files to use
    path: str | None = None           # Taobao: the local UserBehavior.csv (needs a login to get)
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
        return cfg

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha256", _checksums(self.kind, self.sha256))

    def preprocess_config(self) -> CriteoConfig | TaobaoConfig:
        if self.kind == "taobao":
            return TaobaoConfig.from_dict(self.preprocess)
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


def fetch(cfg: SourceConfig, raw_dir: Path, *, name: str, progress: bool = True) -> dict[str, Any]:
    """Fetch (or, for Taobao, locate and hash) the raw files; ``raw_dir/source.json`` marks completion."""
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    if cfg.kind == "criteo-kaggle":
        return fetch_criteo_kaggle(raw_dir, url=cfg.url or CRITEO_KAGGLE_URL, sha256=cfg.sha256, progress=progress)
    if cfg.kind == "criteo-terabyte":
        return fetch_criteo_terabyte(raw_dir, days=list(cfg.days), base_url=cfg.url or CRITEO_TERABYTE_BASE_URL,
                                     sha256=cfg.sha256, progress=progress)
    record = describe_local(locate_taobao(cfg.path, name=name), cfg.sha256)
    atomic_write_json(raw_dir / SOURCE_FILE, record)
    return record


def _fetched(raw_dir: Path) -> dict[str, Any]:
    """``raw_dir/source.json``, checked for what preprocessing needs."""
    path = raw_dir / SOURCE_FILE
    try:
        source = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: run `hotcold download` first") from None
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): run `hotcold download` again") from None
    files = source.get("files") if isinstance(source, dict) else None
    if not (isinstance(files, list) and files and all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                      for f in files)):
        raise ValueError(f"{path} has no 'files' list of {{'name': ...}} records: run `hotcold download` again")
    return source


def preprocess(cfg: SourceConfig, raw_dir: Path, out: Path, *, name: str, progress: bool = True) -> dict[str, Any]:
    """Preprocess the fetched files of ``raw_dir`` into the dataset directory ``out``."""
    raw_dir = Path(raw_dir)
    source = _fetched(raw_dir)
    files = source["files"]
    provenance = {f["name"]: {k: v for k, v in f.items() if k != "name"} for f in files}
    if cfg.kind == "taobao":
        if not str(source.get("url", "")).startswith("file:"):
            raise ValueError(f"{raw_dir / SOURCE_FILE} does not record the local file (url): run "
                             f"`hotcold download` again")
        csv = Path(url2pathname(urlparse(source["url"]).path))
        return preprocess_taobao(csv, out, cfg.preprocess_config(), name=name, provenance=provenance,
                                 progress=progress, expected_sha256=cfg.sha256)
    if cfg.kind == "criteo-kaggle":
        inputs, expected = [raw_dir / "train.txt"], None
    else:
        by_day = {f.get("day"): f["name"] for f in files}
        missing = [d for d in cfg.days if d not in by_day]
        if missing:
            raise ValueError(f"{raw_dir / SOURCE_FILE} lists no file for day(s) {missing}: run `hotcold download`")
        inputs = [raw_dir / by_day[d] for d in sorted(cfg.days)]
        provenance = {p.name: provenance[p.name] for p in inputs}
        expected = {f"day_{d}.gz": s for d, s in (cfg.sha256 or {}).items() if d in cfg.days}
    return preprocess_criteo(inputs, out, cfg.preprocess_config(), name=name, provenance=provenance,
                             progress=progress, full=cfg.full, expected_sha256=expected)
