"""Run records on disk: finding them, checking each lies where its keys say, and what a record says of itself.

A one-process run's record lies at ``<dataset>/<method>/<variant>/seed~<n>/record.json``
under a runs directory, a scale-out run's one level deeper, under
``world~<P>-rpn~<G>/`` (``find_records``, ``load_record``). ``scale_of``,
``plan_of``, ``options_label`` and ``degenerate_of`` read a record's scale,
sharding plan, store options and what its technique degenerated to.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from hotcold import methods
from hotcold.record_status import STATUS_OK, record_status

RECORD_GLOB = "*/*/*/seed~*/record.json"
SCALE_OUT_GLOB = "*/*/*/world~*-rpn~*/seed~*/record.json"
SCALE_DIR = re.compile(r"^world~(\d+)-rpn~(\d+)$")
KEYS = ["dataset", "method", "variant", "seed"]        # what a record names itself by
SCALE = ["world", "ranks_per_node"]
RUN_ID = ["dataset", "method", "variant", *SCALE, "seed"]  # what tells runs apart


class NoRecordsError(FileNotFoundError):
    """The runs directory holds no complete run record."""


class RecordError(ValueError):
    """A run record is malformed or disagrees with where it lies."""


def find_records(runs_dir: Path) -> list[Path]:
    """Paths of all complete run records under ``runs_dir`` (one-process and scale-out), sorted."""
    return sorted([*Path(runs_dir).glob(RECORD_GLOB), *Path(runs_dir).glob(SCALE_OUT_GLOB)])


def scale_of(rec: dict[str, Any]) -> tuple[int, int]:
    """(world, ranks_per_node) of a run: its summary's, else its config's; (1, 1) for older records."""
    summary = rec.get("summary") or {}
    dist = (rec.get("config") or {}).get("distributed") or {}
    world = summary.get("world", dist.get("world", 1))
    return int(world or 1), int(summary.get("ranks_per_node", dist.get("ranks_per_node", 1)) or 1)


def plan_of(rec: dict[str, Any]) -> str:
    """The sharding plan of a scale-out run (the store's report, else its options with their defaults)."""
    plan = (rec.get("summary") or {}).get("plan") or (rec.get("store") or {}).get("plan")
    if plan or scale_of(rec)[0] == 1:
        return plan or ""
    method = methods.METHODS.get(rec.get("method"))
    if method is None or not method.spans_ranks:
        return ""
    return method.parse_options((rec.get("config") or {}).get("store")).plan


def _expected_location(path: Path, rec: dict[str, Any]) -> dict[str, str]:
    """The keys ``path`` says a record has; a scale-out run lies one level deeper, under its scale."""
    parents = Path(path).parents
    seed_dir, rest = parents[0], list(parents[1:4])
    expected = {"seed": seed_dir.name.removeprefix("seed~")}
    world, rpn = scale_of(rec)
    if world > 1:
        match = SCALE_DIR.match(parents[1].name)
        scale = (int(match[1]), int(match[2])) if match else None
        if scale != (world, rpn):
            raise RecordError(f"{path}: a run of world {world} with {rpn} rank(s) per node belongs under "
                              f"world~{world}-rpn~{rpn}/, not {parents[1].name}/")
        rest = list(parents[2:5])
    variant_dir, method_dir, dataset_dir = rest
    return {**expected, "dataset": dataset_dir.name, "method": method_dir.name, "variant": variant_dir.name}


def load_record(path: Path) -> dict[str, Any]:
    """Read one record and check that its keys (and scale) match its directory."""
    try:
        rec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: not valid JSON ({e})") from None
    required = (*KEYS, "summary") if record_status(rec) == STATUS_OK else (*KEYS, "reason")
    missing = [k for k in required if k not in rec]
    if missing:
        raise RecordError(f"{path}: record lacks key(s) {missing}")
    for key, value in _expected_location(path, rec).items():
        if str(rec[key]) != value:
            raise RecordError(f"{path}: record says {key}={rec[key]!r} but lies under {value!r}")
    return rec


def load_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The records at ``paths``; raises if there are none."""
    if not paths:
        raise NoRecordsError(f"no run records given (expected {RECORD_GLOB} under a runs directory); "
                             "run the train step first")
    return [load_record(p) for p in paths]


def ok_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of runs that trained (status ``ok``, or no status: older records)."""
    return [r for r in records if record_status(r) == STATUS_OK]


def options_label(options: dict[str, Any] | None) -> str:
    """Store options as ``key=value, ...`` (sorted keys); empty for none."""
    return ", ".join(f"{k}={v}" for k, v in sorted((options or {}).items()))


def degenerate_of(rec: dict[str, Any]) -> str | None:
    """What a run degenerated to, from its store report: FAE with every timed batch hot (``all-hot``: the
    ``device`` store's run) or none (``all-cold``: the ``hybrid`` store's); None for an ordinary run."""
    return (rec.get("store") or {}).get("degenerate") or None
