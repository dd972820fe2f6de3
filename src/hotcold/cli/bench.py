"""Verbs that measure this machine: ``calibrate`` (a hardware profile for the cost model) and ``bench``."""
from __future__ import annotations

import argparse
from pathlib import Path

from hotcold.config import ROW_OPTIMIZERS, TrainConfig

TRAIN = TrainConfig()


def add_calibrate(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser("calibrate", help="measure this machine's rates with micro-benchmarks; write a "
                                           "hardware profile for the cost model")
    cal.add_argument("--out", required=True, help="profile YAML to write")
    cal.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                     help="auto: the GPU when there is one, as the training jobs")
    cal.add_argument("--dim", type=int, default=16, help="embedding dimension of the row benchmarks")
    cal.add_argument("--batch-size", type=int, default=TRAIN.batch_size)
    cal.add_argument("--repeats", type=int, default=15, help="repeats per benchmark (the median is kept)")
    cal.add_argument("--threads", type=int, default=1, help="torch threads, as the training jobs'")
    cal.add_argument("--name", help="the profile's name (default: calibrated-<device>)")
    cal.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> None:
    from hotcold.calibrate.profile import calibrate, write_profile
    from hotcold.devices import resolve_device

    profile = calibrate(resolve_device(args.device).type, dim=args.dim, batch_size=args.batch_size,
                        repeats=args.repeats, name=args.name, threads=args.threads)
    write_profile(profile, Path(args.out))
    print(f"wrote {args.out}: {len(profile['rates'])} rates of {profile['description']}")


def add_bench(sub: argparse._SubParsersAction) -> None:
    be = sub.add_parser("bench", help="benchmarks: `bench embedding` times the core embedding step against "
                                      "FBGEMM's TBE and measures gather bandwidth; `bench step` counts and times "
                                      "one training step per method at the Kaggle DLRM shape, step pipeline off "
                                      "and on; `bench shard-sim --dataset D` prints shard-sim's lookups/s and "
                                      "peak memory")
    be.add_argument("what", choices=["embedding", "step", "shard-sim"])
    be.add_argument("--threads", type=int, default=1, help="torch threads")
    be.add_argument("--batch", type=int, default=2048, help="samples per batch")
    be.add_argument("--dim", type=int, default=16, help="embedding dimension")
    be.add_argument("--cap", type=int, default=200_000, help="rows per table at most (Criteo Kaggle's 26 tables)")
    be.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the ids")
    be.add_argument("--steps", type=int, help="timed steps of each side per repeat (embedding: 40; step: 30 "
                                               "per run)")
    be.add_argument("--repeats", type=int, help="interleaved repeats, medians reported (embedding: 7; step: 3 "
                                                "runs of each pipeline setting)")
    be.add_argument("--check-steps", type=int, default=20, help="steps of the weight-agreement check (0: skip)")
    be.add_argument("--device", choices=["cpu", "cuda", "meta"], default="cpu",
                    help="where the step runs; meta (step only): the host's work of a GPU step alone")
    st = be.add_argument_group("step")
    st.add_argument("--methods", nargs="+", help="step: methods to run (default: device hybrid fae lru lfu "
                                                 "freqcache scratchpipe, at their headline settings)")
    st.add_argument("--warmup", type=int, default=5, help="step: untimed steps before the timed ones")
    be.add_argument("--optimizers", nargs="+", choices=list(ROW_OPTIMIZERS), default=["sgd", "adagrad"])
    be.add_argument("--no-fused", action="store_true",
                    help="run the harness's backward + update as torch operations (sparse_step), not as one kernel")
    be.add_argument("--out", help="write the result as JSON (.json) or CSV (.csv)")
    ss = be.add_argument_group("shard-sim")
    ss.add_argument("--dataset", help="shard-sim: dataset directory; step: a Kaggle-style `hotcold generate` "
                                      "output instead of one generated with tables capped at --cap rows")
    ss.add_argument("--scale", default="16x8", help="shard-sim: NODESxRANKS_PER_NODE")
    ss.add_argument("--plans", nargs="+", default=["row", "balanced", "flexshard"], help="shard-sim: plans")
    ss.add_argument("--headrooms", type=float, nargs="+", default=[1.25], help="shard-sim: memory headrooms")
    ss.add_argument("--batch-per-rank", type=int, default=512, help="shard-sim: samples per rank per batch")
    ss.add_argument("--batches", type=int, default=20, help="shard-sim: batches streamed")
    ss.add_argument("--reference-batches", type=int, default=2,
                    help="shard-sim: batches of the plain per-step path, for comparison (0: skip)")
    ss.add_argument("--stream-repeats", type=int, default=3, help="shard-sim: timed passes of each stream (median)")
    be.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> None:
    if args.what == "shard-sim":
        return cmd_bench_shard_sim(args)
    if args.what == "step":
        return cmd_bench_step(args)
    from hotcold.bench.embedding import BenchConfig, render, run, write

    result = run(BenchConfig(threads=args.threads, batch=args.batch, dim=args.dim, cap=args.cap, zipf=args.zipf,
                             steps=_given(args.steps, 40), repeats=_given(args.repeats, 7),
                             check_steps=args.check_steps, device=args.device, optimizers=tuple(args.optimizers),
                             fused=not args.no_fused))
    print(render(result))
    if args.out:
        write(result, Path(args.out))
        print(f"wrote {args.out}")


def _given(value: int | None, default: int) -> int:
    """An option's value, or the verb's own default where it was not given."""
    return default if value is None else value


def cmd_bench_step(args: argparse.Namespace) -> None:
    import json

    from hotcold.bench.step import VARIANTS, StepBenchConfig, render, run
    from hotcold.files import atomic_write_text

    result = run(StepBenchConfig(methods=tuple(args.methods or VARIANTS), batch=args.batch,
                                 steps=_given(args.steps, 30), warmup=args.warmup, repeats=_given(args.repeats, 3),
                                 threads=args.threads, device=args.device, cap=args.cap, dataset=args.dataset))
    print(render(result))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))
        print(f"wrote {args.out}")


def cmd_bench_shard_sim(args: argparse.Namespace) -> None:
    import json

    from hotcold.config import ConfigError
    from hotcold.data.format import Dataset
    from hotcold.bench.shardsim import ShardSimBenchConfig, render, run_bench
    from hotcold.files import atomic_write_text

    if not args.dataset:
        raise ConfigError("bench shard-sim: --dataset is required")
    result = run_bench(Dataset.open(args.dataset), ShardSimBenchConfig(
        scale=args.scale, plans=tuple(args.plans), headrooms=tuple(args.headrooms),
        batch_per_rank=args.batch_per_rank, batches=args.batches, reference_batches=args.reference_batches,
        repeats=args.stream_repeats))
    print(render(result))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))
        print(f"wrote {args.out}")
