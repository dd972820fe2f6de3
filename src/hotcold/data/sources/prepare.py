"""Real datasets from their sources: what to fetch, then how to preprocess it.

A dataset's ``source`` section in the workflow config is a ``SourceConfig``.
``fetch`` puts the raw files into a directory whose ``source.json`` records
where they came from (URL, size, sha256); ``preprocess`` turns them into the
on-disk dataset format with that provenance in the manifest.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from hotcold.files import atomic_write_json
from hotcold.data.sources.criteo import preprocess_criteo
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
from hotcold.data.sources.mlperf import describe_mlperf, read_mlperf
from hotcold.data.sources.source_config import SourceConfig

def fetch(cfg: SourceConfig, raw_dir: Path, *, name: str, progress: bool = True) -> dict[str, Any]:
    """Fetch (or, for Taobao, locate and hash) the raw files; ``raw_dir/source.json`` marks completion."""
    raw_dir = Path(raw_dir)
    raw_dir.mkdir(parents=True, exist_ok=True)
    if cfg.kind == "criteo-kaggle":
        return fetch_criteo_kaggle(raw_dir, url=cfg.url or CRITEO_KAGGLE_URL, sha256=cfg.sha256, progress=progress)
    if cfg.kind == "criteo-terabyte":
        return fetch_criteo_terabyte(raw_dir, days=list(cfg.days), base_url=cfg.url or CRITEO_TERABYTE_BASE_URL,
                                     sha256=cfg.sha256, progress=progress)
    if cfg.kind == "mlperf-multihot":
        record = describe_mlperf(Path(cfg.path), list(cfg.days))
    else:
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
    if cfg.kind == "mlperf-multihot":
        from hotcold.data.generators.config import MLPERF_CARDINALITIES

        return read_mlperf(Path(url2pathname(urlparse(source["url"]).path)), out, list(cfg.days),
                           MLPERF_CARDINALITIES, name=name, progress=progress)
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
