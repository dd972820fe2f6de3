"""One table of the papers' headline claims: the paper's number, hotcold's measured and modelled ones.

Every row names the claim, the paper's number and hardware, what hotcold
compares (dataset, runs), the measured value with the hardware, timer and
stability of the runs behind it, and the value the cost model gives for the
same runs under a named hardware profile (always labelled ``modelled``).
A claim whose runs are not in this reproduction keeps its row with a
``status`` saying so; a claim hotcold has no method for says that.
The claims and the columns: docs/costmodel.md, "The claims table". The claims
are ``claims_catalog``'s; a row's columns are filled by ``claims_measured``,
``claims_paper_scale`` and, given GPU records, ``claims_gpu``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from hotcold.analysis.claims.catalog import AGREE_RTOL, CLAIMS, Claim
from hotcold.analysis.claims.measured import (
    CommModel,
    Predict,
    _a2a_claim,
    _hits_claim,
    _latency_claim,
    _row,
    _speed_claim,
    _why,
)
from hotcold.analysis.claims.paper_columns import paper_scale_columns
from hotcold.analysis.markdown import to_markdown
from hotcold.files import atomic_write_text

CLAIM_COLUMNS = [
    "claim_id", "paper", "claim", "unit", "paper_value", "paper_states", "paper_hardware", "dataset", "compared",
    "status", "measured_value", "measured_hardware", "measured_timer", "measured_stable", "modelled_value",
    "modelled_profile", "modelled_dominant", "why_they_differ", "paper_scale_value", "paper_scale_profile",
    "paper_scale_dominant", "paper_scale_workload", "paper_scale_why",
]
SWEEP_COLUMNS = ["claim_id", "knob", "setting", "factor", "value", "paper_value", "agrees"]


def claims_and_sweep(records: list[dict[str, Any]], comm: pd.DataFrame, profiles: dict[str, Any],
                     predict: Predict | None = None, comm_model: CommModel | None = None,
                     claims: Sequence[Claim] = CLAIMS, paper: Any = None,
                     shape_of: Callable[[dict[str, Any]], Any] | None = None,
                     more: Callable[[dict[str, Any], Claim], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per claim (``CLAIM_COLUMNS``) and the knob sweep behind the paper-scale reasons
    (``SWEEP_COLUMNS``); ``profiles`` maps profile names to loaded hardware profiles.

    Measured speed ratios are samples/s of one run over another's (mean over
    seeds, same timer kind), modelled ones the same ratio of
    ``costmodel.predict_record`` on the same records. Traffic claims are counted
    (``hotcold shard-sim``): they do not depend on the hardware, so their
    measured and modelled values are one number. ``paper``: the paper-scale
    outputs (``paper_scale.PaperScale``; None: the paper-scale columns say they
    are absent); ``shape_of``: a record's model shape (``modelled.model_shapes``);
    ``more``: fills further columns of each row (the GPU's: ``claims_gpu.gpu_columns``).
    """
    if predict is None or comm_model is None:
        from hotcold import methods
        from hotcold.costmodel.collectives import comm_ms
        from hotcold.costmodel.prediction import predict_record

        predict = predict or (lambda rec, profile: predict_record(rec, profile, methods.price(rec["method"])))
        comm_model = comm_model or comm_ms
    rows, sweep = [], []
    for claim in claims:
        row, note = _row(claim), ""
        if claim.kind == "speed":
            note = _speed_claim(row, claim, records, profiles, predict)
        elif claim.kind == "hits":
            _hits_claim(row, claim, records)
        elif claim.kind == "a2a_reduction":
            _a2a_claim(row, claim, comm)
        elif claim.kind == "comm_latency":
            _latency_claim(row, claim, records, comm, profiles, comm_model)
        else:
            row["status"] = "no hotcold method"
        row["why_they_differ"] = _why(row, claim, note)
        paper_scale_columns(row, claim, records, paper, profiles, shape_of or (lambda rec: None), comm_model, sweep)
        if more is not None:
            more(row, claim)
        rows.append(row)
    columns = CLAIM_COLUMNS + [k for k in (rows[0] if rows else {}) if k not in CLAIM_COLUMNS]
    return pd.DataFrame(rows, columns=columns), pd.DataFrame(sweep, columns=SWEEP_COLUMNS)


def claims_table(records: list[dict[str, Any]], comm: pd.DataFrame, profiles: dict[str, Any],
                 predict: Predict | None = None, comm_model: CommModel | None = None,
                 claims: Sequence[Claim] = CLAIMS, paper: Any = None,
                 shape_of: Callable[[dict[str, Any]], Any] | None = None) -> pd.DataFrame:
    """``claims_and_sweep``'s table alone."""
    return claims_and_sweep(records, comm, profiles, predict, comm_model, claims, paper, shape_of)[0]


def claims_markdown(frame: pd.DataFrame) -> str:
    shown = frame.drop(columns=["claim_id"])
    return (
        "# The papers' headline claims, measured and modelled by hotcold\n\n"
        "`paper_value`: the paper's number (`paper_states` quotes it). `measured_value`: this reproduction's runs "
        "on `measured_hardware` with the `measured_timer` (`counted`: a hardware-independent counter); "
        "`measured_stable`: **no** when a run behind it was disturbed. `modelled_value` is **modelled**, not "
        "measured: the cost model (`hotcold.costmodel`) fed the same runs' counters under the hardware profile "
        "`modelled_profile` (`modelled_dominant`: the largest modelled term). Values within "
        f"{AGREE_RTOL:.0%} of the paper's count as agreeing; `why_they_differ` says why where they do not. "
        "`paper_scale_value` is **modelled** on the paper-scale configuration's workload (`paper_scale_workload`: "
        "model, batch, table rows, budget and where the counters come from) under `paper_scale_profile`; "
        "`paper_scale_why` names the knob of `claims_sweep.csv` that closes a gap, or says the outputs are "
        "absent."
        + (" `gpu_measured_value`: the same comparison on GPU-timed runs (`gpu_records` says whose: the committed "
           "evidence of a GPU run, a `gpu-check` output or this reproduction's own CUDA runs) on the card "
           "`gpu_measured_hardware`; `gpu_modelled_value` is **modelled** from those runs on that GPU's calibrated "
           "profile `gpu_modelled_profile`." if "gpu_measured_value" in frame else "")
        + "\n\n"
        + to_markdown(shown, {"paper_value": "{:.3g}", "measured_value": "{:.3g}", "modelled_value": "{:.3g}",
                              "paper_scale_value": "{:.3g}", "gpu_measured_value": "{:.3g}",
                              "gpu_modelled_value": "{:.3g}"})
    )


def load_profiles(paths: Sequence[Path]) -> dict[str, Any]:
    """Hardware profiles by name."""
    from hotcold.costmodel.profile import load_profile

    profiles = [load_profile(Path(p)) for p in paths]
    return {p.name: p for p in profiles}


def write_claims(records: list[dict[str, Any]], comm: pd.DataFrame, profiles: dict[str, Any],
                 out_dir: Path, predict: Predict | None = None, paper: Any = None,
                 shape_of: Callable[[dict[str, Any]], Any] | None = None,
                 more: Callable[[dict[str, Any], Claim], None] | None = None) -> pd.DataFrame:
    """Write ``claims.csv``, ``claims.md`` and ``claims_sweep.csv`` to ``out_dir``; return the table."""
    frame, sweep = claims_and_sweep(records, comm, profiles, predict, paper=paper, shape_of=shape_of, more=more)
    atomic_write_text(Path(out_dir) / "claims.csv", frame.to_csv(index=False))
    atomic_write_text(Path(out_dir) / "claims_sweep.csv", sweep.to_csv(index=False))
    atomic_write_text(Path(out_dir) / "claims.md", claims_markdown(frame))
    return frame
