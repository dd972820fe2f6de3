"""Tidy tables from run records: summary, per-phase times, counters and the comparisons.

``aggregate`` reads run records (one-process and scale-out) and writes the
summary, per-phase and counter tables, the comparison tables of
``hotcold.analysis.comparisons`` and ``infeasible.md``. A variant that could not
run keeps its summary row, so the tables show what is missing instead of the
workflow stopping; speed-ups and exactness compare only runs that compare
(same timer kind, one process, byte-identical datasets: ``summary_frame``).
Columns: docs/outputs.md, "Tables".
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from hotcold.analysis.comparisons import fae_table, speedup_markdown, speedup_table, traffic_table
from hotcold import methods
from hotcold.analysis.markdown import to_markdown
from hotcold.config import AggregateConfig
from hotcold.contention import MAX_OTHER_CORES, MAX_PROBE_SLOWDOWN
from hotcold.files import atomic_write_text
from hotcold.records import (
    STATUS_DIVERGED,
    STATUS_INFEASIBLE,
    STATUS_OK,
    STATUS_SKIPPED,
    record_status,
    sketch_rel_diff,
)
from hotcold.timing import MAX_REPEAT_SPREAD

RECORD_GLOB = "*/*/*/seed~*/record.json"
SCALE_OUT_GLOB = "*/*/*/world~*-rpn~*/seed~*/record.json"
SCALE_DIR = re.compile(r"^world~(\d+)-rpn~(\d+)$")
KEYS = ["dataset", "method", "variant", "seed"]        # what a record names itself by
SCALE = ["world", "ranks_per_node"]
RUN_ID = ["dataset", "method", "variant", *SCALE, "seed"]  # what tells runs apart
BASELINE_METHOD = "hybrid"
REFERENCE_METHOD = "device"
PREFERRED_VARIANT = "base"
EXACT_RTOL = AggregateConfig().exact_rtol

REFERENCE_LABELS = {"run": "device run", "replay": "device replay of this order",
                    "scale_out": "one-process device replay", "peer": "device run (peer kernel, own rounding)",
                    "wire": "one-process device replay (not exact mode: exactness not claimed)",
                    "unchecked": "not checked (distributed.reference: none)",
                    "lockstep": "lock-step with the device store (peer kernel, own rounding)"}

SUMMARY_COLUMNS = [
    *RUN_ID, "plan", "status", "options", "timer", "device", "samples_per_s", "step_ms_p50", "step_ms_p10", "step_ms_p90",
    "step_ms_mean", "speedup_vs_hybrid", "auc", "auc_vs_hybrid", "logloss", "exact", "exact_check", "exact_reference",
    "param_rel_diff", "stable", "unstable_reason", "degenerate", "repeats", "repeat_spread", "other_cores",
    "probe_slowdown",
]
PROVENANCE_COLUMNS = [
    "reason", "dataset_sha256", "device_type", "batch_size", "steps_timed", "threads", "torch", "git_commit", "git_dirty",
    "source_sha256", "eval_samples", "machine",
]


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


def _row(rec: dict[str, Any]) -> dict[str, Any]:
    summary, prov = rec.get("summary") or {}, rec.get("provenance") or {}
    metrics = rec.get("metrics") or {}
    world, rpn = scale_of(rec)
    return {
        **{k: rec[k] for k in KEYS},
        "world": world,
        "ranks_per_node": rpn,
        "plan": plan_of(rec),
        "status": record_status(rec),
        "reason": rec.get("reason"),
        "options": options_label((rec.get("config") or {}).get("store")),
        "timer": summary.get("timer", prov.get("timer")),
        "device": prov.get("device"),
        "samples_per_s": summary.get("samples_per_s"),
        **{k: summary.get(k) for k in ("step_ms_p50", "step_ms_p10", "step_ms_p90", "step_ms_mean")},
        "stable": summary.get("stable"),  # absent in records from before the judgement
        "unstable_reason": summary.get("unstable_reason") or None,
        "degenerate": degenerate_of(rec),
        "repeats": summary.get("repeats", 1) if summary else None,  # records from before repeats: one
        "repeat_spread": summary.get("repeat_spread"),
        "other_cores": summary.get("other_cores"),  # absent in records from before the contention watch
        "probe_slowdown": summary.get("probe_slowdown"),
        "auc": metrics.get("auc"),
        "logloss": metrics.get("logloss"),
        "dataset_sha256": rec.get("dataset_manifest_sha256"),
        "device_type": prov.get("device_type"),
        "batch_size": summary.get("batch_size"),
        "steps_timed": summary.get("steps_timed"),
        "threads": prov.get("threads"),
        "torch": prov.get("torch"),
        "git_commit": prov.get("git_commit"),
        "git_dirty": prov.get("git_dirty"),
        "source_sha256": prov.get("source_sha256"),
        "eval_samples": metrics.get("eval_samples"),
        "machine": prov.get("machine"),  # absent in records from before it was recorded
    }


def one_process(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of one-process runs (world 1; a table without ``world`` is older: all of them)."""
    if "world" not in frame:
        return frame
    return frame[frame["world"].fillna(1).astype("int64") == 1]


def _pick_reference(group: pd.DataFrame, method: str) -> pd.Series | None:
    """The trained one-process ``method`` run of a group: variant ``base`` if present, else the first by name."""
    group = one_process(group)
    cands = group[(group["method"] == method) & (group["status"] == STATUS_OK)].sort_values("variant")
    if cands.empty:
        return None
    base = cands[cands["variant"] == PREFERRED_VARIANT]
    return (base if not base.empty else cands).iloc[0]


def _speedups(frame: pd.DataFrame) -> pd.Series:
    """samples/s over the hybrid run of the same dataset, seed and timer kind."""
    out = pd.Series(np.nan, index=frame.index, dtype="float64")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed", "timer"], dropna=False, sort=False):
        ref, group = _pick_reference(group, BASELINE_METHOD), one_process(group)
        if ref is not None and ref["samples_per_s"] and ref["samples_per_s"] > 0:
            out[group.index] = group["samples_per_s"].astype("float64") / float(ref["samples_per_s"])
    return out


#: ``exact_check``: how a run's ``exact`` was decided (``lockstep.CHECK_BITS`` and ``CHECK_LOCKSTEP``, and none)
EXACT_CHECKS = {"bits": "bits: the same operations in the same order as the reference",
                "lockstep": "lock-step: its own kernels round their own way",
                "distance": "end-state distance: its own kernels round their own way",
                "none": "none"}


def _exactness(frame: pd.DataFrame, records: list[dict[str, Any]],
               exact_rtol: float) -> tuple[pd.Series, pd.Series, pd.Series, pd.Series]:
    """Relative parameter-sketch distance to each run's reference, which reference that was, and the check.

    ``exact_check`` names how ``exact`` was decided: ``bits`` (the
    harness's stores: the reference's operations in its order, so its bits,
    held to the sketch's float32 tolerance), ``lock-step`` (a peer's kernels,
    compared step by step; a peer's record from before that check: its
    end-state distance) or ``none`` (a run outside exact mode, or with no
    reference trained): never a bare "no".

    The reference is the record's own ``reference`` (the ``device`` store
    replayed on the run's batch order) when it has one, else the ``device``
    run of the same dataset and seed. A run over ranks outside exact mode
    (``distributed.exact`` false: float32 or bfloat16 all-reduces) gets its
    distance but never ``exact``: only exact mode claims it (records before the
    option existed summed in float64, so they count as exact mode).
    """
    sketches = [(r.get("params") or {}).get("sketch") for r in records]
    replays = [((r.get("reference") or {}).get("params") or {}).get("sketch") for r in records]
    diff = pd.Series(np.nan, index=frame.index, dtype="float64")
    exact = pd.Series(pd.NA, index=frame.index, dtype="boolean")
    label = pd.Series(pd.NA, index=frame.index, dtype="string")
    check = pd.Series(pd.NA, index=frame.index, dtype="string")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed"], dropna=False, sort=False):
        ref = _pick_reference(group, REFERENCE_METHOD)
        for idx in group.index:
            if (records[idx].get("reference") or {}).get("checked") is False:  # no replay was trained
                label[idx], check[idx] = REFERENCE_LABELS["unchecked"], EXACT_CHECKS["none"]
                continue
            if replays[idx] is not None:
                kind = "scale_out" if frame.at[idx, "world"] > 1 else "replay"
                d = sketch_rel_diff(sketches[idx], replays[idx])
            elif ref is not None:
                kind = "peer" if frame.at[idx, "method"] in methods.names(peer=True) else "run"
                d = sketch_rel_diff(sketches[idx], sketches[ref.name])
            else:
                continue
            if kind == "scale_out" and not ((records[idx].get("config") or {}).get("distributed") or {}).get(
                    "exact", True):
                kind = "wire"
            if not math.isnan(d):
                diff[idx], label[idx] = d, REFERENCE_LABELS[kind]
                exact[idx] = pd.NA if kind == "wire" else d <= exact_rtol
                check[idx] = EXACT_CHECKS[{"wire": "none", "peer": "distance"}.get(kind, "bits")]
            lock = records[idx].get("lockstep")
            if lock:  # a peer checked step by step: its exactness is that check's, its distance the end state's
                exact[idx], check[idx] = bool(lock["ok"]), EXACT_CHECKS["lockstep"]
                label[idx] = (f"{REFERENCE_LABELS['lockstep']}: {lock['steps']} steps, max diff "
                              f"{lock['max_diff']:.1e} {'<=' if lock['ok'] else '>'} {lock['atol']:g}")
    return exact, check, diff, label


def _auc_vs_hybrid(frame: pd.DataFrame) -> pd.Series:
    """AUC minus the AUC of the hybrid run of the same dataset and seed."""
    out = pd.Series(np.nan, index=frame.index, dtype="float64")
    for _, group in frame.groupby(["dataset", "dataset_sha256", "seed"], dropna=False, sort=False):
        ref, group = _pick_reference(group, BASELINE_METHOD), one_process(group)
        if ref is not None and pd.notna(ref["auc"]):
            out[group.index] = group["auc"].astype("float64") - float(ref["auc"])
    return out


def summary_frame(records: list[dict[str, Any]], exact_rtol: float = EXACT_RTOL) -> pd.DataFrame:
    """One row per run, sorted by dataset, method, variant, world, ranks per node, seed.

    Every run is identified by ``RUN_ID``: dataset, method, variant, ``world``,
    ``ranks_per_node`` and seed (a one-process run has world 1 and 1 rank per node).
    Speed-ups are computed only between runs timed by the same kind of timer, and only
    between one-process runs: a scale-out run trains fewer steps with P processes
    sharing the machine's cores, so its samples/s and AUC are not comparable with
    ``hybrid``'s; its ``speedup_vs_hybrid`` and ``auc_vs_hybrid`` stay empty, it
    is left out of ``speedup`` and ``rows_moved`` (no host-device traffic), and its
    numbers are in the scale-out tables (``hotcold.analysis.scaleout``).
    The ``exact`` column checks the invariant from the records' parameter
    sketches: against the record's own ``reference`` when it has one (a store
    with its own batch order, e.g. FAE, carries the ``device`` store replayed on
    that order), else against the ``device`` run of the same dataset and seed.
    Comparisons between runs use only runs on byte-identical datasets (same
    manifest hash), so stale runs of another scale under the same name never
    serve as a reference.
    """
    frame = pd.DataFrame([_row(r) for r in records])
    frame["seed"] = frame["seed"].astype("int64")
    frame["speedup_vs_hybrid"] = _speedups(frame)
    frame["auc_vs_hybrid"] = _auc_vs_hybrid(frame)
    frame["exact"], frame["exact_check"], frame["param_rel_diff"], frame["exact_reference"] = _exactness(
        frame, records, exact_rtol)
    frame = frame[SUMMARY_COLUMNS + PROVENANCE_COLUMNS]
    return frame.sort_values(RUN_ID, kind="stable").reset_index(drop=True)


def _long(records: list[dict[str, Any]], name: str, values: dict[str, str]) -> pd.DataFrame:
    """Long frame of one per-name section of the summaries, in the records' own key order."""
    rows = []
    for rec in ok_records(records):
        summary = rec["summary"]
        first = summary.get(next(iter(values.values())), {}) or {}
        world, rpn = scale_of(rec)
        for key in first:
            rows.append({
                **{k: rec[k] for k in KEYS},
                "world": world,
                "ranks_per_node": rpn,
                "timer": summary.get("timer"),
                name: key,
                **{col: (summary.get(src) or {}).get(key, math.nan) for col, src in values.items()},
            })
    cols = [*RUN_ID, "timer", name, *values]
    frame = pd.DataFrame(rows, columns=cols)
    frame[["world", "ranks_per_node", "seed"]] = frame[["world", "ranks_per_node", "seed"]].astype("int64")
    return frame.sort_values(RUN_ID, kind="stable").reset_index(drop=True)


def phases_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-phase step times (median and mean ms), one row per trained run and phase."""
    return _long(records, "phase", {"ms_p50": "phase_ms_p50", "ms_mean": "phase_ms_mean"})


def counters_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per-step counters (lookups, hits, rows and bytes moved...), one row per trained run and counter."""
    return _long(records, "counter", {"per_step": "counters_per_step"})


def code_note(summary: pd.DataFrame) -> str:
    """A warning for the top of a table whose runs come from several code versions or a modified tree.

    Snakemake reruns a job when its inputs or parameters change; the package's
    code is a parameter only with ``rerun_on_code_change``, so one summary can
    still mix runs of different code.
    Empty when every run names one clean commit.
    """
    versions = summary.loc[summary["git_commit"].notna(), ["git_commit", "git_dirty"]].drop_duplicates()
    dirty = versions["git_dirty"].map(lambda d: d is True or d == 1)
    if len(versions) <= 1 and not dirty.any():
        return ""
    labels = [f"`{str(c)[:10]}`" + (" (modified tree)" if d else "") for c, d in zip(versions["git_commit"], dirty)]
    several = "several code versions: " if len(versions) > 1 else ""
    return (f"**Code:** these runs come from {several}{', '.join(labels)}. With `rerun_on_code_change` (the "
            "default) a code edit reruns the training jobs; runs made by hand, with it off or by an older workflow "
            "keep their code (`source_sha256` names it). `--forcerun train train_scaleout` (interleaved: the "
            "`train_group_<dataset>` rules) reruns every training job with the code checked out now.\n\n")


def machines_note(summary: pd.DataFrame) -> str:
    """A note for the top of a table whose runs come from several machines: which, and how far the same run
    (dataset, method, variant, scale, seed, timer) measured apart on two of them. Empty for one machine."""
    ok = summary[(summary["status"] == STATUS_OK) & summary["machine"].notna()]
    machines = sorted(ok["machine"].unique())
    if len(machines) <= 1:
        return ""
    spreads = []
    for key, group in ok.groupby([*RUN_ID, "timer"], dropna=False, sort=True):
        rates = group.groupby("machine")["samples_per_s"].median().dropna()
        if len(rates) > 1 and rates.min() > 0:
            spreads.append((float(rates.max() / rates.min()), "/".join(str(k) for k in key[:3])))
    line = (f"**Machines:** these runs come from {len(machines)} machines ({', '.join(f'`{m}`' for m in machines)}); "
            "times are compared only within one machine's runs where it matters.")
    if spreads:
        worst = max(spreads)
        line += (f" The same run measured on several of them differed by up to {worst[0]:.2f}x in samples/s "
                 f"({worst[1]}; median {float(np.median([s for s, _ in spreads])):.2f}x over {len(spreads)} runs).")
    return line + "\n\n"


def skipped_note(summary: pd.DataFrame) -> str:
    """A note for the top of the summary naming the runs skipped for a missing optional package, and why.

    Empty when none was skipped.
    """
    rows = summary[summary["status"] == STATUS_SKIPPED]
    if rows.empty:
        return ""
    lines = []
    for (method, reason), group in rows.groupby(["method", "reason"], sort=True, dropna=False):
        runs = ", ".join(f"{r.dataset}/{r.variant}" for r in group.sort_values(["dataset", "variant"])
                         .itertuples(index=False))
        lines.append(f"- `{method}` ({len(group)} run(s): {runs}): {reason}")
    return ("**Skipped:** these runs of peer methods did not train here, because the optional package they "
            "run on is not usable; they have no numbers. Installing it (`pip install -e .[peers]`) and rerunning "
            "the workflow trains them.\n\n" + "\n".join(lines) + "\n\n")


def _summary_markdown(summary: pd.DataFrame, exact_rtol: float) -> str:
    timers = ", ".join(sorted(summary["timer"].dropna().astype(str).unique())) or "unknown"
    return (
        "# hotcold summary\n\n"
        + code_note(summary) + machines_note(summary) + skipped_note(summary) +
        f"Timer kind(s): {timers}. Speed-up is samples/s over the `{BASELINE_METHOD}` run "
        "of the same dataset, seed and timer kind; times from different timers are never compared.\n"
        f"`exact`: final parameters match the reference (relative sketch distance <= {exact_rtol:g}); "
        "`exact_check` names how that was decided: `bits` (the harness's stores run the reference's operations "
        "in its order, each IEEE-rounded on the host as on a GPU), `lock-step` (below) or `none`; "
        f"`exact_reference` says which: the `{REFERENCE_METHOD}` run of the same dataset and seed, or, "
        "for a store with its own batch order (FAE), the record's own replay of that order on the "
        f"`{REFERENCE_METHOD}` store. A peer method (`fbgemm`) runs its own kernels: the same update, rounded "
        "differently, and training amplifies rounding (Adagrad turns near-zero gradients into full steps), so "
        "beyond a few dozen steps its distance is far above the tolerance although its update is the same "
        "(docs/measurements.md gives the measured growth): its `exact` is a lock-step check instead, its store "
        f"and the `{REFERENCE_METHOD}` store fed the same ids and gradients for the run's first batches and compared "
        "every step (`exact_reference` gives the steps and the largest difference; `param_rel_diff` stays the end "
        "state's). `auc_vs_hybrid`: AUC minus the `{BASELINE_METHOD}` run's. "
        "`status` `infeasible`: the variant cannot run on this dataset (no numbers; see infeasible.md); "
        "`skipped`: a peer method whose optional package is not installed here (no numbers); "
        "`diverged`: the run's loss or a parameter became non-finite (no numbers; infeasible.md gives the step). "
        "`world` > 1: a scale-out run of `world` ranks, `ranks_per_node` per simulated node, under sharding "
        "`plan`; it trains fewer steps with its ranks sharing the machine, so it has no speed-up or "
        "`auc_vs_hybrid` (see comm_traffic.md and proactive.md); `exact` compares it with the one-process "
        f"`{REFERENCE_METHOD}` store replayed on its batches, and is claimed only for a run in exact mode "
        "(`distributed.exact`: float64 all-reduces); a run on the production float32 or bfloat16 wire has its "
        "`param_rel_diff` and no `exact` (docs/scale-out.md, \"What is sent\"); a run with `distributed.reference: none` "
        "trained no replay: no `exact`, and `exact_reference` says \"not checked\". `stable`: no when the run's step times spread "
        "beyond p90/p10 = 3 or, for a one-process CPU run, its process got less than half of wall time x "
        "threads of CPU time (other programs held the cores), or its repeats' samples/s spread beyond "
        f"max/min = {MAX_REPEAT_SPREAD:g}, or, measured beside the run and not from its times, other programs "
        f"held more than {MAX_OTHER_CORES:g} of the cores it needed on average (`other_cores`, from /proc/stat: "
        "the busy time of its cores less its own, plus steal, beyond the cores its threads left free) or a fixed "
        f"CPU probe timed before and after it ran more than {MAX_PROBE_SLOWDOWN:g}x slower than the quietest probe "
        "of its job (`probe_slowdown`); `unstable_reason` says which. `degenerate`: the run's technique did "
        "not run as itself: FAE at a budget where every timed batch is hot (`all-hot`, the `device` store's run) "
        "or none is (`all-cold`, the `hybrid` store's); its speed-up is that store's. `repeats`: how many times the run "
        "trained its timed part, each time from the same initial state on the same batches (`timing.repeats`); "
        "`samples_per_s` is then the median over repeats, `repeat_spread` the repeats' max/min samples/s, and "
        "the step times pool the steps of all repeats.\n\n"
        + to_markdown(summary[SUMMARY_COLUMNS])
    )


def _counters_markdown(counters: pd.DataFrame) -> str:
    title = "# hotcold counters (per step)\n\n"
    if counters.empty:
        return title + "No counters recorded.\n"
    order = list(dict.fromkeys(counters["counter"]))
    wide = counters.pivot(index=[*RUN_ID, "timer"], columns="counter", values="per_step").reset_index()
    wide = wide[[*RUN_ID, "timer", *order]].sort_values(RUN_ID, kind="stable")
    wide.columns.name = None
    return title + to_markdown(wide, {c: "{:,.1f}" for c in order})


def _scale_part(world: int, ranks_per_node: int) -> str:
    return f"world~{world}-rpn~{ranks_per_node}/" if world > 1 else ""


def infeasible_markdown(summary: pd.DataFrame) -> str:
    """The runs that could not run on their dataset, one line each with the reason."""
    title = "# hotcold infeasible runs\n\n"
    if (summary["status"] == STATUS_OK).all():
        return title + "None: every configured run trained.\n"
    text = title
    for status, lead in ((STATUS_INFEASIBLE, "These variants cannot run on their dataset"),
                         (STATUS_SKIPPED, "Skipped: these peer methods' optional package is not usable here"),
                         (STATUS_DIVERGED, "Diverged: these runs' loss or parameters became non-finite (a learning "
                                           "rate too large for the data?)")):
        rows = summary[summary["status"] == status]
        if rows.empty:
            continue
        lines = [f"- {r.dataset}/{r.method}/{r.variant}/{_scale_part(r.world, r.ranks_per_node)}seed~{r.seed} "
                 f"({r.options or 'no options'}): {r.reason}" for r in rows.itertuples(index=False)]
        text += f"{lead}; they have no numbers in any table.\n\n" + "\n".join(lines) + "\n\n"
    return text.rstrip("\n") + "\n"


def aggregate(records: Sequence[Path], out_dir: Path, exact_rtol: float = EXACT_RTOL) -> pd.DataFrame:
    """Read the given run records, write every table to ``out_dir``, return the summary.

    The summary and ``infeasible.md`` list every run; the other tables hold
    the runs that trained.

    ``records`` are ``<dataset>/<method>/<variant>/seed~<n>/record.json``
    files, and those of scale-out runs under ``<variant>/world~<P>-rpn~<G>/seed~<n>/``
    (the workflow passes the runs its config asks for; by hand, ``find_records``
    lists all under a runs directory). Written: ``summary.csv``/``summary.md``,
    ``phases.csv``, ``counters.csv``/``counters.md`` and the comparison tables of
    ``hotcold.analysis.comparisons`` (``speedup``, ``fae_hot_fraction``, ``rows_moved``),
    and ``infeasible.md``: the runs whose variant could not run on their dataset
    (record status ``infeasible``) with the reason, and the runs of peer methods
    skipped because their optional package is not installed (status ``skipped``;
    the summary says which, above its table). Such runs stay in the summary
    as rows with their ``status`` and ``reason`` and no numbers; every other table
    is built from the ``ok`` runs only.
    """
    out_dir = Path(out_dir)
    loaded = load_records(records)
    summary = summary_frame(loaded, exact_rtol)
    trained, ok = ok_records(loaded), summary[summary["status"] == STATUS_OK].reset_index(drop=True)
    single = one_process(ok).reset_index(drop=True)
    phases = phases_frame(trained)
    counters = counters_frame(trained)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False))
    atomic_write_text(out_dir / "summary.md", _summary_markdown(summary, exact_rtol))
    atomic_write_text(out_dir / "infeasible.md", infeasible_markdown(summary))
    atomic_write_text(out_dir / "phases.csv", phases.to_csv(index=False))
    atomic_write_text(out_dir / "counters.csv", counters.to_csv(index=False))
    atomic_write_text(out_dir / "counters.md", _counters_markdown(counters))
    speedup = speedup_table(single)
    atomic_write_text(out_dir / "speedup.csv", speedup.to_csv(index=False))
    atomic_write_text(out_dir / "speedup.md", speedup_markdown(speedup, code_note(single)))
    atomic_write_text(out_dir / "fae_hot_fraction.csv", fae_table(trained, single).to_csv(index=False))
    atomic_write_text(out_dir / "rows_moved.csv", traffic_table(one_process(counters), single).to_csv(index=False))
    return summary
