"""The comparison tables: speed-up per method, cache hit rates, FAE's hot inputs, traffic.

One function per table (``speedup_table``, ``cache_sim_table``,
``fae_table``, ``traffic_table``), each from the summary, the records, the
counters or the ``hotcold simulate`` CSVs; its docstring says what a row
holds, and docs/outputs.md what each table's columns mean.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from hotcold.analysis.markdown import to_markdown
from hotcold.options.stores import FAEOptions

RUN_KEYS = ["dataset", "method", "variant", "seed"]
SPEEDUP_KEYS = ["dataset", "timer", "method", "variant"]
SIM_REQUIRED = ("dataset", "policy", "capacity", "cache_ratio", "feasible", "hit_rate")


def _all_true(values: pd.Series) -> Any:
    """True if every known value is True, False if any is False, NA if none is known."""
    known = values.dropna()
    return pd.NA if known.empty else bool(known.astype(bool).all())


def speedup_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean (and sd) over seeds per dataset, timer kind, method and variant.

    Of the summary: samples/s, speed-up over ``hybrid`` (same timer kind
    only), AUC and its difference to ``hybrid``, and whether every seed was
    exact.
    """
    cols = [*SPEEDUP_KEYS, "options", "seeds", "samples_per_s", "samples_per_s_sd", "speedup_vs_hybrid",
            "speedup_sd", "auc", "auc_vs_hybrid", "exact", "stable"]
    if summary.empty:
        return pd.DataFrame(columns=cols)
    frame = summary.assign(timer=summary["timer"].fillna("unknown"), options=summary["options"].fillna(""))
    out = frame.groupby(SPEEDUP_KEYS, sort=True).agg(
        options=("options", "first"),
        seeds=("seed", "nunique"),
        samples_per_s=("samples_per_s", "mean"),
        samples_per_s_sd=("samples_per_s", "std"),
        speedup_vs_hybrid=("speedup_vs_hybrid", "mean"),
        speedup_sd=("speedup_vs_hybrid", "std"),
        auc=("auc", "mean"),
        auc_vs_hybrid=("auc_vs_hybrid", "mean"),
        exact=("exact", _all_true),
        stable=("stable", _all_true),
    ).reset_index()
    out["exact"] = out["exact"].astype("boolean")
    out["stable"] = _with_baseline(out, out["stable"].astype("boolean"))
    return out[cols]


def _with_baseline(out: pd.DataFrame, stable: pd.Series) -> pd.Series:
    """A speed-up is stable only when the baseline's runs it divides by were stable too (``hybrid``/``base``,
    the summary's baseline; without one, the run's own judgement stands)."""
    base = out[(out["method"] == "hybrid") & (out["variant"] == "base")]
    base_stable = dict(zip(zip(base["dataset"], base["timer"]), stable[base.index]))
    baseline = pd.Series([base_stable.get(k, pd.NA) for k in zip(out["dataset"], out["timer"])], index=out.index,
                         dtype="boolean")
    return stable & baseline.fillna(True)


def speedup_markdown(speedup: pd.DataFrame, note: str = "") -> str:
    """``note``: a warning for the top (runs of several code versions)."""
    return (
        "# hotcold speed-up over hybrid\n\n"
        + note +
        "Mean over seeds (sd where there are several). `speedup_vs_hybrid` is samples/s over the "
        "`hybrid` run of the same dataset, seed and timer kind; `auc_vs_hybrid` is AUC minus the "
        "`hybrid` run's; `exact` holds when every seed matched its reference parameters; `stable` when no seed's "
        "run was disturbed (see `unstable_reason` in summary.csv): an unstable run's speed-up is not to be "
        "trusted.\n\n"
        + to_markdown(speedup)
    )


def cache_sim_table(paths: Sequence[Path]) -> pd.DataFrame:
    """The simulation CSVs of ``hotcold simulate`` in one frame, sorted by dataset, policy and size.

    One CSV per dataset: hit rate per policy and cache size, ColossalAI's curve.
    """
    if not paths:
        raise FileNotFoundError("no simulation CSVs given; run `hotcold simulate` first")
    frames = []
    for path in paths:
        frame = pd.read_csv(path)
        missing = [c for c in SIM_REQUIRED if c not in frame.columns]
        if missing:
            raise ValueError(f"{path}: not a `hotcold simulate` table (lacks column(s) {missing})")
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["dataset", "policy", "capacity"], kind="stable").reset_index(drop=True)


def _summary_columns(summary: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return summary[[*RUN_KEYS, *columns]]


def fae_table(records: list[dict[str, Any]], summary: pd.DataFrame) -> pd.DataFrame:
    """One row per run whose store report has ``hot_fraction`` (FAE), sorted by dataset and hot rows.

    ``budget_*``: the configured budget; ``hot_*``: the hot rows FAE put on
    the device (count, share of all rows, bytes with optimizer state);
    ``hot_fraction``: share of training inputs whose lookups are all hot;
    ``hot_batch_share``: share of timed steps that ran as hot batches;
    ``epoch_hot_share``: share of the epoch's batches that are hot (the
    timed steps are a scaled epoch: ``hotcold.policies.fae_schedule``);
    ``switches_per_step`` and ``sync_bytes_per_step``: hot-set syncs and
    their bytes, apart from the cold batches' ``activation_bytes_per_step``;
    ``epoch_switches_per_step``: the epoch's; ``degenerate``: ``all-hot`` or
    ``all-cold`` where FAE ran as the ``device`` or the ``hybrid`` store.
    """
    own = ["budget_ratio", "budget_bytes", "hot_rows", "hot_ratio", "hot_bytes", "hot_fraction", "hot_batch_share",
           "epoch_hot_share", "switches_per_step", "epoch_switches_per_step", "sync_bytes_per_step",
           "activation_bytes_per_step"]
    joined = ["options", "samples_per_s", "speedup_vs_hybrid", "auc", "auc_vs_hybrid", "exact", "degenerate"]
    rows = []
    for rec in records:
        store = rec.get("store") or {}
        if store.get("hot_fraction") is None:
            continue
        options = FAEOptions.parse((rec.get("config") or {}).get("store"), f"{rec['method']} options")
        counters = rec["summary"].get("counters_per_step") or {}
        rows.append({
            **{k: rec[k] for k in RUN_KEYS},
            "budget_ratio": options.budget_ratio, "budget_bytes": options.budget_bytes,
            **{k: store.get(k) for k in ("hot_rows", "hot_ratio", "hot_bytes", "hot_fraction")},
            "hot_batch_share": counters.get("hot_batch"),
            "epoch_hot_share": store.get("epoch_hot_share"),   # absent in records from before the scaled epoch
            "switches_per_step": counters.get("switches"),
            "epoch_switches_per_step": store.get("epoch_switches_per_step"),
            "sync_bytes_per_step": counters.get("sync_bytes"),
            "activation_bytes_per_step": (counters["vector_bytes_h2d"] + counters["grad_bytes_d2h"]
                                          if "vector_bytes_h2d" in counters else None),
        })
    fae = pd.DataFrame(rows, columns=[*RUN_KEYS, *own])
    fae["seed"] = fae["seed"].astype("int64")
    fae[own] = fae[own].apply(pd.to_numeric, errors="coerce").astype("float64")
    out = fae.merge(_summary_columns(summary, joined), on=RUN_KEYS, how="left")
    out = out[[*RUN_KEYS, "options", *own, *joined[1:]]]
    return out.sort_values(["dataset", "hot_ratio", "method", "variant", "seed"], kind="stable").reset_index(drop=True)


TRAFFIC_COUNTERS = ["lookups", "unique_rows", "hits", "param_bytes_h2d", "param_bytes_d2h", "vector_bytes_h2d",
                    "grad_bytes_d2h", "sync_bytes", "switches", "evictions"]


def traffic_table(counters: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Bytes moved per training step, one row per run (counters, hardware-independent).

    Parameter traffic (rows with optimizer state: cache fills and
    write-backs, scratchpad fetches, FAE's hot-set syncs, of which
    ``sync_bytes``) and activation traffic (looked-up vectors to the device,
    gradients back) are kept apart; ``bytes_moved`` adds all four
    directions, ``bytes_per_lookup`` divides by the step's lookups.
    ``switches`` is FAE's kind switches per step.
    """
    cols = [*RUN_KEYS, "options", *TRAFFIC_COUNTERS, "hit_rate", "param_bytes", "activation_bytes", "bytes_moved",
            "bytes_per_lookup"]
    if counters.empty:
        return pd.DataFrame(columns=cols)
    wide = counters.pivot_table(index=RUN_KEYS, columns="counter", values="per_step", aggfunc="first")
    wide = wide.reindex(columns=TRAFFIC_COUNTERS).reset_index()
    wide.columns.name = None
    lookups = wide["lookups"].where(wide["lookups"] > 0)
    wide["hit_rate"] = wide["hits"] / lookups
    wide["param_bytes"] = wide["param_bytes_h2d"] + wide["param_bytes_d2h"]
    wide["activation_bytes"] = wide["vector_bytes_h2d"] + wide["grad_bytes_d2h"]
    wide["bytes_moved"] = wide["param_bytes"] + wide["activation_bytes"]
    wide["bytes_per_lookup"] = wide["bytes_moved"] / lookups
    out = wide.merge(_summary_columns(summary, ["options"]), on=RUN_KEYS, how="left")[cols]
    return out.sort_values(RUN_KEYS, kind="stable").reset_index(drop=True)
