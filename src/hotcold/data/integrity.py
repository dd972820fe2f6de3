"""Dataset integrity: what ``Dataset.open`` checks before anything reads a batch.

A damaged or edited dataset must fail at open with one line naming the
dataset, the file and what is wrong, never train silently. Three levels:

- the manifest (``check_manifest``): valid JSON, its keys and types, positive
  cardinalities, split ranges inside the sample count and pairwise disjoint;
- the files against the manifest (``open_column``, ``check_shapes``): each
  ``.npy`` as long as its header says (a truncated file is named), its
  shape and dtype those the manifest records, and the shapes consistent
  with the manifest's sample count, dense width and cardinalities;
- the contents (``check_contents``, always on, in bounded memory): every id
  of ``sparse`` and ``history`` in ``[0, cardinality)`` of its table (no
  padding is stored: ``Dataset.batch_ids`` pads histories when it builds a
  batch, so -1 is refused in every file), labels in {0, 1}, dense features
  finite, history offsets non-decreasing with lengths up to ``max_length``.
  A compiled pass over each chunk (``column_bounds``) keeps this a fraction
  of a second per GB of ids (``docs/measurements.md``); a small dataset's
  ids are checked by numpy, in a process that may need no other kernel
  (numba's start in a process costs about 1 s).

``verify_sha256`` re-hashes the column files against the manifest's sha256
when a run first uses a dataset; a file already verified is not hashed again
while its size, mtime and ctime are unchanged (``.hotcold-verified.json``
beside the columns, written atomically; a read-only dataset is simply
re-hashed each time).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from hotcold.data.columns import COLUMNS, DTYPES, SEQUENCE_COLUMNS, SPLITS, DatasetError, release_pages, sparse_tables
from hotcold.files import atomic_write_json
from hotcold.jit import KERNEL, jit

#: the verification cache's file name, beside the column files
CACHE = ".hotcold-verified.json"
CACHE_VERSION = 1
#: rows per chunk of the content checks (bounded memory at any dataset size)
CHUNK_ROWS = 1 << 18
#: ids of a dataset smaller than this are checked by numpy (milliseconds) rather than the compiled pass
NUMPY_IDS = 1 << 20


class Where:
    """Names a dataset in messages: ``dataset <name> (<dir>): <file>: <what>``."""

    def __init__(self, path: Path, name: str | None = None) -> None:
        self.path, self.name = Path(path), name or Path(path).name

    def error(self, file: str, what: str) -> DatasetError:
        return DatasetError(f"dataset {self.name} ({self.path}): {file}: {what}")


# ---------------------------------------------------------------- the manifest


def read_manifest(path: Path) -> tuple[dict[str, Any], bytes]:
    """The parsed ``manifest.json`` of the dataset directory ``path`` and its bytes."""
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise DatasetError(f"{path} is not a dataset directory (no manifest.json)")
    raw = mpath.read_bytes()
    where = Where(path)
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise where.error("manifest.json", f"invalid JSON ({e}); regenerate or re-preprocess the dataset") from None
    if not isinstance(manifest, dict):
        raise where.error("manifest.json", f"must hold a JSON object, got {type(manifest).__name__}")
    return manifest, raw


def _int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_manifest(where: Where, m: Mapping[str, Any]) -> None:
    """Keys, types and ranges of a manifest (``format_version`` already checked)."""
    def bad(what: str) -> DatasetError:
        return where.error("manifest.json", what)

    for key in ("rows", "num_dense", "cardinalities", "splits", "columns", "sha256"):
        if key not in m:
            raise bad(f"no {key!r}")
    rows = m["rows"]
    if not _int(rows) or rows < 0:
        raise bad(f"rows must be a non-negative integer, got {rows!r}")
    if not _int(m["num_dense"]) or m["num_dense"] < 0:
        raise bad(f"num_dense must be a non-negative integer, got {m['num_dense']!r}")
    cards = m["cardinalities"]
    if not isinstance(cards, list) or not cards or not all(_int(c) and c > 0 for c in cards):
        raise bad(f"cardinalities must be a non-empty list of positive integers, got {cards!r}")
    if max(cards) > np.iinfo(np.int32).max:
        raise bad(f"a cardinality of {max(cards)} does not fit the int32 ids")
    check_splits(where, m["splits"], rows)
    bags = m.get("bags")
    if bags is not None:
        if not isinstance(bags, list) or len(bags) != len(cards) or not all(_int(k) and k >= 1 for k in bags):
            raise bad(f"bags must list, for each of the {len(cards)} tables, its ids a sample (>= 1), got {bags!r}")
        if "sequence" in m:
            raise bad("bags (multi-hot features) and sequence (histories) cannot both be given")
    seq = m.get("sequence")
    if seq is not None:
        if not isinstance(seq, dict) or not isinstance(seq.get("tables"), list) or not _int(seq.get("max_length")):
            raise bad(f"sequence must be {{'tables': [...], 'max_length': L}}, got {seq!r}")
        if not seq["tables"] or not all(_int(t) and 0 <= t < len(cards) for t in seq["tables"]):
            raise bad(f"sequence tables {seq['tables']} must be tables 0..{len(cards) - 1}")
        if seq["max_length"] < 0:
            raise bad(f"sequence max_length must be >= 0, got {seq['max_length']}")
    cols, digests = m["columns"], m["sha256"]
    if not isinstance(cols, dict) or not isinstance(digests, dict):
        raise bad("columns and sha256 must be JSON objects")
    for name in COLUMNS + (SEQUENCE_COLUMNS if seq is not None else ()):
        col = cols.get(name)
        if not isinstance(col, dict) or not {"file", "dtype", "shape"} <= set(col):
            raise bad(f"column {name!r} must be listed with its file, dtype and shape")
        if not isinstance(col["file"], str) or Path(col["file"]).name != col["file"]:
            raise bad(f"column {name!r}: file {col['file']!r} must be a file name inside the dataset")
        if not isinstance(digests.get(col["file"]), str):
            raise bad(f"no sha256 recorded for {col['file']}")


def check_splits(where: Where | None, splits: Any, n: int) -> None:
    """Known split names, train and test present, each non-empty inside ``[0, n)``, no two overlapping.

    ``where`` None: the splits a writer is given (the message names no file).
    """
    def bad(what: str) -> DatasetError:
        return where.error("manifest.json", what) if where is not None else DatasetError(what)

    if not isinstance(splits, dict):
        raise bad(f"splits must be a JSON object, got {splits!r}")
    if "train" not in splits or "test" not in splits:
        raise bad(f"splits need at least 'train' and 'test', got {sorted(splits)}")
    ranges = []
    for name, rng in splits.items():
        if name not in SPLITS:
            raise bad(f"unknown split {name!r}; expected one of {SPLITS}")
        if not isinstance(rng, (list, tuple)) or len(rng) != 2 or not all(_int(v) for v in rng):
            raise bad(f"split {name!r} must be [start, stop] integers, got {rng!r}")
        a, b = (int(v) for v in rng)
        if not 0 <= a <= b <= n:
            raise bad(f"split {name!r} = [{a}, {b}) is outside [0, {n})")
        if a == b:
            raise bad(f"split {name!r} is empty (rows [{a}, {b})): training and evaluation need "
                      f"samples in every split; make the dataset larger or its holdout share bigger")
        ranges.append((a, b, name))
    ranges.sort()
    for (a1, b1, s1), (a2, b2, s2) in zip(ranges, ranges[1:]):
        if a2 < b1:
            raise bad(f"splits {s1!r} = [{a1}, {b1}) and {s2!r} = [{a2}, {b2}) overlap: a sample would be "
                      f"both trained and evaluated on")


# ---------------------------------------------------------------- the files against the manifest


def open_column(where: Where, path: Path, col: Mapping[str, Any]) -> np.ndarray:
    """The column file ``col["file"]`` memory-mapped read-only, checked against its header and the manifest."""
    file = col["file"]
    fpath = path / file
    if not fpath.is_file():
        raise where.error(file, "column file is missing")
    try:
        with open(fpath, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f, max_header_size=1 << 16)
            offset = f.tell()
    except (ValueError, EOFError, OSError, SyntaxError) as e:
        raise where.error(file, f"not a readable .npy file ({' '.join(str(e).split())})") from None
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = fpath.stat().st_size
    if size < expected:
        raise where.error(file, f"truncated: {size} bytes, the header's {dtype} {list(shape)} needs {expected}")
    if size > expected:
        raise where.error(file, f"{size - expected} bytes after the {dtype} {list(shape)} data (damaged?)")
    if fortran:
        raise where.error(file, "Fortran-ordered; the format stores C-ordered columns")
    if list(shape) != list(col["shape"]) or str(dtype) != col["dtype"]:
        raise where.error(file, f"shape/dtype {list(shape)}/{dtype} differ from the manifest's "
                                f"{col['shape']}/{col['dtype']}")
    try:
        return np.load(fpath, mmap_mode="r")
    except (ValueError, OSError) as e:
        raise where.error(file, " ".join(str(e).split())) from None


def check_shapes(where: Where, m: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Dtypes and shapes consistent with the manifest's rows, num_dense, cardinalities and sequence."""
    n, cards, files = m["rows"], m["cardinalities"], {k: m["columns"][k]["file"] for k in arrays}
    for name, arr in arrays.items():
        if arr.dtype != DTYPES[name]:
            raise where.error(files[name], f"column {name} must be {np.dtype(DTYPES[name])}, got {arr.dtype}")
    width = len(sparse_tables(len(cards), m.get("bags")))
    want = {"dense": (n, m["num_dense"]), "sparse": (n, width), "labels": (n,)}
    if "sequence" in m:
        want["history_offsets"] = (n + 1,)
    for name, shape in want.items():
        if arrays[name].shape != shape:
            raise where.error(files[name], f"shape {list(arrays[name].shape)} does not match the manifest "
                                           f"(rows {n}, num_dense {m['num_dense']}, {len(cards)} cardinalities"
                                           f"{', bags ' + str(m['bags']) if 'bags' in m else ''}): "
                                           f"expected {list(shape)}")
    if "sequence" in m:
        hist, tables = arrays["history"], m["sequence"]["tables"]
        if hist.ndim != 2 or hist.shape[1] != len(tables):
            raise where.error(files["history"], f"shape {list(hist.shape)}: expected [H, {len(tables)}], one "
                                                f"column per sequence table {tables}")


# ---------------------------------------------------------------- the contents


@jit
def column_bounds(block: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    """Fold the per-column minimum and maximum of the 2-D ``block`` into ``lo`` and ``hi`` (int64 [C]), in one pass."""
    cols = block.shape[1]
    low, high = lo.copy(), hi.copy()
    for r in range(block.shape[0]):
        for c in range(cols):
            v = block[r, c]
            low[c] = min(low[c], v)
            high[c] = max(high[c], v)
    for c in range(cols):   # a loop: a slice assignment compiles numba's shape check and its message (3 s)
        lo[c], hi[c] = low[c], high[c]


def _bounds(block: np.ndarray, lo: np.ndarray, hi: np.ndarray, compiled: bool) -> None:
    if compiled and KERNEL == "numba":
        column_bounds(np.ascontiguousarray(block), lo, hi)
    else:  # numpy's reduction over the rows: far faster than the interpreted kernel
        np.minimum(lo, block.min(axis=0), out=lo)
        np.maximum(hi, block.max(axis=0), out=hi)


def chunks(arr: np.ndarray, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, block) of ``rows`` rows at a time over ``arr``, in bounded memory.

    A memory-mapped column is read through its mapping and each chunk's pages
    are dropped from this process once it is checked (``release_pages``), so
    neither the heap nor the resident set grows with the file.
    """
    rows = max(1, rows)
    for a in range(0, len(arr), rows):
        yield a, arr[a:a + rows]
        release_pages(arr)


def first_out_of_range(ids: np.ndarray, card: np.ndarray, chunk: int = CHUNK_ROWS) -> tuple[int, int, int] | None:
    """(row, column, id) of the first id outside ``[0, card[column])`` of the 2-D ``ids``, or None.

    Chunk by chunk in bounded memory, each a compiled min/max pass; only a
    chunk that fails is searched for the offending row.
    """
    card = np.asarray(card, dtype=np.int64)
    compiled = ids.size >= NUMPY_IDS
    for a, block in chunks(ids, chunk):
        lo = np.full(block.shape[1], np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(block.shape[1], np.iinfo(np.int64).min, dtype=np.int64)
        if len(block):
            _bounds(block, lo, hi, compiled)
        if (lo < 0).any() or (hi >= card).any():
            bad = (block < 0) | (block >= card)
            r, c = np.argwhere(bad)[0]
            return a + int(r), int(c), int(block[r, c])
    return None


def _id_message(kind: str, row: int, col: int, value: int, table: int, card: int) -> str:
    what = (f"id -1 (padding) at row {row}, column {col} (table {table}): padding is never stored, "
            f"only batches pad histories" if value == -1 else
            f"id {value} at row {row}, column {col} is outside [0, {card}) of table {table}")
    return f"{kind} {what}; the file or its manifest is damaged"


def check_contents(where: Where, m: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                   chunk: int = CHUNK_ROWS) -> None:
    """Ids within their tables' cardinalities, labels in {0, 1}, finite dense features, sane history offsets."""
    files = {k: m["columns"][k]["file"] for k in arrays}
    cards = np.asarray(m["cardinalities"], dtype=np.int64)
    tables = sparse_tables(len(cards), m.get("bags"))
    found = first_out_of_range(arrays["sparse"], cards[tables], chunk)
    if found:
        r, c, v = found
        raise where.error(files["sparse"], _id_message("sparse", r, c, v, tables[c], int(cards[tables[c]])))
    labels = arrays["labels"]
    for a, block in chunks(labels, chunk):
        bad = np.flatnonzero((block != 0) & (block != 1))
        if len(bad):
            r = int(bad[0])
            raise where.error(files["labels"], f"label {float(block[r])} at row {a + r}: labels must be 0 or 1")
    dense = arrays["dense"]
    for a, block in chunks(dense, chunk):
        if not np.isfinite(block).all():
            r, c = np.argwhere(~np.isfinite(block))[0]
            raise where.error(files["dense"], f"non-finite dense feature {float(block[r, c])} at row {a + r}, "
                                              f"column {c}")
    if "sequence" in m:
        _check_history(where, m, arrays, files, cards, chunk)


def _check_history(where: Where, m: Mapping[str, Any], arrays: Mapping[str, np.ndarray], files: dict[str, str],
                   cards: np.ndarray, chunk: int) -> None:
    hist, offsets = arrays["history"], arrays["history_offsets"]
    tables, max_length = m["sequence"]["tables"], m["sequence"]["max_length"]
    if offsets[0] != 0 or offsets[-1] != len(hist):
        raise where.error(files["history_offsets"], f"must run from 0 to the {len(hist)} history rows, "
                                                    f"got {int(offsets[0])} to {int(offsets[-1])}")
    for a in range(0, len(offsets) - 1, chunk):
        lengths = np.diff(offsets[a:a + chunk + 1])
        bad = np.flatnonzero((lengths < 0) | (lengths > max_length))
        if len(bad):
            r = int(bad[0])
            raise where.error(files["history_offsets"], f"sample {a + r} has {int(lengths[r])} history events, "
                                                        f"outside [0, max_length={max_length}]")
    release_pages(offsets)
    found = first_out_of_range(hist, cards[tables], chunk)
    if found:
        r, c, v = found
        raise where.error(files["history"], _id_message("history", r, c, v, tables[c], int(cards[tables[c]])))


# ---------------------------------------------------------------- the recorded sha256


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        cache = json.loads((path / CACHE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cache, dict) or cache.get("version") != CACHE_VERSION or not isinstance(cache.get("files"), dict):
        return {}
    return cache["files"]


def verify_sha256(where: Where, path: Path, m: Mapping[str, Any], progress: bool = False) -> dict[str, str]:
    """{file: sha256} of the column files, each checked against the manifest's; a mismatch fails naming the file.

    A file whose size, mtime and ctime match its entry in the cache, and whose
    cached digest is the manifest's, is not read again; the others are hashed
    (with a progress bar over their bytes) and the cache rewritten atomically.
    """
    from tqdm import tqdm

    names = COLUMNS + (SEQUENCE_COLUMNS if "sequence" in m else ())
    files = [m["columns"][n]["file"] for n in names]
    recorded = m["sha256"]
    cache = _read_cache(path)
    stats = {f: _stat_key(path / f) for f in files}
    todo = [f for f in files if cache.get(f) != {**stats[f], "sha256": recorded[f]}]
    verified = {f: recorded[f] for f in files if f not in todo}
    with tqdm(total=sum(stats[f]["size"] for f in todo), unit="B", unit_scale=True,
              desc=f"verify {where.name}", disable=not progress or not todo) as bar:
        for f in todo:
            digest = _sha256(path / f, bar)
            if digest != recorded[f]:
                raise where.error(f, f"sha256 {digest[:16]}... differs from the manifest's {recorded[f][:16]}...: "
                                     f"the file changed after the dataset was written (damaged or edited)")
            if _stat_key(path / f) != stats[f]:
                raise where.error(f, "changed while it was being verified")
            verified[f] = digest
    if todo:
        entries = {f: {**stats[f], "sha256": verified[f]} for f in files}
        try:
            atomic_write_json(path / CACHE, {"version": CACHE_VERSION, "files": entries})
        except OSError:
            pass  # a read-only dataset: verified again next time
    return {f: verified[f] for f in files}


def _sha256(path: Path, bar: Any, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()
