"""One table of the papers' headline claims: the paper's number, hotcold's measured and modelled ones.

Every row names the claim, the paper's number and hardware, what hotcold
compares (dataset, runs), the measured value with the hardware, timer and
stability of the runs behind it, and the value the cost model gives for the
same runs under a named hardware profile (always labelled ``modelled``).
A claim whose runs are not in this reproduction keeps its row with a
``status`` saying so; a claim hotcold has no method for says that.
The claims and the columns: docs/costmodel.md, "The claims table".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from hotcold.analysis.markdown import to_markdown
from hotcold.analysis.tables import degenerate_of, scale_of
from hotcold.distributed.batch import GLOBAL, PER_RANK
from hotcold.files import atomic_write_text
from hotcold.records import STATUS_DIVERGED, STATUS_OK, record_status

#: measured or modelled within this relative distance of the paper's number counts as agreeing
AGREE_RTOL = 0.25
#: the comm_traffic rows FlexShard's claims are read from: the largest simulated scale at this headroom, at the
#: weak-scaled (per-rank) batch where simulated, the fixed global batch's number beside it
FLEXSHARD_HEADROOM = 1.25
COMM_PHASES = ("input_a2a", "output_a2a", "grad_a2a", "replica_allreduce", "column_allreduce", "dense_allreduce")

CLAIM_COLUMNS = [
    "claim_id", "paper", "claim", "unit", "paper_value", "paper_states", "paper_hardware", "dataset", "compared",
    "status", "measured_value", "measured_hardware", "measured_timer", "measured_stable", "modelled_value",
    "modelled_profile", "modelled_dominant", "why_they_differ", "paper_scale_value", "paper_scale_profile",
    "paper_scale_dominant", "paper_scale_workload", "paper_scale_why",
]
SWEEP_COLUMNS = ["claim_id", "knob", "setting", "factor", "value", "paper_value", "agrees"]


@dataclass(frozen=True)
class Run:
    """A set of runs: by variant name, or by role (the store options it has and a pick among the
    variants that have them), at a scale (world, ranks per node).

    A role resolves in every configuration whatever its variants are called:
    ``Run("fae", pick="largest")`` is FAE's largest hot budget (24.8% of the
    rows in the default config, 256 MiB trained and 512 MiB simulated at paper
    scale), ``Run("freqcache", options=(("cache_ratio", 0.015),))`` the 1.5%
    frequency-aware cache. ``pick``: ``largest`` or ``smallest`` device
    budget (the store report's hot rows or capacity) among the variants that
    ran as their technique (FAE's all-hot or all-cold budgets only when all
    are), or "" (one variant).
    """

    method: str
    variant: str = ""
    world: int = 1
    ranks_per_node: int = 1
    options: tuple[tuple[str, Any], ...] = ()
    pick: str = ""

    def describe(self) -> str:
        parts = [f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.options]
        if self.pick:
            parts.append(f"{self.pick} budget")
        return ", ".join(parts) or "any variant"

    @property
    def label(self) -> str:
        scale = f" at {self.world // self.ranks_per_node}x{self.ranks_per_node}" if self.world > 1 else ""
        if self.variant:
            return f"{self.method}/{self.variant}{scale}"
        role = f" ({self.describe()})" if self.options or self.pick else ""
        return f"{self.method}{role}{scale}"


@dataclass(frozen=True)
class Claim:
    """One headline claim and how hotcold checks it.

    ``kind``: ``speed`` (samples/s of ``run`` over ``baseline``), ``hits``
    (share of ``run``'s lookups served from device memory, in %),
    ``a2a_reduction`` (FlexShard's inter-node all-to-all bytes saved against
    row-wise, %, counted), ``comm_latency`` (row-wise's modelled
    communication time over FlexShard's) or ``none`` (no hotcold method).
    """

    claim_id: str
    paper: str
    claim: str
    unit: str
    paper_value: float          # NaN where the paper states no single number
    paper_states: str           # the number in the paper's words
    paper_hardware: str
    kind: str
    dataset: str = ""
    run: Run | None = None
    baseline: Run | None = None
    profile: str = ""
    why: str = ""               # the usual reason measured or modelled numbers differ from the paper's


FAE = "FAE (Adnan et al., VLDB 2022; arXiv 2103.00686)"
FAE_V1 = "FAE (Adnan et al., arXiv 2103.00686v1, 2021)"
SCRATCHPIPE = "ScratchPipe (Kwon and Rhu, ISCA 2022; arXiv 2205.04702)"
COLOSSAL = "Frequency-aware cache (ColossalAI; Hu et al., arXiv 2208.05321)"
PROACTIVE = "Proactive Embedding (Cho et al., IEEE CAL 2024)"
FLEXSHARD = "FlexShard (Sethi et al., arXiv 2301.02959)"
CPU_NOTE = ("on a CPU-only machine host and 'device' are one memory and one processor, so keeping rows on the "
            "device saves no transfer")
SCALED = "scaled-down '-style' datasets and a small DLRM (dim 16), not the paper's model"

FAE_LARGEST = Run("fae", pick="largest")
HYBRID = Run("hybrid")
DEVICE = Run("device")
SCRATCHPIPE_W2 = Run("scratchpipe", options=(("window", 2),), pick="smallest")
FREQCACHE_15 = Run("freqcache", options=(("cache_ratio", 0.015),))
PROACTIVE_ROW = Run("proactive", world=4, ranks_per_node=2, options=(("plan", "row"),))
SHARDED_ROW = Run("sharded", world=4, ranks_per_node=2, options=(("plan", "row"),))
FLEXSHARD_2X2 = Run("flexshard", world=4, ranks_per_node=2)

CLAIMS: tuple[Claim, ...] = (
    Claim("fae_vs_hybrid", FAE, "training faster than the CPU-GPU hybrid (hot rows on the GPU)", "x",
          1.52, "1.52x less training time than XDL CPU-GPU", "Xeon host + V100 GPU over PCIe 3 (XDL baselines)",
          "speed", "kaggle", FAE_LARGEST, HYBRID, "v100-xeon-pcie3", f"{CPU_NOTE}; {SCALED}"),
    Claim("fae_vs_hybrid_v1", FAE_V1, "training faster than the CPU-GPU hybrid (the preprint's number)", "x",
          2.34, "2.34x faster training than the baseline (arXiv 2103.00686v1 abstract; the VLDB version states "
          "1.52x)", "Xeon host + V100 GPU over PCIe 3", "speed", "kaggle", FAE_LARGEST, HYBRID, "v100-xeon-pcie3",
          f"{CPU_NOTE}; {SCALED}"),
    Claim("fae_vs_cpu", FAE, "training faster than CPU-only training", "x", 2.3,
          "2.3x less training time than XDL CPU-only", "Xeon host + V100 GPU over PCIe 3 (XDL baselines)", "none",
          why="hotcold has no CPU-only training method: its baseline is the CPU-GPU hybrid"),
    Claim("scratchpipe_gpu_speed", SCRATCHPIPE, "embedding training at GPU memory speed (as if the table fit)",
          "x of device", 1.0, "'embedding layer training at GPU memory speed'", "Xeon host + V100 GPU over PCIe 3",
          "speed", "kaggle", SCRATCHPIPE_W2, DEVICE, "v100-xeon-pcie3",
          f"{CPU_NOTE}; the scratchpad's side work competes with training for the same cores"),
    Claim("scratchpipe_hits", SCRATCHPIPE, "the look-ahead scratchpad always holds the batch's working set",
          "% hits", 100.0, "the active working set is 'always' captured", "any (a property of the design)",
          "hits", "kaggle", SCRATCHPIPE_W2, why="counted: does not depend on hardware"),
    Claim("freqcache_1.5pct", COLOSSAL, "1.5% of the rows in a GPU cache keep end-to-end training fast",
          "x of device", math.nan, "'only 1.5% of the embedding parameters in the GPU' for 'decent' speed "
          "(no single ratio)", "one GPU (paper's prototype)", "speed", "kaggle", FREQCACHE_15, DEVICE, "a100-dgx",
          f"{CPU_NOTE}; {SCALED}"),
    Claim("freqcache_hits", COLOSSAL, "frequency-aware warm-up makes a 1.5% cache hit most lookups", "% hits",
          math.nan, "no single hit rate stated", "one GPU (paper's prototype)", "hits", "kaggle",
          FREQCACHE_15, why="counted: depends on the data's skew, ours is generated"),
    Claim("proactive_speedup", PROACTIVE, "early cold-row lookups during communication speed up scale-out training",
          "x", 1.46, "'improve overall training performance by 46%' (analysis)", "multi-GPU scale-out (analysis)",
          "speed", "kaggle", PROACTIVE_ROW, SHARDED_ROW, "h100-cluster",
          "measured with 4 gloo ranks sharing 2 CPU cores, where hiding a lookup behind a collective frees no "
          "processor; modelled on a 2x2 run's small batches"),
    Claim("flexshard_a2a", FLEXSHARD, "per-row tiered sharding cuts global all-to-all traffic", "% less",
          85.0, "'reduce overall global all-to-all communication traffic by over 85%'",
          "production cluster of GPU nodes", "a2a_reduction", "taobao",
          why="counted on a generated Taobao-style trace (20-event histories), not the paper's production "
              "sequences; the solver pays the replica all-reduce of every replicated row, priced as the "
              "wire sends it (float32 by default)"),
    Claim("flexshard_latency", FLEXSHARD, "lower end-to-end training communication latency than the prior "
          "state of the art (row-wise)", "x", 6.0, "'communication latency improvements of almost 6x'",
          "production cluster of GPU nodes", "comm_latency", "taobao", profile="h100-cluster",
          why="modelled from counted bytes at the largest simulated scale; measured with gloo on 2 cores"),
)


# --- measured ---------------------------------------------------------------------------------------------------

def _same(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isclose(float(value), wanted, rel_tol=1e-9)
    return value == wanted


def _option(rec: dict[str, Any], key: str) -> Any:
    """A record's store option ``key`` (its config's; a scale-out summary's ``plan``)."""
    store = (rec.get("config") or {}).get("store") or {}
    return store[key] if key in store else (rec.get("summary") or {}).get(key)


def budget_of(rec: dict[str, Any]) -> float:
    """A record's device budget in rows: FAE's hot rows, a cache's or scratchpad's capacity (0: none)."""
    report = rec.get("store") or {}
    return float(report.get("hot_rows") or report.get("capacity") or 0)


def _matching(records: list[dict[str, Any]], dataset: str, run: Run) -> list[dict[str, Any]]:
    """The records (every seed) of ``run``: its variant, or the variant its role picks."""
    recs = [r for r in records if record_status(r) == STATUS_OK and r.get("dataset") == dataset
            and r.get("method") == run.method and scale_of(r) == (run.world, run.ranks_per_node)]
    if run.variant:
        return [r for r in recs if r.get("variant") == run.variant]
    recs = [r for r in recs if all(_same(_option(r, k), v) for k, v in run.options)]
    if not recs:
        return []
    variants = sorted({r.get("variant") for r in recs})
    if run.pick in ("largest", "smallest"):
        # a budget that ran as another store (FAE all-hot or all-cold) is picked only when every budget did
        ordinary = [v for v in variants if not any(degenerate_of(r) for r in recs if r.get("variant") == v)]
        variants = ordinary or variants
        budget = {v: max(budget_of(r) for r in recs if r.get("variant") == v) for v in variants}
        chosen = (max if run.pick == "largest" else min)(variants, key=lambda v: (budget[v], v))
    else:
        chosen = variants[0]
    return [r for r in recs if r.get("variant") == chosen]


def _not_run(records: list[dict[str, Any]], dataset: str, run: Run) -> str:
    """The status of a claim whose ``run`` has no trained record: ``diverged`` where its runs diverged, else not run."""
    diverged = sorted({f"{r.get('variant')} at step {r.get('diverged_step')}" for r in records
                       if record_status(r) == STATUS_DIVERGED and r.get("dataset") == dataset
                       and r.get("method") == run.method and scale_of(r) == (run.world, run.ranks_per_node)
                       and (r.get("variant") == run.variant if run.variant
                            else all(_same(_option(r, k), v) for k, v in run.options))})
    if diverged:
        return f"diverged: {run.label} on {dataset} ({', '.join(diverged)}): no number to compare"
    return f"not run: no trained {run.label} on {dataset} in this reproduction"


def _label(recs: list[dict[str, Any]], run: Run) -> str:
    """The variant a role resolved to, in ``compared``."""
    if not recs or run.variant:
        return run.label
    scale = f" at {run.world // run.ranks_per_node}x{run.ranks_per_node}" if run.world > 1 else ""
    return f"{run.method}/{recs[0].get('variant')}{scale}"


def _hardware(recs: list[dict[str, Any]]) -> str:
    names = []
    for rec in recs:
        prov = rec.get("provenance") or {}
        device = prov.get("device") or "?"
        host = prov.get("cpu") or "?"
        name = f"{device} ({host}, {prov.get('threads', '?')} threads)" if device != "cpu" else \
            f"CPU {host}, {prov.get('threads', '?')} threads"
        names.append(name)
    return "; ".join(sorted(set(names)))


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def _speed(recs: list[dict[str, Any]]) -> float:
    return _mean([r["summary"].get("samples_per_s", math.nan) for r in recs])


def _stable(recs: list[dict[str, Any]]) -> Any:
    flags = [(r.get("summary") or {}).get("stable") for r in recs]
    return None if any(f is None for f in flags) else all(bool(f) for f in flags)


def _degenerate(recs: list[dict[str, Any]], run: Run) -> str:
    """Says so where ``run``'s records did not run as their technique (FAE all-hot or all-cold); empty otherwise."""
    marks = sorted({f"{r.get('variant')} {m}" for r in recs if (m := degenerate_of(r))})
    if not marks:
        return ""
    return (f"degenerate: {run.method} {', '.join(marks)} (all-hot: every timed batch hot, the device store's "
            "run; all-cold: the hybrid store's), so this is not the technique's speed-up")


def _comm_ms(recs: list[dict[str, Any]]) -> float:
    return _mean([sum((r["summary"].get("phase_ms_mean") or {}).get(p, 0.0) for p in COMM_PHASES) for r in recs])


# --- the rows ---------------------------------------------------------------------------------------------------

Predict = Callable[[dict[str, Any], Any], Any]
CommModel = Callable[..., dict[str, float]]


def _row(claim: Claim) -> dict[str, Any]:
    compared = claim.run.label if claim.run else ""
    if claim.baseline:
        compared += f" vs {claim.baseline.label}"
    return {"claim_id": claim.claim_id, "paper": claim.paper, "claim": claim.claim, "unit": claim.unit,
            "paper_value": claim.paper_value, "paper_states": claim.paper_states,
            "paper_hardware": claim.paper_hardware, "dataset": claim.dataset, "compared": compared,
            "status": "ok", "measured_value": math.nan, "measured_hardware": "", "measured_timer": "",
            "measured_stable": None, "modelled_value": math.nan, "modelled_profile": "", "modelled_dominant": "",
            "why_they_differ": "", "paper_scale_value": math.nan, "paper_scale_profile": "",
            "paper_scale_dominant": "", "paper_scale_workload": "", "paper_scale_why": ""}


def _modelled_speed(recs: list[dict[str, Any]], profile: Any, predict: Predict) -> tuple[float, str]:
    preds = [predict(r, profile) for r in recs]
    return _mean([p.samples_per_s for p in preds]), preds[0].dominant if preds else ""


def _speed_claim(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], profiles: dict[str, Any],
                 predict: Predict) -> str:
    """Fill ``row``; return ``_degenerate``'s note on the compared run (empty for an ordinary one)."""
    run, base = _matching(records, claim.dataset, claim.run), _matching(records, claim.dataset, claim.baseline)
    if not run or not base:
        row["status"] = _not_run(records, claim.dataset, claim.run if not run else claim.baseline)
        return ""
    note = _degenerate(run, claim.run)
    row["compared"] = f"{_label(run, claim.run)} vs {_label(base, claim.baseline)}" + (f" [{note}]" if note else "")
    timers = {r["summary"].get("timer") for r in run + base}
    row["measured_timer"] = ", ".join(sorted(str(t) for t in timers))
    if len(timers) == 1:
        row["measured_value"] = _speed(run) / _speed(base)
    row["measured_hardware"] = _hardware(run + base)
    row["measured_stable"] = _stable(run + base)
    profile = profiles.get(claim.profile)
    if profile is None:
        row["modelled_profile"] = f"{claim.profile} (profile not given)"
        return note
    (speed_run, dominant), (speed_base, _) = (_modelled_speed(run, profile, predict),
                                              _modelled_speed(base, profile, predict))
    row["modelled_value"] = speed_run / speed_base
    row["modelled_profile"], row["modelled_dominant"] = claim.profile, f"{claim.run.method}: {dominant}"
    return note


def _hits_claim(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]]) -> None:
    run = _matching(records, claim.dataset, claim.run)
    if not run:
        row["status"] = _not_run(records, claim.dataset, claim.run)
        return
    row["compared"] = _label(run, claim.run)
    counters = [r["summary"].get("counters_per_step") or {} for r in run]
    lookups = sum(c.get("lookups", 0.0) for c in counters)
    row["measured_value"] = 100.0 * sum(c.get("hits", 0.0) for c in counters) / lookups if lookups else math.nan
    row["measured_timer"], row["measured_hardware"] = "counted", "any"
    row["modelled_profile"] = "counted: not modelled"


def _largest_sim(comm: pd.DataFrame, dataset: str, batching: str | None = None) -> pd.DataFrame:
    """Simulated FlexShard and row-wise rows of ``dataset`` at its largest scale and the claims' headroom, of one
    ``batching`` (``per-rank`` or ``global``; None: the weak-scaled rows where there are any, else the fixed ones)."""
    if comm.empty:
        return comm
    sim = comm[(comm["source"] == "simulated") & (comm["dataset"] == dataset) & (comm["status"] == STATUS_OK)
               & np.isclose(comm["memory_headroom"].astype(float), FLEXSHARD_HEADROOM)]
    sim = sim[sim["plan"].isin(["flexshard", "row"])]
    batchings = sim["batching"].fillna("") if "batching" in sim else pd.Series(GLOBAL, index=sim.index)
    if batching is None:
        batching = PER_RANK if (batchings == PER_RANK).any() else GLOBAL
    sim = sim[batchings == batching]
    if sim.empty:
        return sim
    world = sim.groupby("world")["plan"].nunique()
    worlds = world[world == 2].index
    return sim[sim["world"] == worlds.max()] if len(worlds) else sim.iloc[0:0]


def _batch_words(first: pd.Series) -> str:
    """``512 samples per rank (global batch 65,536)`` or ``the fixed global batch 1,024 (8 per rank)``."""
    size, per_rank = first.get("batch_size"), first.get("batch_per_rank")
    if pd.isna(size):
        return "batch not stated"
    if first.get("batching") == PER_RANK:
        return f"{per_rank:,.6g} samples per rank (global batch {size:,.0f})"
    return f"the fixed global batch {size:,.0f} ({per_rank:,.6g} per rank)"


def _reduction(sim: pd.DataFrame) -> float:
    by_plan = sim.set_index("plan")
    return 100.0 * (1.0 - by_plan.loc["flexshard", "inter_node_a2a_bytes"] / by_plan.loc["row", "inter_node_a2a_bytes"])


def _whole(sim: pd.DataFrame) -> str:
    """``; with replica sync: X% less inter-node traffic; sync-free bound: Y%`` (empty for tables without them)."""
    by_plan = sim.set_index("plan")
    if not {"inter_node_embedding_bytes", "syncfree_inter_node_a2a_bytes"} <= set(by_plan.columns):
        return ""
    row_total = float(by_plan.loc["row", "inter_node_embedding_bytes"])
    flex = by_plan.loc["flexshard"]
    if not row_total > 0 or pd.isna(flex["inter_node_embedding_bytes"]):
        return ""
    out = f"; with replica sync: {100 * (1 - flex['inter_node_embedding_bytes'] / row_total):.1f}% less"
    if pd.notna(flex["syncfree_inter_node_a2a_bytes"]):
        out += f"; sync-free bound: {100 * (1 - flex['syncfree_inter_node_a2a_bytes'] / row_total):.1f}% less"
    return out


def _a2a_claim(row: dict[str, Any], claim: Claim, comm: pd.DataFrame) -> None:
    sim = _largest_sim(comm, claim.dataset)
    if sim.empty:
        row["status"] = f"not run: no simulated flexshard and row plans on {claim.dataset} at headroom " \
                        f"{FLEXSHARD_HEADROOM:g}"
        return
    first = sim.set_index("plan").loc["flexshard"]
    row["compared"] = (f"flexshard vs row, shard-sim at {int(first['nodes'])}x{int(first['ranks_per_node'])}, "
                       f"headroom {FLEXSHARD_HEADROOM:g}, {_batch_words(first)}")
    fixed = _largest_sim(comm, claim.dataset, GLOBAL) if first.get("batching") == PER_RANK else sim.iloc[0:0]
    fixed = fixed[fixed["world"] == first["world"]]
    if not fixed.empty:
        row["compared"] += (f"; at {_batch_words(fixed.set_index('plan').loc['flexshard'])}: "
                            f"{_reduction(fixed):.1f}% less")
    row["compared"] += _whole(sim)
    row["measured_value"] = _reduction(sim)
    row["measured_timer"], row["measured_hardware"] = "counted (shard-sim)", "any"
    row["modelled_profile"] = "counted: not modelled"


def _latency_claim(row: dict[str, Any], claim: Claim, records: list[dict[str, Any]], comm: pd.DataFrame,
                   profiles: dict[str, Any], comm_model: CommModel) -> None:
    trained_flex = _matching(records, claim.dataset, FLEXSHARD_2X2)
    trained_row = _matching(records, claim.dataset, SHARDED_ROW)
    if trained_flex and trained_row:
        row["measured_value"] = _comm_ms(trained_row) / _comm_ms(trained_flex)
        row["measured_timer"] = ", ".join(sorted({str(r["summary"].get("timer")) for r in trained_flex}))
        row["measured_hardware"] = _hardware(trained_flex + trained_row)
        row["measured_stable"] = _stable(trained_flex + trained_row)
        measured = "trained at 2x2 (communication phases)"
    else:
        measured = "no trained 2x2 runs"
    sim = _largest_sim(comm, claim.dataset)
    profile = profiles.get(claim.profile)
    if sim.empty or profile is None:
        row["compared"] = f"flexshard vs sharded/row: {measured}"
        row["modelled_profile"] = f"{claim.profile} (profile not given)" if profile is None else ""
        return
    by_plan = sim.set_index("plan")
    first = by_plan.loc["flexshard"]
    scale = f"{int(first['nodes'])}x{int(first['ranks_per_node'])}"
    times = {plan: comm_model(by_plan.loc[plan].to_dict(), int(first["world"]), int(first["ranks_per_node"]),
                              profile) for plan in ("row", "flexshard")}
    row["modelled_value"] = times["row"]["total"] / times["flexshard"]["total"]
    row["modelled_profile"] = claim.profile
    flex = {k: v for k, v in times["flexshard"].items() if k != "total"}
    row["modelled_dominant"] = f"flexshard: {max(flex, key=flex.get)}" if flex else ""
    row["compared"] = f"flexshard vs sharded/row: {measured}; modelled from shard-sim at {scale}, " \
                      f"headroom {FLEXSHARD_HEADROOM:g}, {_batch_words(first)}"


def _differs(value: float, paper: float) -> bool:
    return not (math.isnan(value) or math.isnan(paper)) and abs(value - paper) > AGREE_RTOL * abs(paper)


def _why(row: dict[str, Any], claim: Claim, note: str = "") -> str:
    reasons = [note] if note else []
    if row["measured_stable"] is False:
        reasons.append("measured runs disturbed (stable = no)")
    measured_off = _differs(row["measured_value"], claim.paper_value)
    modelled_off = _differs(row["modelled_value"], claim.paper_value)
    if (measured_off or modelled_off or math.isnan(claim.paper_value)) and claim.why:
        reasons.append(claim.why)
    elif claim.kind == "none":
        reasons.append(claim.why)
    return "; ".join(reasons)


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
    from hotcold.analysis.claims_paper_scale import paper_scale_columns

    if predict is None or comm_model is None:
        from hotcold import costmodel, methods

        predict = predict or (lambda rec, profile: costmodel.predict_record(rec, profile, methods.price(rec["method"])))
        comm_model = comm_model or costmodel.comm_ms
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
    from hotcold.costmodel import load_profile

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
