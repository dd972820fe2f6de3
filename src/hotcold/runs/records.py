"""Run records: assembly, provenance, parameter fingerprints and atomic writes.

A run directory holds ``steps.parquet`` (per-step phases and counters of
every repeat, long format) and ``record.json``. ``record.json`` is written last and by rename,
so its presence means the run is complete. A variant that cannot run still
ends its job with a complete run directory whose ``status`` says why
(``record_status.record_status``), and the tables list it instead of the workflow stopping.
"""
from __future__ import annotations

import hashlib
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Protocol

import numpy as np
import pandas as pd
import torch

import hotcold
from hotcold import methods
from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.distributed.launch import launcher_alive
from hotcold.files import atomic_write, atomic_write_json, tree_sha256
from hotcold.jit import KERNEL, jit
from hotcold.machine import cpu_name, machine_id, nvidia_smi
from hotcold.record_status import STATUS_DIVERGED, STATUS_INFEASIBLE, STATUS_OK, STATUS_SKIPPED

#: ``repeat``: which repeat of the timed part a row comes from (0-based; files written before repeats lack it)
STEPS_COLUMNS = {"step": "int64", "kind": "string", "name": "string", "value": "float64", "repeat": "int64"}
SKETCH_SIZE = 256
_P = 2_147_483_647  # Mersenne prime 2^31 - 1 for the sketch's hash functions


def atomic_write_parquet(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda f: frame.to_parquet(f, index=False))


def param_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """sha256 of the exact bytes, an L2-preserving count sketch, and the norm.

    The checksum tells bit-identical runs apart; the sketch lets two runs be
    compared within a tolerance without storing the parameters:
    ``||sketch_a - sketch_b||`` estimates ``||a - b||`` (count sketch, AMS).
    Element i goes to bucket ``h(i)`` with sign ``s(i)``, both from fixed
    hash functions of its position in the concatenation of all tensors
    (``_sketch_kernel`` in one compiled pass, or ``_sketch_torch``: the same
    sums in the same order).
    """
    digest = hashlib.sha256()
    sketch = np.zeros(SKETCH_SIZE, dtype=np.float64)
    sq = 0.0
    offset = 0
    add = _sketch_kernel if KERNEL == "numba" else _sketch_torch
    for name, t in named:
        flat = _flat(t)
        _digest(digest, name, flat)
        sq += add(flat.numpy(), offset, sketch)
        offset += flat.numel()
    return {"checksum": digest.hexdigest(), "sketch": sketch.tolist(), "norm": sq ** 0.5}


@jit
def _sketch_kernel(x: np.ndarray, offset: int, sketch: np.ndarray) -> float:
    """Add float32 ``x``, at positions ``offset``.., into the count ``sketch`` (float64); the sum of its squares."""
    sq = 0.0
    for k in range(x.size):
        i = offset + k
        v = np.float64(x[k])
        sign = (((i * 214_013 + 2_531_011) % _P) & 1) * 2 - 1
        sketch[((i * 1_103_515_245 + 12_345) % _P) % SKETCH_SIZE] += v * sign
        sq += v * v
    return sq


def _sketch_torch(x: np.ndarray, offset: int, sketch: np.ndarray) -> float:
    """``_sketch_kernel`` with torch's vector operations, a chunk at a time (without numba)."""
    out, sq, chunk = torch.from_numpy(sketch), 0.0, 1 << 22
    flat = torch.from_numpy(x)
    for a in range(0, flat.numel(), chunk):
        v = flat[a:a + chunk].double()
        i = torch.arange(offset + a, offset + a + v.numel(), dtype=torch.int64)
        bucket = ((i * 1_103_515_245 + 12_345) % _P) % SKETCH_SIZE
        sign = (((i * 214_013 + 2_531_011) % _P) & 1) * 2 - 1
        out.index_add_(0, bucket, v * sign)
        sq += float(v.pow(2).sum())
    return sq


def param_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """``param_fingerprint``'s checksum alone (no sketch): cheap enough to compare every repeat of a run."""
    digest = hashlib.sha256()
    for name, t in named:
        _digest(digest, name, _flat(t))
    return digest.hexdigest()


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32).contiguous().reshape(-1)


def _digest(digest: Any, name: str, flat: torch.Tensor) -> None:
    digest.update(name.encode())
    digest.update(flat.numpy().view(np.uint8))  # the tensor's own bytes, not a copy of them


@lru_cache(maxsize=1)
def source_sha256() -> str:
    """sha256 of the package's source (``files.tree_sha256``): which code a run came from."""
    return tree_sha256(Path(hotcold.__file__).resolve().parent)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _nvidia_driver() -> str | None:
    rows = nvidia_smi("--query-gpu=driver_version")
    return rows[0][0] if rows and rows[0] and rows[0][0] else None


def provenance(device: torch.device, timer: str) -> dict[str, Any]:
    """Where a number came from: code, hardware, library versions, threads."""
    cuda = device.type == "cuda"
    seen = cuda and torch.cuda.is_available()  # an infeasible record may be written where its GPU is not
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": torch.cuda.get_device_name(device) if seen else "cuda (no GPU where this was written)" if cuda
        else "cpu",
        "device_type": device.type,
        "cpu": cpu_name(),
        "machine": machine_id(),
        "driver": _nvidia_driver() if seen else None,
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "git_commit": _git("rev-parse", "HEAD") or "unknown",
        "git_dirty": bool(status) if status is not None else None,
        "source_sha256": source_sha256(),
        "hotcold_version": hotcold.__version__,
        "timer": timer,
    }


def steps_frame(phases: list[tuple[int, dict[str, float]]],
                counters: list[tuple[int, dict[str, int]]], repeat: int = 0) -> pd.DataFrame:
    """Long format: step, kind ('phase' | 'counter'), name, value (ms for phases), repeat."""
    rows = [(s, "phase", k, v, repeat) for s, ph in phases for k, v in ph.items()]
    rows += [(s, "counter", k, float(v), repeat) for s, cs in counters for k, v in cs.items()]
    return pd.DataFrame(rows, columns=list(STEPS_COLUMNS)).astype(STEPS_COLUMNS)


def read_steps(path: Path) -> pd.DataFrame:
    """A run's ``steps.parquet``; a file from before repeats gets ``repeat`` 0."""
    frame = pd.read_parquet(path)
    if "repeat" not in frame:
        frame["repeat"] = 0
    return frame.astype({k: v for k, v in STEPS_COLUMNS.items() if k in frame})


def timer_kind(device: torch.device) -> str:
    """The timer a run on ``device`` uses: CUDA events on a GPU, the CPU clock otherwise."""
    return "cuda" if device.type == "cuda" else "cpu"


def _run_header(cfg: RunConfig, ds: Dataset, device: torch.device, timer: str, status: str) -> dict[str, Any]:
    """What every record holds: the run's keys, status, config, dataset hash and provenance."""
    return {
        "dataset": cfg.dataset,
        "method": cfg.method,
        "variant": cfg.variant,
        "seed": cfg.seed,
        "status": status,
        "config": cfg.to_dict(),
        "dataset_manifest_sha256": ds.manifest_sha256,
        "dataset_column_sha256": ds.verified_sha256(),  # each column file's, checked against the manifest
        "provenance": provenance(device, timer),
    }


class Replay(Protocol):
    """The ``device`` store replayed on a run's own batch order (``train.RunResult``): its metrics and
    parameters."""

    metrics: dict[str, Any]

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]: ...


def trained_record(cfg: RunConfig, ds: Dataset, device: torch.device, summary: dict[str, Any],
                   metrics: dict[str, Any], params: dict[str, Any], store_report: dict[str, Any],
                   ref: Replay | None = None, lockstep: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of a trained run: its (repeats') summary, metrics, parameter fingerprint and store report;
    ``ref``: the ``device`` store replayed on the run's own batch order; ``lockstep``: a peer's lock-step check
    against the ``device`` store (``hotcold.runs.lockstep.Lockstep.to_record``)."""
    record = {
        **_run_header(cfg, ds, device, summary["timer"], STATUS_OK),
        "summary": summary,
        "metrics": metrics,
        "params": params,
        "store": store_report,
        # which check the invariant is held to: "bits" (the device store's bits: the harness's own stores, whose
        # sums and updates add in one order on every device) or "lockstep" (a peer's library kernels round
        # their own way: compared step by step with the device store fed the same inputs, ``hotcold.runs.lockstep``)
        "check": methods.get(cfg.method).check,
    }
    if lockstep is not None:
        record["lockstep"] = lockstep
    if ref is not None:  # the invariant of a store with its own batch order is against this replay
        # over P ranks, the replay forms each step's gradient from the same P slices (``World.replay``)
        record["reference"] = {"method": "device", "order": "this run's", "slices": cfg.distributed.world,
                               "check": record["check"], "metrics": ref.metrics,
                               "params": param_fingerprint(ref.named_parameters())}
    elif cfg.distributed.world > 1 and cfg.distributed.reference == "none":  # no replay: nothing to compare with
        record["reference"] = {"method": None, "checked": False,
                               "reason": "distributed.reference: none (no one-process replay: exactness not checked)"}
    return record


def infeasible_record(cfg: RunConfig, ds: Dataset, device: torch.device, reason: str) -> dict[str, Any]:
    """The record of a variant that cannot run on this dataset: why, and no numbers."""
    return {**_run_header(cfg, ds, device, timer_kind(device), STATUS_INFEASIBLE), "reason": reason}


def write_infeasible(cfg: RunConfig, dataset_dir: Path, out_dir: Path, device: str, reason: str) -> Path:
    """Write the run directory of a variant known to be infeasible on ``device`` before training (no numbers)."""
    record = infeasible_record(cfg, Dataset.open(dataset_dir, verify=True), torch.device(device), reason)
    return write_run(out_dir, record, steps_frame([], []))


def skipped_record(cfg: RunConfig, ds: Dataset, device: torch.device, reason: str) -> dict[str, Any]:
    """The record of a peer method that cannot run without its optional package: why, and no numbers."""
    return {**_run_header(cfg, ds, device, timer_kind(device), STATUS_SKIPPED), "reason": reason}


def diverged_record(cfg: RunConfig, ds: Dataset, device: torch.device, reason: str, step: int) -> dict[str, Any]:
    """The record of a run whose loss or parameters became non-finite at ``step``: why, and no numbers."""
    return {**_run_header(cfg, ds, device, timer_kind(device), STATUS_DIVERGED), "reason": reason,
            "diverged_step": int(step)}


def write_run(out_dir: Path, record: dict[str, Any], steps: pd.DataFrame) -> Path:
    """Write ``steps.parquet`` then ``record.json`` (the completeness marker).

    A rank whose launcher is gone (``kill -9`` of ``hotcold train --nproc``)
    writes nothing: the launch it belonged to was stopped.
    """
    if not launcher_alive():
        raise ChildProcessError(f"{out_dir}: the launcher of this rank is gone; an orphaned rank writes no record")
    out_dir = Path(out_dir)
    (out_dir / "record.json").unlink(missing_ok=True)
    atomic_write_parquet(out_dir / "steps.parquet", steps)
    atomic_write_json(out_dir / "record.json", record)
    return out_dir / "record.json"
