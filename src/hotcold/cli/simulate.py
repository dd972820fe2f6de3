"""Verbs that simulate without training: ``simulate`` (cache policies on a trace), ``shard-sim``, ``cache-sim``."""
from __future__ import annotations

import argparse
from pathlib import Path

from hotcold.cli.args import load_mapping
from hotcold.config import ShardSimConfig, SimulateConfig

SIMULATE, SHARD_SIM = SimulateConfig(), ShardSimConfig()


def _run_length(text: str) -> int | str:
    return text if text == "epoch" else int(text)


def _run_config(text: str):
    """The run config of a simulation: only its train and model sections matter, so no dataset or method."""
    from hotcold.config import RunConfig

    return RunConfig.from_dict({"dataset": "-", "method": "-", **load_mapping(text)})


def add_simulate(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("simulate", help="placement policies on a dataset's training trace, without training")
    s.add_argument("--dataset", required=True, help="dataset directory")
    s.add_argument("--run-config", default="{}", help="run config whose train section fixes the batch order")
    s.add_argument("--out", required=True, help="CSV to write")
    s.add_argument("--ratios", type=float, nargs="+", default=list(SIMULATE.ratios),
                   help="cache sizes as fractions of all rows")
    s.add_argument("--policies", nargs="+", help="default: every policy")
    s.add_argument("--windows", type=int, nargs="*", default=list(SIMULATE.windows),
                   help="ScratchPipe look-ahead windows, simulated at every size and at their minimum (none: skip)")
    s.add_argument("--fae-budgets", type=float, nargs="*", default=list(SIMULATE.fae_budgets),
                   help="FAE trace model: device budgets as shares of all rows (none: skip)")
    s.add_argument("--fae-run-lengths", type=_run_length, nargs="+", default=list(SIMULATE.fae_run_lengths),
                   help="FAE trace model: batches of one kind between switches (or 'epoch')")
    s.add_argument("--fae-sample-fraction", type=float, default=SIMULATE.fae_sample_fraction,
                   help="FAE trace model: profiled share of the training inputs")
    s.add_argument("--curves-out", help="also write hit-rate curves here (CSV): LRU exact at every size in one pass "
                                        "(written on a log grid), lfu/freqcache from the per-size sweep")
    s.add_argument("--curve-points", type=int, default=256,
                   help="log-spaced cache sizes from 1 row to all rows at which the LRU curve is written")
    s.add_argument("--curve-ratios", type=float, nargs="*", default=[],
                   help="more sizes (shares of all rows) at which to write the LRU curve, e.g. the trained ones")
    s.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> None:
    from hotcold.data.format import Dataset
    from hotcold.files import atomic_write_text
    from hotcold.trace.sweeps import placement_sweep

    cfg = _run_config(args.run_config)
    sim = placement_sweep(Dataset.open(args.dataset), cfg, args.ratios, args.policies, windows=args.windows,
                          fae_budgets=args.fae_budgets, fae_run_lengths=args.fae_run_lengths,
                          fae_sample_fraction=args.fae_sample_fraction)
    atomic_write_text(Path(args.out), sim.frame.to_csv(index=False))
    print(f"wrote {args.out}: {len(sim.frame)} policy x size rows over {sim.steps} batches")
    if args.curves_out:
        from hotcold.trace.curves import hit_rate_curves

        curves = hit_rate_curves(sim, args.curve_points, args.curve_ratios, args.policies)
        atomic_write_text(Path(args.curves_out), curves.frame.to_csv(index=False))
        print(curves.report)
        print(f"wrote {args.curves_out}: {len(curves.frame)} policy x size rows")


def add_shard_sim(sub: argparse._SubParsersAction) -> None:
    ss = sub.add_parser("shard-sim", help="all-to-all and all-reduce bytes of sharding plans at any scale, "
                                          "without training")
    ss.add_argument("--dataset", required=True, help="dataset directory")
    ss.add_argument("--run-config", default="{}", help="run config: train (batch order), model (dim, dense size)")
    ss.add_argument("--out", required=True, help="CSV to write")
    ss.add_argument("--plans", nargs="+", default=list(SHARD_SIM.plans), help="sharding plans")
    ss.add_argument("--scales", nargs="+", default=list(SHARD_SIM.scales), help="NODESxRANKS_PER_NODE, e.g. 16x8")
    ss.add_argument("--headrooms", type=float, nargs="+", default=list(SHARD_SIM.headrooms),
                    help="per-rank memory budgets, as multiples of the row-wise shard")
    ss.set_defaults(func=cmd_shard_sim)


def cmd_shard_sim(args: argparse.Namespace) -> None:
    import pandas as pd

    from hotcold.data.format import Dataset
    from hotcold.distributed.shardsim import Scale, shard_sim
    from hotcold.files import atomic_write_text

    cfg = _run_config(args.run_config)
    scales = [Scale.parse(s) for s in args.scales]
    rows = shard_sim(Dataset.open(args.dataset), cfg, args.plans, scales, args.headrooms)
    frame = pd.DataFrame(rows)
    atomic_write_text(Path(args.out), frame.to_csv(index=False))
    print(f"wrote {args.out}: {len(frame)} plan x scale x headroom rows over {cfg.train.steps} batches")


def add_cache_sim(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("cache-sim", help="cache_sim.csv: the simulate CSVs of every dataset in one table")
    c.add_argument("sims", nargs="+", help="CSVs written by `hotcold simulate`")
    c.add_argument("--out", default="results/tables/cache_sim.csv")
    c.set_defaults(func=cmd_cache_sim)


def cmd_cache_sim(args: argparse.Namespace) -> None:
    from hotcold.analysis.comparisons import cache_sim_table
    from hotcold.files import atomic_write_text

    frame = cache_sim_table([Path(p) for p in args.sims])
    atomic_write_text(Path(args.out), frame.to_csv(index=False))
    print(f"wrote {args.out}: {len(frame)} rows from {len(args.sims)} simulation(s)")
