"""Verbs that train: ``train`` (one run, over ranks if its config says so), ``train-group`` (runs interleaved),
and ``infeasible`` (the records of runs that cannot run on this device or data, without training).

The work is ``hotcold.runs.runner``'s; these read the arguments and say where the
records went.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hotcold.cli.args import load_mapping, load_runs


def add_train(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train one method on one dataset and write its run record")
    t.add_argument("--dataset", required=True, help="dataset directory (with manifest.json)")
    t.add_argument("--run-config", required=True, help="run config: JSON object or a YAML/JSON file")
    t.add_argument("--out", required=True, help="run directory for record.json and steps.parquet")
    t.add_argument("--threads", type=int, default=1, help="threads of the job, shared by its ranks")
    t.add_argument("--nproc", type=int, help="ranks to launch with torchrun (default: the config's distributed.world)")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override timing.device")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> None:
    from hotcold.run_config import RunConfig
    from hotcold.runs.runner import outcome, train_run

    record = train_run(RunConfig.from_dict(load_mapping(args.run_config)), args.dataset, args.out,
                       threads=args.threads, nproc=args.nproc, device=args.device, progress=not args.no_progress)
    if record is not None:
        print(f"wrote {Path(args.out) / 'record.json'} ({record['provenance']['device']}): {outcome(record)}",
              file=sys.stderr)


def add_train_group(sub: argparse._SubParsersAction) -> None:
    tg = sub.add_parser("train-group", help="train several runs of one dataset interleaved by repeat (repeat 1 of "
                                            "each, then repeat 2 of each, ...) and write their records: one-process "
                                            "runs, or scale-out runs of one world over one launch of their ranks")
    tg.add_argument("--dataset", required=True, help="dataset directory (with manifest.json)")
    tg.add_argument("--runs", required=True,
                    help='[{"run_config": {...}, "out": RUN_DIR}, ...]: a JSON list, or a JSON/YAML file holding it')
    tg.add_argument("--threads", type=int, default=1, help="threads of the job, shared by its ranks")
    tg.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override timing.device")
    tg.add_argument("--no-progress", action="store_true")
    tg.set_defaults(func=cmd_train_group)


def cmd_train_group(args: argparse.Namespace) -> None:
    from hotcold.runs.runner import outcome, train_group

    for job, record in train_group(load_runs(args.runs), args.dataset, threads=args.threads, device=args.device,
                                   progress=not args.no_progress):
        if record is not None:  # None: a launch's rank 0 wrote it (and said so)
            print(f"wrote {job.out_dir / 'record.json'}: {outcome(record)}", file=sys.stderr)


def add_infeasible(sub: argparse._SubParsersAction) -> None:
    inf = sub.add_parser("infeasible", help="write the infeasible records of runs whose options cannot run on this "
                                            "trainer device (a GPU-only variant on a CPU) or whose scale-out global "
                                            "batch is more than the training split, without training")
    inf.add_argument("--runs", required=True,
                     help='[{"run_config": {...}, "out": RUN_DIR}, ...]: a JSON list, or a JSON/YAML file holding it')
    inf.add_argument("--data", default="results/data", help="datasets directory (each run's dataset lies in it)")
    inf.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override each run's timing.device")
    inf.set_defaults(func=cmd_infeasible)


def cmd_infeasible(args: argparse.Namespace) -> None:
    from hotcold.runs.runner import write_infeasible_runs

    for out, reason in write_infeasible_runs(load_runs(args.runs), args.data, args.device):
        print(f"wrote {out / 'record.json'}: infeasible: {reason}", file=sys.stderr)
