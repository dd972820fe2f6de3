"""Verbs that simulate without training: ``simulate`` (cache policies on a trace), ``shard-sim``, ``cache-sim``."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from hotcold.cli.args import load_mapping
from hotcold.config import ShardSimConfig, SimulateConfig

if TYPE_CHECKING:
    from hotcold.data.format import Dataset
    from hotcold.distributed.shardsim import Scale

SIMULATE, SHARD_SIM = SimulateConfig(), ShardSimConfig()


def _run_length(text: str) -> int | str:
    return text if text == "epoch" else int(text)


def _run_config(text: str):
    """The run config of a simulation: only its train and model sections matter, so no dataset or method."""
    from hotcold.run_config import RunConfig

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
    ss.add_argument("--run-config", default="{}", help="run config: train (batch order), model (dim, dense size), distributed "
                    "(wire_dtype, exact: what the collectives send and are priced as)")
    ss.add_argument("--out", required=True, help="CSV to write")
    ss.add_argument("--plans", nargs="+", default=list(SHARD_SIM.plans), help="sharding plans")
    ss.add_argument("--scales", nargs="+", default=list(SHARD_SIM.scales), help="NODESxRANKS_PER_NODE, e.g. 16x8")
    ss.add_argument("--headrooms", type=float, nargs="+", default=list(SHARD_SIM.headrooms),
                    help="per-rank memory budgets, as multiples of the row-wise shard")
    ss.add_argument("--batch-per-rank", type=_per_rank, default=SHARD_SIM.batch_per_rank,
                    help="samples per rank per step: each scale's global batch is this x its world (weak scaling; "
                         f"default {SHARD_SIM.batch_per_rank}); 'none': the run config's train.batch_size at every "
                         "scale")
    ss.add_argument("--fixed-batch", action=argparse.BooleanOptionalAction, default=SHARD_SIM.fixed_batch,
                    help="also simulate at the run config's fixed global batch train.batch_size where it differs "
                         "(rows say which: batching per-rank or global)")
    ss.add_argument("--rw-protocol", choices=["lookup", "reduce_scatter"], default="lookup",
                    help="the row plan's output protocol: each lookup's vector by all-to-all (lookup), or TorchRec's "
                         "pooled row-wise, partial sums reduce-scattered and per-sample lengths sent (reduce_scatter)")
    ss.add_argument("--no-progress", action="store_true")
    ss.set_defaults(func=cmd_shard_sim)


def _per_rank(text: str) -> int | None:
    if text.lower() in ("none", "null"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--batch-per-rank must be a positive integer or 'none', got {text!r}")
    return value


def cmd_shard_sim(args: argparse.Namespace) -> None:
    import pandas as pd

    from hotcold.data.format import Dataset
    from hotcold.distributed.shardsim import Scale, shard_sim
    from hotcold.files import atomic_write_text

    cfg = _run_config(args.run_config)
    ds = Dataset.open(args.dataset)
    scales = [Scale.parse(s) for s in args.scales]
    rows = []
    for batching, per_rank, part in _sweeps(ds, cfg.train.batch_size, scales, args.batch_per_rank, args.fixed_batch):
        rows += [{**row, "batching": batching} for row in shard_sim(ds, cfg, args.plans, part, args.headrooms,
                                                                   batch_per_rank=per_rank,
                                                                   progress=not args.no_progress,
                                                                   rw_protocol=args.rw_protocol)]
    frame = pd.DataFrame(rows)
    atomic_write_text(Path(args.out), frame.to_csv(index=False))
    batches = [f"{args.batch_per_rank} samples per rank"] if args.batch_per_rank is not None else []
    if args.batch_per_rank is None or args.fixed_batch:
        batches.append(f"the fixed global batch {cfg.train.batch_size:,}")
    print(f"wrote {args.out}: {len(frame)} plan x scale x headroom rows over {cfg.train.steps} batches at "
          f"{' and '.join(batches)}")


def _sweeps(ds: Dataset, fixed: int, scales: list[Scale], batch_per_rank: int | None,
            fixed_too: bool) -> list[tuple[str, int | None, list[Scale]]]:
    """(batching, ``shard_sim``'s batch_per_rank, scales) of each simulation, every global batch checked first."""
    from hotcold.config import ConfigError
    from hotcold.distributed.batch import check_batch_fits, sweep_batches

    worlds = [s.nodes * s.ranks_per_node for s in scales]
    out = []
    for batching, per_rank, which in sweep_batches(worlds, fixed, batch_per_rank, fixed_too):
        for i in which:
            name = f"{scales[i].nodes}x{scales[i].ranks_per_node}"
            if per_rank is None:
                if fixed % worlds[i]:
                    raise ConfigError(f"train.batch_size {fixed} (the fixed global batch) is not divisible by "
                                      f"{worlds[i]} ranks ({name}); leave out --fixed-batch (the config's "
                                      f"distributed.shard_sim.fixed_batch) or that scale")
                check_batch_fits(fixed, ds, "train.batch_size (the fixed global batch)")
            else:
                check_batch_fits(per_rank * worlds[i], ds, f"--batch-per-rank (distributed.shard_sim.batch_per_rank) "
                                                     f"{per_rank} x {worlds[i]} ranks ({name})")
        out.append((batching, per_rank, [scales[i] for i in which]))
    return out


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


def add_torchrec_peer(sub: argparse._SubParsersAction) -> None:
    tp = sub.add_parser("torchrec-peer", help="TorchRec's own plan and collectives on P gloo ranks: the bytes it "
                                              "sends for shard-sim's batches (optional peer)")
    tp.add_argument("--dataset", required=True, help="dataset directory (DLRM-style: no histories)")
    tp.add_argument("--run-config", default="{}", help="run config: train (batch order, steps), model (dim)")
    tp.add_argument("--out", required=True, help="JSON to write: TorchRec's plan and bytes per collective")
    tp.add_argument("--nproc", type=int, default=2, help="ranks to launch with torchrun")
    tp.add_argument("--ranks-per-node", type=int, default=1, help="ranks per node TorchRec's planner is told")
    tp.add_argument("--batch-per-rank", type=int, default=512, help="samples per rank per step")
    tp.add_argument("--sharding", default="auto", help="TorchRec sharding type forced on every table, or 'auto' "
                                                       "(its planner's plan)")
    tp.set_defaults(func=cmd_torchrec_peer)


def cmd_torchrec_peer(args: argparse.Namespace) -> None:
    from hotcold.config import ConfigError
    from hotcold.distributed.comm import launched
    from hotcold.distributed.launch import launch_ranks
    from hotcold.distributed.torchrec_peer import SHARDINGS, available, run_rank, write_result

    if args.sharding not in SHARDINGS:
        raise ConfigError(f"--sharding must be one of {', '.join(SHARDINGS)}, got {args.sharding!r}")
    for flag, value in (("--nproc", args.nproc), ("--ranks-per-node", args.ranks_per_node),
                        ("--batch-per-rank", args.batch_per_rank)):
        if value < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {value}")
    if args.nproc % args.ranks_per_node:
        raise ConfigError(f"--nproc {args.nproc} is not a multiple of --ranks-per-node {args.ranks_per_node}")
    cfg = _run_config(args.run_config)         # bad options fail here, before any rank starts
    reason = available()
    if reason is not None:
        raise ConfigError(f"torchrec-peer: {reason}; install the peers (envs/peers-nodeps.txt)")
    if not launched():
        status = launch_ranks(args.nproc, ["torchrec-peer", *_peer_args(args)])
        if status != 0:
            raise OSError(f"torchrec-peer: a rank failed (torchrun exit status {status})")
        print(f"wrote {args.out}")
        return
    result = run_rank(args.dataset, cfg, args.sharding, args.batch_per_rank,
                      args.ranks_per_node)
    if result is not None:
        write_result(result, Path(args.out))


def _peer_args(args: argparse.Namespace) -> list[str]:
    """The ranks' arguments (not ``--nproc``: torchrun would take it for its own ``--nproc-per-node``)."""
    return ["--dataset", args.dataset, "--run-config", args.run_config, "--out", args.out, "--ranks-per-node",
            str(args.ranks_per_node), "--batch-per-rank", str(args.batch_per_rank), "--sharding", args.sharding]
