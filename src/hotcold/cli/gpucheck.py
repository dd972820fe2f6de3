"""``hotcold gpu-check`` (``make gpu-check``): the CUDA test cases and every one-process method, one table.

The work is ``hotcold.gpucheck``'s; this reads the arguments, first says in
one line which needed package is missing (a lent GPU machine has torch, not
necessarily all of ``make setup``), and prints the table. It exits 1 once the
table is written when a CUDA test case or a run failed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # src/hotcold/cli/gpucheck.py -> the repository


def add_gpu_check(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("gpu-check", help="on a GPU machine: run the CUDA test cases and train every one-process "
                                         "method on small datasets with CUDA events; write one table "
                                         "(without a GPU: the same on the CPU at a tiny scale)")
    g.add_argument("--out", default="results/gpu_check", help="directory for the table, its data and its runs")
    g.add_argument("--config", help="workflow config whose generated datasets and one-process methods are "
                                    "trained, read as `make reproduce CONFIG=` reads it (merged over "
                                    "default.yaml; default: default.yaml itself)")
    g.add_argument("--preset", choices=["full-size-kaggle"],
                   help="full-size-kaggle: paper-scale-cpu.yaml's Kaggle-style dataset at its real table sizes "
                        "(33.8M rows, 4M samples, DLRM's Kaggle model, batch 2048), device hybrid fae lru "
                        "freqcache scratchpipe, 20k evaluation samples, a 360 s budget; options given by hand "
                        "take precedence")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: the GPU when torch sees one, else the CPU fallback (tiny scale)")
    g.add_argument("--scale", choices=["config", "tiny"],
                   help="config: the config's datasets and training (default on a GPU); tiny: seconds on a CPU "
                        "(default on a CPU)")
    g.add_argument("--rows", type=int, help="every generator's samples (overrides the scale's)")
    g.add_argument("--max-rows-per-table", type=int, help="every generator's cap on a table's rows")
    g.add_argument("--steps", type=int, help="training steps of every run (overrides the scale's)")
    g.add_argument("--warmup-steps", type=int, help="untimed first steps (default with --steps: a tenth)")
    g.add_argument("--batch-size", type=int)
    g.add_argument("--eval-samples", type=int, help="test samples evaluated (0: the whole test split)")
    g.add_argument("--pipeline", choices=["auto", "on", "off"],
                   help="train.pipeline of every run (default: the config's, auto: on on a GPU)")
    g.add_argument("--cuda-graphs", choices=["auto", "on", "off"],
                   help="train.cuda_graphs of every run (default: the config's, auto: the dense step as a CUDA "
                        "graph where it captures)")
    g.add_argument("--datasets", nargs="+", help="only these datasets of the config")
    g.add_argument("--methods", nargs="+", help="only these methods (device is kept: the others' reference)")
    g.add_argument("--threads", type=int, help="torch threads of the training (default: the config's threads)")
    g.add_argument("--no-tests", action="store_true", help="skip the CUDA test cases")
    g.add_argument("--no-train", action="store_true", help="run the CUDA test cases only")
    g.add_argument("--calibrate", choices=["auto", "on", "off"], default="auto",
                   help="calibrate this machine before the runs and check the cost model on them (profile.yaml, "
                        "costmodel_validation.md; auto: on a GPU)")
    g.add_argument("--tests-timeout", type=float, default=300.0, help="seconds the test cases may take")
    g.add_argument("--budget", type=float, default=None,
                   help="seconds after which runs not yet started are skipped (default 540: under 10 minutes)")
    g.set_defaults(func=cmd_gpu_check)


def cmd_gpu_check(args: argparse.Namespace) -> None:
    from hotcold.config import ConfigError
    from hotcold.gpucheck.env import missing_message

    message = missing_message()
    if message:
        raise ConfigError(message)
    from hotcold.gpucheck import BUDGET_S, CheckOptions, check
    from hotcold.gpucheck.plan import PRESETS, SCALES

    for name in ("rows", "max_rows_per_table", "steps", "warmup_steps", "batch_size", "threads"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"gpu-check: --{name.replace('_', '-')} must be positive, got {value}")
    if args.eval_samples is not None and args.eval_samples < 0:
        raise ConfigError(f"gpu-check: --eval-samples must be >= 0, got {args.eval_samples}")
    warmup = args.warmup_steps
    if args.steps is not None and warmup is None:
        warmup = max(1, args.steps // 10) if args.steps > 1 else 0
    hand = dict(rows=args.rows, max_rows_per_table=args.max_rows_per_table, steps=args.steps, warmup_steps=warmup,
                batch_size=args.batch_size, eval_samples=args.eval_samples, pipeline=args.pipeline,
                cuda_graphs=args.cuda_graphs)
    preset = PRESETS[args.preset] if args.preset else None
    scale = SCALES[args.scale] if args.scale else preset.scale if preset else None
    if any(v is not None for v in hand.values()):
        if scale is None:  # the device's default scale, known once the device is
            from hotcold.gpucheck import resolve

            scale = SCALES["config" if resolve(args.device)[0] == "cuda" else "tiny"]
        scale = scale.with_(**hand)
    config = args.config or (REPO / preset.config if preset else REPO / "workflows/config/default.yaml")
    budget = args.budget if args.budget is not None else preset.budget_s if preset else BUDGET_S
    result = check(CheckOptions(
        out=Path(args.out), config=Path(config), repo=REPO, device=args.device, scale=scale,
        datasets=args.datasets or (preset.datasets if preset else None),
        methods=args.methods or (preset.methods if preset else None), tests=not args.no_tests,
        train=not args.no_train, tests_timeout_s=args.tests_timeout, budget_s=budget, threads=args.threads,
        calibrate={"auto": None, "on": True, "off": False}[args.calibrate]))
    print(result.paths["md"].read_text())
    print(f"wrote {result.paths['csv']} (and {result.paths['md'].name}, {result.paths['json'].name})",
          file=sys.stderr)
    problems = failures(result)
    if problems:  # the table is written; the exit status says the check found something
        print(f"hotcold gpu-check: {problems}", file=sys.stderr)
        raise SystemExit(1)


def failures(result) -> str | None:
    """What failed: test cases (or the test run itself) and runs; None when nothing did."""
    tests = result.tests
    parts = []
    if tests["failed"] or tests["errors"]:
        parts.append(f"{tests['failed']} failed and {tests['errors']} erroring CUDA test case(s)")
    if tests["status"] in ("timed out", "no report"):
        parts.append(f"the CUDA test cases: {tests['status']}")
    if result.costmodel is not None and result.costmodel.error:
        parts.append(f"the cost model check: {result.costmodel.error}")
    failed = int((result.table["status"] == "failed").sum()) if len(result.table) else 0
    if failed:
        parts.append(f"{failed} failed run(s)")
    return "; ".join(parts) or None
