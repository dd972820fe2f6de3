"""The markdown of ``aggregate``'s tables: the summary with the notes at its top, the counters, the infeasible runs.

The notes say where a table's runs come from several code versions
(``code_note``) or machines (``machines_note``), and which peer runs were
skipped for a missing package (``skipped_note``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from hotcold.analysis.markdown import to_markdown
from hotcold.analysis.run_records import RUN_ID
from hotcold.analysis.summary import BASELINE_METHOD, REFERENCE_METHOD, SUMMARY_COLUMNS
from hotcold.contention import MAX_OTHER_CORES, MAX_PROBE_SLOWDOWN
from hotcold.record_status import STATUS_DIVERGED, STATUS_INFEASIBLE, STATUS_OK, STATUS_SKIPPED
from hotcold.timing import MAX_REPEAT_SPREAD


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
        "`param_rel_diff` and no `exact` (docs/scale-out.md, \"What is sent\"); a run with "
        "`distributed.reference: none` trained no replay: no `exact`, and `exact_reference` says \"not checked\". "
        "`stable`: no when the run's step times spread beyond p90/p10 = 3 or, for a one-process CPU run, its "
        "process got less than half of wall time x "
        "threads of CPU time (other programs held the cores), or its repeats' samples/s spread beyond "
        f"max/min = {MAX_REPEAT_SPREAD:g}, or, measured beside the run and not from its times, other programs "
        f"held more than {MAX_OTHER_CORES:g} of the cores it needed on average (`other_cores`, from /proc/stat: "
        "the busy time of its cores less its own, plus steal, beyond the cores its threads left free) or a fixed "
        f"CPU probe timed before and after it ran more than {MAX_PROBE_SLOWDOWN:g}x slower than the quietest probe "
        "of its job (`probe_slowdown`); `unstable_reason` says which. `degenerate`: the run's technique did "
        "not run as itself: FAE at a budget where every timed batch is hot (`all-hot`, the `device` store's run) "
        "or none is (`all-cold`, the `hybrid` store's); its speed-up is that store's. `repeats`: how many times "
        "the run trained its timed part, each time from the same initial state on the same batches (`timing.repeats`); "
        "`samples_per_s` is then the median over repeats, `repeat_spread` the repeats' max/min samples/s, and "
        "the step times pool the steps of all repeats. `timed_with`: the runs its job trained interleaved by "
        "repeat, itself included (1: trained alone, as a run named on Snakemake's command line is; its times "
        "are from another period of the machine than those of the runs it is compared with).\n\n"
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
