"""The real datasets: where they come from, how to fetch them, and their provenance records.

Each fetch writes ``out_dir/source.json``: ``{"dataset", "url", "sha256", "bytes", "files": [...]}``
with one ``{"name", "bytes", "sha256", ...}`` entry per file the converters read.
"""
from __future__ import annotations

import hashlib
import json
import logging
import lzma
import os
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from tqdm import tqdm

from hotcold.files import atomic_write_json, fsync_dir, fsync_file
from hotcold.data.sources.download import DownloadError, download, file_sha256

__all__ = [
    "CRITEO_KAGGLE_URL", "CRITEO_KAGGLE_TRAIN_LINES", "CRITEO_TERABYTE_BASE_URL",
    "CRITEO_TERABYTE_URL_TEMPLATE", "CRITEO_TERABYTE_DAYS", "TAOBAO_URL", "TAOBAO_FILE",
    "describe_local", "fetch_criteo_kaggle", "fetch_criteo_terabyte", "locate_taobao",
]

log = logging.getLogger(__name__)

# Criteo's own link to the Display Advertising Challenge archive (train.txt, test.txt, readme.txt).
CRITEO_KAGGLE_URL = (
    "https://go.criteo.net/criteo-research-kaggle-display-advertising-challenge-dataset.tar.gz"
)
CRITEO_KAGGLE_TRAIN_LINES = 45_840_617
# The 1TB Click Logs host used by the DLRM/TorchRec download scripts. The older
# azuremlsampleexperiments.blob.core.windows.net/criteo mirror is gone; Criteo also publishes the
# days on https://huggingface.co/datasets/criteo/CriteoClickLogs (resolve/main/day_{day}.gz).
CRITEO_TERABYTE_BASE_URL = "https://storage.googleapis.com/criteo-cail-datasets"
CRITEO_TERABYTE_URL_TEMPLATE = "{base_url}/day_{day}.gz"
CRITEO_TERABYTE_DAYS = range(24)
# Taobao user behaviour needs a Tianchi login, so it is never downloaded here.
TAOBAO_URL = "https://tianchi.aliyun.com/dataset/649"
TAOBAO_FILE = "UserBehavior.csv"
SOURCE_FILE = "source.json"


def _read_source(out_dir: Path) -> dict:
    try:
        return json.loads((out_dir / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _extract_member(archive: Path, name: str, dest: Path, *, progress: bool = True,
                    chunk: int = 1 << 20) -> dict:
    """Stream the member whose base name is ``name`` into ``dest`` (via ``.part``); returns its record."""
    part = dest.with_name(dest.name + ".part")
    try:
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                if member.isfile() and Path(member.name).name == name:
                    record = _copy_member(tar, member, part, progress=progress, chunk=chunk)
                    fsync_file(part)
                    os.replace(part, dest)
                    fsync_dir(dest.parent)
                    return record
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{archive}: corrupt archive ({type(e).__name__}: {e}); delete it and run "
                            f"`hotcold download` again") from e
    raise DownloadError(f"{archive} has no {name}")


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, part: Path, *, progress: bool,
                 chunk: int) -> dict:
    src = tar.extractfile(member)
    h, size, lines = hashlib.sha256(), 0, 0
    with src, open(part, "wb") as out, tqdm(total=member.size, unit="B", unit_scale=True, unit_divisor=1024,
                                            desc=f"extract {member.name}", disable=not progress,
                                            leave=False) as bar:
        while data := src.read(chunk):
            out.write(data)
            h.update(data)
            bar.update(len(data))
            size += len(data)
            lines += data.count(b"\n")
    return {"name": Path(member.name).name, "bytes": size, "sha256": h.hexdigest(), "lines": lines}


def fetch_criteo_kaggle(out_dir: Path, *, url: str = CRITEO_KAGGLE_URL, sha256: str | None = None,
                        progress: bool = True) -> dict:
    """Download the Criteo Kaggle archive into ``out_dir`` and extract ``train.txt``.

    Extraction is skipped when ``train.txt`` is present and ``source.json`` records the same
    archive sha256 and train.txt size. Returns the provenance dict also written to ``source.json``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / (Path(urlparse(url).path).name or "criteo-kaggle.tar.gz")
    digest = download(url, archive, sha256=sha256, fmt="tar", progress=progress)
    train = out_dir / "train.txt"
    prior = _read_source(out_dir)
    files = prior.get("files") or [{}]
    if (train.exists() and prior.get("sha256") == digest
            and files[0].get("name") == train.name and files[0].get("bytes") == train.stat().st_size):
        return prior
    record = _extract_member(archive, train.name, train, progress=progress)
    if url == CRITEO_KAGGLE_URL and record["lines"] != CRITEO_KAGGLE_TRAIN_LINES:
        log.warning("train.txt has %d lines, expected %d", record["lines"], CRITEO_KAGGLE_TRAIN_LINES)
    provenance = {"dataset": "criteo_kaggle", "url": url, "archive": archive.name, "sha256": digest,
                  "bytes": archive.stat().st_size, "files": [record]}
    atomic_write_json(out_dir / SOURCE_FILE, provenance)
    return provenance


def _check_days(days: Sequence[int]) -> list[int]:
    bad = [d for d in days if isinstance(d, bool) or not isinstance(d, int) or d not in CRITEO_TERABYTE_DAYS]
    if bad or not days:
        raise ValueError(f"Criteo Terabyte days must be a non-empty list of integers in 0..23 "
                         f"(day_0.gz ... day_23.gz); got invalid {bad or list(days)}")
    return sorted(set(days))


def fetch_criteo_terabyte(out_dir: Path, *, days: Sequence[int],
                          base_url: str = CRITEO_TERABYTE_BASE_URL,
                          sha256: Mapping[int, str] | None = None, progress: bool = True) -> dict:
    """Download ``day_{d}.gz`` for each of ``days`` into ``out_dir`` (kept compressed).

    ``sha256`` maps a day to the expected sha256 of its file. ``source.json``
    lists every day fetched so far into ``out_dir``; the returned dict lists ``days``.
    A day that fails (its checksum, an error page, HTTP errors after the retries)
    does not stop the others: every day is fetched, the good ones are recorded, and
    then one :class:`DownloadError` lists each failed day with its reason.
    """
    days = _check_days(days)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base_url = base_url.rstrip("/")
    records, failed = [], []
    for day in days:
        url = CRITEO_TERABYTE_URL_TEMPLATE.format(base_url=base_url, day=day)
        dest = out_dir / f"day_{day}.gz"
        try:
            digest = download(url, dest, sha256=(sha256 or {}).get(day), fmt="gzip", progress=progress)
        except DownloadError as e:
            log.error("day %d failed (%s); fetching the other days", day, e)
            failed.append((dest.name, str(e)))
            continue
        records.append({"name": dest.name, "day": day, "url": url, "bytes": dest.stat().st_size,
                        "sha256": digest})
    fetched = {r["name"] for r in records}
    kept = [r for r in _read_source(out_dir).get("files", [])
            if r.get("name") not in fetched and (out_dir / r.get("name", "")).is_file()]
    all_files = sorted(kept + records, key=lambda r: r.get("day", -1))
    atomic_write_json(out_dir / SOURCE_FILE, _terabyte_provenance(base_url, all_files))
    if failed:
        detail = "; ".join(f"{name}: {why}" for name, why in failed)
        raise DownloadError(f"criteo-terabyte: {len(failed)} of {len(days)} day files failed "
                            f"({', '.join(name for name, _ in failed)}); the others are in {out_dir}. {detail}")
    return _terabyte_provenance(base_url, records)


def _terabyte_provenance(base_url: str, files: list[dict]) -> dict:
    return {"dataset": "criteo_terabyte", "url": base_url, "sha256": None,
            "bytes": sum(r["bytes"] for r in files), "files": files}


def locate_taobao(source: str | os.PathLike | None, *, name: str = "taobao") -> Path:
    """Path of the local ``UserBehavior.csv`` (``source`` may be the file or its directory)."""
    how = (f"Taobao's {TAOBAO_FILE} cannot be downloaded automatically (Alibaba Tianchi requires a "
           f"login): get UserBehavior.csv.zip from the Tianchi user-behaviour dataset page "
           f"{TAOBAO_URL}, unzip it ({TAOBAO_FILE}, ~3.5 GB; columns user_id,item_id,category_id,"
           f"behavior_type,timestamp, no header) and set the config to "
           f"its path (key datasets.{name}.source.path).")
    if source is None or str(source).strip() == "":
        raise FileNotFoundError(f"No path configured for {TAOBAO_FILE}. {how}")
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / TAOBAO_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{TAOBAO_FILE} not found at {path}. {how}")
    return path


def describe_local(path: Path, sha256: str | None = None) -> dict:
    """Provenance of a local source file, in the same shape as the fetch functions' records.

    ``sha256``, when configured, must match: the user's file is never replaced, so a mismatch fails.
    """
    path = Path(path).resolve()
    size, digest = path.stat().st_size, file_sha256(path)
    if sha256 is not None and digest != sha256.lower():
        raise ValueError(f"{path}: sha256 mismatch: expected {sha256.lower()} (source.sha256), got {digest}")
    return {"dataset": None, "url": path.as_uri(), "sha256": digest, "bytes": size,
            "files": [{"name": path.name, "bytes": size, "sha256": digest}]}
