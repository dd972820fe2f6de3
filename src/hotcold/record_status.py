"""What a finished run's record says, read without torch: its status, and how far two parameter sketches are.

``hotcold.runs.records`` writes records (and needs torch for the parameters); the tables, figures and claims only
read them, and import this module instead, so their jobs start without loading torch.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

STATUS_OK = "ok"
STATUS_INFEASIBLE = "infeasible"
STATUS_SKIPPED = "skipped"
STATUS_DIVERGED = "diverged"
#: statuses of runs without numbers: the record has a ``reason`` instead of a summary
NO_NUMBERS = (STATUS_INFEASIBLE, STATUS_SKIPPED, STATUS_DIVERGED)


def record_status(record: dict[str, Any]) -> str:
    """``ok``, ``infeasible``, ``skipped`` or ``diverged``; a record from before statuses existed is ok.

    A record's ``status`` is ``ok`` (a trained run: summary, metrics, parameter
    fingerprint, store report), ``infeasible`` (the variant cannot run on this
    dataset, e.g. a cache smaller than a batch's unique rows: the ``reason``,
    the config, provenance and dataset hash, no numbers, and an empty
    ``steps.parquet``) or ``skipped`` (a peer method whose optional package is
    not installed here, e.g. ``fbgemm`` without ``pip install -e .[peers]``: the
    same fields as ``infeasible``; installing the package and rerunning trains it)
    or ``diverged`` (the loss or a parameter became non-finite: the same
    fields, with ``diverged_step``, the first step found; no numbers, so no
    table compares it). A record without ``status`` (older) counts as ok.
    """
    return record.get("status", STATUS_OK)


def sketch_rel_diff(a: Iterable[float] | None, b: Iterable[float] | None) -> float:
    """Relative L2 difference of two parameter sketches, ``||a - b|| / ||b||``.

    NaN when a sketch is missing or the two differ in size.
    """
    if a is None or b is None:
        return float("nan")
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_.shape != b_.shape:
        return float("nan")
    return float(np.linalg.norm(a_ - b_) / max(float(np.linalg.norm(b_)), 1e-30))
