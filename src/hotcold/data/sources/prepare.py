"""Real datasets from their sources: what to fetch, then how to preprocess it.

A dataset's ``source`` section in the workflow config is a ``SourceConfig``.
``fetch`` puts the raw files into a directory whose ``source.json`` records
where they came from (URL, size, sha256); ``preprocess`` turns them into the
on-disk dataset format with that provenance in the manifest.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse
from urllib.request import url2pathname

from hotcold.files import atomic_write_json
from hotcold.config import ConfigError
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
from hotcold.data.sources.taobao import TaobaoConfig, preprocess_taobao

KINDS = ("criteo-kaggle", "criteo-terabyte", "taobao")


@dataclass(frozen=True)
class SourceConfig:
    """Where a real dataset comes from and how it is preprocessed."""

    kind: str
    url: str | None = None            # Kaggle archive URL / Terabyte base URL; None: the public one
    sha256: str | None = None         # expected sha256 of the Kaggle archive, when known
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

    def preprocess_config(self) -> CriteoConfig | TaobaoConfig:
        if self.kind == "taobao":
            return TaobaoConfig.from_dict(self.preprocess)
        return CriteoConfig.from_dict({"kind": self.kind, **self.preprocess})


def fetch(cfg: SourceConfig, raw_dir: Path, *, name: str, progress: bool = True) -> dict[str, Any]:
    """Fetch (or, for Taobao, locate and hash) the raw files; ``raw_dir/source.json`` marks completion."""
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    if cfg.kind == "criteo-kaggle":
        return fetch_criteo_kaggle(raw_dir, url=cfg.url or CRITEO_KAGGLE_URL, sha256=cfg.sha256, progress=progress)
    if cfg.kind == "criteo-terabyte":
        return fetch_criteo_terabyte(raw_dir, days=list(cfg.days), base_url=cfg.url or CRITEO_TERABYTE_BASE_URL,
                                     progress=progress)
    record = describe_local(locate_taobao(cfg.path, name=name))
    atomic_write_json(raw_dir / SOURCE_FILE, record)
    return record


def preprocess(cfg: SourceConfig, raw_dir: Path, out: Path, *, name: str, progress: bool = True) -> dict[str, Any]:
    """Preprocess the fetched files of ``raw_dir`` into the dataset directory ``out``."""
    raw_dir = Path(raw_dir)
    try:
        source = json.loads((raw_dir / SOURCE_FILE).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{raw_dir / SOURCE_FILE} is missing: run `hotcold download` first") from None
    files = source["files"]
    provenance = {f["name"]: {k: v for k, v in f.items() if k != "name"} for f in files}
    if cfg.kind == "taobao":
        csv = Path(url2pathname(urlparse(source["url"]).path))
        return preprocess_taobao(csv, out, cfg.preprocess_config(),
                                 name=name, provenance=provenance, progress=progress)
    if cfg.kind == "criteo-kaggle":
        inputs = [raw_dir / "train.txt"]
    else:
        inputs = [raw_dir / f["name"] for f in sorted(files, key=lambda f: f["day"]) if f["day"] in cfg.days]
    return preprocess_criteo(inputs, out, cfg.preprocess_config(), name=name, provenance=provenance,
                             progress=progress, full=cfg.full)
