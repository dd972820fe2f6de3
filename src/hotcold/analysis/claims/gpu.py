"""The claims on a GPU: each claim's comparison on GPU-timed records, and modelled on a GPU's calibrated profile.

The claims table's ``measured_value`` is this reproduction's (on a CPU-only
machine a CPU's). Where GPU records are at hand (the committed evidence of a
GPU run, a ``hotcold gpu-check`` output, or the workflow's own runs when they
trained on a GPU), ``gpu_columns`` adds the same comparison on them: the
value, the card by name, whether those runs were stable, where the records
came from, and the claim modelled on the GPU's calibrated profile from the
same records. The comparisons are ``claims_measured``' own, on another set of runs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from hotcold.analysis.claims.catalog import Claim
from hotcold.analysis.claims.measured import Predict, _hits_claim, _row, _speed_claim

GPU_COLUMNS = ["gpu_measured_value", "gpu_measured_hardware", "gpu_measured_stable", "gpu_records",
               "gpu_modelled_value", "gpu_modelled_profile"]


def cuda_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records timed with CUDA events."""
    return [r for r in records if (r.get("summary") or {}).get("timer") == "cuda"]


def gpu_columns(row: dict[str, Any], claim: Claim, records: Sequence[dict[str, Any]], source: str,
                profile: Any, predict: Predict) -> None:
    """Fill ``row``'s ``GPU_COLUMNS`` for ``claim`` from the CUDA-timed ``records`` (``source`` says whence) and
    ``profile`` (a loaded hardware profile, or None); empty where the claim has no such runs."""
    row.update({c: math.nan if c.endswith("_value") else None for c in GPU_COLUMNS})
    gpu = cuda_records(records)
    if not gpu or claim.kind not in ("speed", "hits"):
        return
    scratch = _row(claim)
    if claim.kind == "hits":
        _hits_claim(scratch, claim, gpu)
    else:
        modelled_on = dataclasses.replace(claim, profile=profile.name if profile is not None else "")
        profiles = {profile.name: profile} if profile is not None else {}
        _speed_claim(scratch, modelled_on, gpu, profiles, predict)
    if scratch["status"] != "ok":
        row["gpu_records"] = f"{source}: {scratch['status']}"
        return
    row.update(gpu_measured_value=scratch["measured_value"], gpu_measured_hardware=scratch["measured_hardware"],
               gpu_measured_stable=scratch["measured_stable"], gpu_records=f"{source}: {scratch['compared']}")
    if claim.kind == "speed" and profile is not None:
        row.update(gpu_modelled_value=scratch["modelled_value"], gpu_modelled_profile=profile.name)
