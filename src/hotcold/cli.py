"""``hotcold <verb>``: every workflow rule runs one verb; each also runs by hand."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hotcold.config import AggregateConfig, ConfigError, ProfileConfig, ShardSimConfig, SimulateConfig, TrainConfig

PROFILE, SIMULATE, AGGREGATE, TRAIN = ProfileConfig(), SimulateConfig(), AggregateConfig(), TrainConfig()
SHARD_SIM = ShardSimConfig()


def _load_json_or_file(text: str, opening: str, what: str) -> Any:
    """JSON given inline (``text`` starts with ``opening``), or the path of a JSON/YAML file holding it."""
    if text.lstrip().startswith(opening):
        return json.loads(text)
    path = Path(text)
    if not path.is_file():
        raise ConfigError(f"{text!r} is neither {what} nor an existing file")
    import yaml

    return yaml.safe_load(path.read_text())


def _load_mapping(text: str) -> dict[str, Any]:
    """A JSON object given inline, or the path of a JSON/YAML file holding one."""
    data = _load_json_or_file(text, "{", "a JSON object")
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping (JSON object)")
    return data


def cmd_generate(args: argparse.Namespace) -> None:
    from hotcold.data.generators import GeneratorConfig, generate

    cfg = GeneratorConfig.from_dict(_load_mapping(args.spec))
    manifest = generate(cfg, Path(args.out), progress=not args.no_progress)
    print(f"wrote {args.out}: {manifest['rows']} rows, {len(manifest['cardinalities'])} tables")


def cmd_download(args: argparse.Namespace) -> None:
    from hotcold.data.sources.prepare import SourceConfig, fetch

    record = fetch(SourceConfig.from_dict(_load_mapping(args.spec)), Path(args.out), name=args.name,
                   progress=not args.no_progress)
    print(f"fetched {len(record['files'])} file(s) into {args.out}")


def cmd_preprocess(args: argparse.Namespace) -> None:
    from hotcold.data.sources.prepare import SourceConfig, preprocess

    manifest = preprocess(SourceConfig.from_dict(_load_mapping(args.spec)), Path(args.raw), Path(args.out),
                          name=args.name, progress=not args.no_progress)
    print(f"wrote {args.out}: {manifest['rows']} rows, {len(manifest['cardinalities'])} tables")


def cmd_profile(args: argparse.Namespace) -> None:
    from hotcold.data.format import Dataset
    from hotcold.trace.profile import profile_dataset, save_profile

    prof = profile_dataset(Dataset.open(args.dataset), sample_fraction=args.sample_fraction,
                           batch_size=args.batch_size, window=args.window, batches=args.batches, seed=args.seed)
    save_profile(prof, Path(args.out))
    print(f"wrote profile of {args.dataset} into {args.out}")


def cmd_dataset_stats(args: argparse.Namespace) -> None:
    from hotcold.trace.profile import coverage_figure, dataset_stats, write_dataset_stats

    dirs = [Path(p) for p in args.profiles]
    write_dataset_stats(dataset_stats(dirs), Path(args.out))
    for path in [Path(args.out), *coverage_figure(dirs, Path(args.figures))]:
        print(f"wrote {path}")


def cmd_train(args: argparse.Namespace) -> None:
    import dataclasses

    import torch

    from hotcold.config import RunConfig
    from hotcold.distributed.comm import launched
    from hotcold import methods
    from hotcold.repeats import run_and_record
    from hotcold.train import resolve_device

    cfg = RunConfig.from_dict(_load_mapping(args.run_config))
    if args.device:
        cfg = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, device=args.device))
    if args.nproc is not None:
        cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, world=args.nproc))
        cfg.distributed.validate("--nproc")
    world_size = cfg.distributed.world
    if world_size > 1 and not methods.get(cfg.method).spans_ranks:
        raise ConfigError(f"method {cfg.method!r} runs in one process; over {world_size} ranks use "
                          f"{', '.join(methods.names(spans_ranks=True))}")
    if world_size > 1 and not launched():
        _launch_train(args, cfg)
        return
    world = None
    device = resolve_device(cfg.timing.device)
    if launched():
        from hotcold.distributed.world import World

        world = World.join(cfg.distributed.ranks_per_node, world_size, device)
    torch.set_num_threads(max(1, args.threads // world_size))
    if world is None or world.is_main:
        print(f"run {cfg.dataset}/{cfg.method}/{cfg.variant}/seed~{cfg.seed} ({args.threads} threads, "
              f"{world_size} rank(s))", file=sys.stderr)
    try:
        record = run_and_record(cfg, Path(args.dataset), Path(args.out), progress=not args.no_progress,
                                world=world, device=device)
    finally:
        if world is not None:
            world.close()
    if record is not None:
        print(f"wrote {Path(args.out) / 'record.json'} ({record['provenance']['device']}): {_train_outcome(record)}",
              file=sys.stderr)


def _load_runs(text: str) -> list[tuple[dict[str, Any], str]]:
    """``[{"run_config": {...}, "out": DIR}, ...]`` given inline, or the path of a JSON/YAML file holding it."""
    data = _load_json_or_file(text, "[", "a JSON list")
    if not isinstance(data, list) or not data:
        raise ConfigError("--runs: expected a non-empty list of {run_config, out} objects")
    runs = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"run_config", "out"}:
            raise ConfigError(f"--runs[{i}]: expected an object with exactly the keys run_config and out, "
                              f"got {item!r}")
        config = item["run_config"]
        config = _load_mapping(config) if isinstance(config, str) else config
        if not isinstance(config, dict) or not isinstance(item["out"], str) or not item["out"]:
            raise ConfigError(f"--runs[{i}]: run_config must be a mapping and out a directory")
        runs.append((config, item["out"]))
    return runs


def cmd_train_group(args: argparse.Namespace) -> None:
    import dataclasses

    import torch

    from hotcold.config import RunConfig
    from hotcold.repeats import Job, run_group

    jobs = []
    for config, out in _load_runs(args.runs):
        cfg = RunConfig.from_dict(config)
        if args.device:
            cfg = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, device=args.device))
        jobs.append(Job(cfg, Path(out)))
    torch.set_num_threads(max(1, args.threads))
    print(f"train {len(jobs)} run(s) of {jobs[0].cfg.dataset} interleaved by repeat ({args.threads} threads)",
          file=sys.stderr)
    for job, record in zip(jobs, run_group(jobs, Path(args.dataset), progress=not args.no_progress)):
        print(f"wrote {job.out_dir / 'record.json'}: {_train_outcome(record)}", file=sys.stderr)


def _launch_train(args: argparse.Namespace, cfg: Any) -> None:
    """Start the config's ranks, each running ``hotcold train`` on the resolved config; a failed rank fails the verb."""
    from hotcold.distributed.launch import launch_ranks

    (Path(args.out) / "record.json").unlink(missing_ok=True)
    verb = ["train", "--dataset", args.dataset, "--run-config", json.dumps(cfg.to_dict()), "--out", args.out,
            "--threads", str(args.threads)] + (["--no-progress"] if args.no_progress else [])
    rc = launch_ranks(cfg.distributed.world, verb)
    if rc != 0:
        raise ChildProcessError(f"torchrun exited with status {rc}: a rank failed, no record was written")


def _train_outcome(record: dict[str, Any]) -> str:
    """One line on how a run ended: its throughput and AUC, or why it could not run."""
    if record["status"] != "ok":
        return f"{record['status']}: {record['reason']}"
    s, m = record["summary"], record["metrics"]
    repeats = f" (median of {s['repeats']} repeats, spread {s['repeat_spread']:.2f})" if s.get("repeats", 1) > 1 else ""
    return (f"{s['samples_per_s']:.0f} samples/s{repeats}, step p50 {s['step_ms_p50']:.2f} ms, AUC {m['auc']:.4f}"
            + ("" if s.get("stable", True) else f", unstable: {s['unstable_reason']}"))


def cmd_simulate(args: argparse.Namespace) -> None:
    import pandas as pd

    from hotcold.config import RunConfig
    from hotcold.data.format import Dataset
    from hotcold.data.skew import row_counts
    from hotcold.embedding.update import RowOptimizer
    from hotcold.files import atomic_write_text
    from hotcold.trace.cachesim import POLICIES, RowSizes, dataset_trace, sweep
    from hotcold.trace.faesim import fae_sweep

    cfg = RunConfig.from_dict({"dataset": "-", "method": "-", **_load_mapping(args.run_config)})
    ds = Dataset.open(args.dataset)
    t = cfg.train
    sizes = RowSizes(cfg.model.embedding_dim, RowOptimizer(t.row_optimizer, t.lr).state_width)
    trace = dataset_trace(ds, t.batch_size, t.steps, cfg.seed, t.shuffle)
    freq = row_counts(ds, "train")
    frames = [sweep(trace, args.ratios, args.policies or POLICIES, freq, windows=args.windows, sizes=sizes)]
    if args.fae_budgets:
        frames.append(fae_sweep(ds, t.batch_size, t.steps, cfg.seed, args.fae_budgets, args.fae_run_lengths,
                                args.fae_sample_fraction, sizes))
    frame = pd.concat(frames, ignore_index=True)
    frame.insert(0, "dataset", ds.name)
    atomic_write_text(Path(args.out), frame.to_csv(index=False))
    print(f"wrote {args.out}: {len(frame)} policy x size rows over {t.steps} batches")
    if args.curves_out:
        _write_curves(args, trace, frames[0], ds.name, freq, t.warmup_steps)


def _write_curves(args: argparse.Namespace, trace, swept, dataset: str, freq, from_step: int) -> None:
    """``simulate --curves-out``: the one-pass LRU curve, checked against the sweep, and the grid policies.

    ``timed_*`` rates count the steps from ``from_step`` on (the trained runs' timed steps).
    """
    import numpy as np
    import pandas as pd

    from hotcold.files import atomic_write_text
    from hotcold.trace import stackdist
    from hotcold.trace.policies import capacity_from_ratio

    if stackdist.KERNEL != "numba":
        print("numba is not installed: the one-pass LRU curve runs as plain Python (exact, slow); "
              "`pip install numba` (the `fast` extra) compiles it")
    jit = stackdist.warm_up()
    curve, timed = stackdist.lru_curves(trace, from_step)
    checked = stackdist.check_against(curve, swept)
    sized = np.concatenate([[capacity_from_ratio(r, trace.num_rows) for r in args.curve_ratios],
                            swept["capacity"].to_numpy(dtype=np.int64)]).astype(np.int64)
    caps = np.concatenate([stackdist.log_capacities(trace.num_rows, args.curve_points), sized,
                           [curve.max_unique, curve.distinct]])
    policies = [p for p in stackdist.GRID_POLICIES if p in (args.policies or stackdist.GRID_POLICIES)]
    grid = [stackdist.grid_curve(trace, p, sized[sized >= 1], freq, from_step=from_step) for p in policies]
    frame = stackdist.curves_frame(curve, caps[caps >= 1], pd.concat(grid) if grid else None, dataset, timed)
    atomic_write_text(Path(args.curves_out), frame.to_csv(index=False))
    print(f"one-pass LRU curve ({stackdist.KERNEL}, compile {jit:.2f} s excluded): {curve.seconds:.3f} s for "
          f"{curve.lookups} lookups, {curve.lookups / max(curve.seconds, 1e-9) / 1e6:.1f}M lookups/s; equal to "
          f"the per-size simulator at {checked} size(s)")
    print(f"wrote {args.curves_out}: {len(frame)} policy x size rows")


def cmd_shard_sim(args: argparse.Namespace) -> None:
    import pandas as pd

    from hotcold.config import RunConfig
    from hotcold.data.format import Dataset
    from hotcold.distributed.shardsim import Scale, shard_sim
    from hotcold.files import atomic_write_text

    cfg = RunConfig.from_dict({"dataset": "-", "method": "-", **_load_mapping(args.run_config)})
    scales = [Scale.parse(s) for s in args.scales]
    rows = shard_sim(Dataset.open(args.dataset), cfg, args.plans, scales, args.headrooms)
    frame = pd.DataFrame(rows)
    atomic_write_text(Path(args.out), frame.to_csv(index=False))
    print(f"wrote {args.out}: {len(frame)} plan x scale x headroom rows over {cfg.train.steps} batches")


def _run_length(text: str) -> int | str:
    return text if text == "epoch" else int(text)


def cmd_cache_sim(args: argparse.Namespace) -> None:
    from hotcold.analysis.comparisons import cache_sim_table
    from hotcold.files import atomic_write_text

    frame = cache_sim_table([Path(p) for p in args.sims])
    atomic_write_text(Path(args.out), frame.to_csv(index=False))
    print(f"wrote {args.out}: {len(frame)} rows from {len(args.sims)} simulation(s)")


def cmd_aggregate(args: argparse.Namespace) -> None:
    from hotcold.analysis.tables import aggregate, find_records

    records = [Path(p) for p in args.records] or find_records(Path(args.runs))
    frame = aggregate(records, Path(args.out), args.exact_rtol)
    print(f"aggregated {len(frame)} runs into {args.out}")


def cmd_scaleout_tables(args: argparse.Namespace) -> None:
    from hotcold.analysis.scaleout import scaleout_tables

    frames = scaleout_tables([Path(p) for p in args.records], [Path(p) for p in args.shard_sims], Path(args.out))
    print(f"wrote {', '.join(frames)} into {args.out}: {len(frames['comm_traffic'])} traffic rows from "
          f"{len(args.records)} scale-out record(s) and {len(args.shard_sims)} shard-sim table(s)")


def cmd_figures(args: argparse.Namespace) -> None:
    from hotcold.analysis.figures import make_figures

    for path in make_figures(Path(args.tables), Path(args.out)):
        print(f"wrote {path}")


def cmd_claims(args: argparse.Namespace) -> None:
    from hotcold.analysis.claims import load_profiles, write_claims
    from hotcold.analysis.claims_figure import claims_figure
    from hotcold.analysis.plotting import read_table, save_atomic
    from hotcold.analysis.tables import load_records
    from hotcold.costmodel import predict_record

    records = load_records([Path(p) for p in args.records])
    comm = read_table(Path(args.comm_traffic), "run `hotcold scaleout-tables` first")
    shape_of = _model_shapes(args.data)
    frame = write_claims(records, comm, load_profiles(args.profiles), Path(args.out),
                         predict=lambda rec, profile: predict_record(rec, profile, shape_of(rec)))
    written = save_atomic(claims_figure(frame), Path(args.figures), "claims")
    print(f"wrote {len(frame)} claims into {Path(args.out) / 'claims.md'} and {', '.join(map(str, written))}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    import torch

    from hotcold.calibrate import calibrate, write_profile
    from hotcold.train import resolve_device

    torch.set_num_threads(max(1, args.threads))
    profile = calibrate(resolve_device(args.device).type, dim=args.dim, batch_size=args.batch_size, repeats=args.repeats,
                        name=args.name)
    write_profile(profile, Path(args.out))
    print(f"wrote {args.out}: {len(profile['rates'])} rates of {profile['description']}")


def _model_shapes(data_dir: str):
    """A function giving a record's dense model sizes from its dataset under ``data_dir`` (None when absent)."""
    from hotcold.config import RunConfig
    from hotcold.costmodel import ModelShape
    from hotcold.data.format import Dataset

    shapes: dict[str, ModelShape | None] = {}

    def shape_of(rec: dict[str, Any]) -> ModelShape | None:
        name = rec["dataset"]
        if name not in shapes:
            path = Path(data_dir) / name
            shapes[name] = ModelShape.of(Dataset.open(path), RunConfig.from_dict(rec["config"]).model) \
                if (path / "manifest.json").is_file() else None
        return shapes[name]

    return shape_of


def cmd_costmodel_validation(args: argparse.Namespace) -> None:
    from hotcold.analysis.costmodel_validation import write_validation
    from hotcold.analysis.tables import load_records
    from hotcold.costmodel import load_profile

    profile = load_profile(args.profile)
    records = load_records([Path(r) for r in args.records])
    summary = write_validation(records, profile, Path(args.out), _model_shapes(args.data))
    print(f"wrote {Path(args.out) / 'costmodel_validation.csv'} and .md: {len(summary)} method(s) "
          f"on profile {profile.name}")


def cmd_hit_rate_curves(args: argparse.Namespace) -> None:
    from hotcold.analysis.hit_rate_curves import draw

    written = draw([Path(p) for p in args.curves], Path(args.tables) if args.tables else None, Path(args.out))
    print("wrote " + ", ".join(str(p) for p in written))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotcold", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True)

    g = sub.add_parser("generate", help="write a generated dataset directory")
    g.add_argument("--spec", required=True, help="generator config: JSON object or a YAML/JSON file")
    g.add_argument("--out", required=True, help="dataset directory to write")
    g.add_argument("--no-progress", action="store_true")
    g.set_defaults(func=cmd_generate)

    d = sub.add_parser("download", help="fetch a real dataset's raw files (source.json records provenance)")
    d.add_argument("--spec", required=True, help="source config: JSON object or a YAML/JSON file")
    d.add_argument("--out", required=True, help="directory for the raw files")
    d.add_argument("--name", required=True, help="the dataset's name in the config")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_download)

    pp = sub.add_parser("preprocess", help="turn fetched raw files into a dataset directory")
    pp.add_argument("--spec", required=True, help="source config: JSON object or a YAML/JSON file")
    pp.add_argument("--raw", required=True, help="directory written by `hotcold download`")
    pp.add_argument("--out", required=True, help="dataset directory to write")
    pp.add_argument("--name", required=True, help="the dataset's name")
    pp.add_argument("--no-progress", action="store_true")
    pp.set_defaults(func=cmd_preprocess)

    pr = sub.add_parser("profile", help="row access counts, coverage, unique rows per batch and window")
    pr.add_argument("--dataset", required=True)
    pr.add_argument("--out", required=True, help="profile directory (counts.npz, profile.json)")
    pr.add_argument("--sample-fraction", type=float, default=PROFILE.sample_fraction,
                    help="profile this share of training rows")
    pr.add_argument("--batch-size", type=int, default=TRAIN.batch_size)
    pr.add_argument("--window", type=int, default=PROFILE.window, help="batches per window for unique-row counts")
    pr.add_argument("--batches", type=int, default=PROFILE.batches, help="batches scanned for unique-row counts")
    pr.add_argument("--seed", type=int, default=0)
    pr.set_defaults(func=cmd_profile)

    ds = sub.add_parser("dataset-stats", help="dataset_stats.csv and the coverage figure from profiles")
    ds.add_argument("profiles", nargs="+", help="profile directories")
    ds.add_argument("--out", default="results/tables/dataset_stats.csv")
    ds.add_argument("--figures", default="paper_figs")
    ds.set_defaults(func=cmd_dataset_stats)

    t = sub.add_parser("train", help="train one method on one dataset and write its run record")
    t.add_argument("--dataset", required=True, help="dataset directory (with manifest.json)")
    t.add_argument("--run-config", required=True, help="run config: JSON object or a YAML/JSON file")
    t.add_argument("--out", required=True, help="run directory for record.json and steps.parquet")
    t.add_argument("--threads", type=int, default=1, help="threads of the job, shared by its ranks")
    t.add_argument("--nproc", type=int, help="ranks to launch with torchrun (default: the config's distributed.world)")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override timing.device")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_train)

    tg = sub.add_parser("train-group", help="train several one-process runs of one dataset interleaved by repeat "
                                            "(repeat 1 of each, then repeat 2 of each, ...) and write their records")
    tg.add_argument("--dataset", required=True, help="dataset directory (with manifest.json)")
    tg.add_argument("--runs", required=True,
                    help='[{"run_config": {...}, "out": RUN_DIR}, ...]: a JSON list, or a JSON/YAML file holding it')
    tg.add_argument("--threads", type=int, default=1, help="threads of the job")
    tg.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override timing.device")
    tg.add_argument("--no-progress", action="store_true")
    tg.set_defaults(func=cmd_train_group)

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

    c = sub.add_parser("cache-sim", help="cache_sim.csv: the simulate CSVs of every dataset in one table")
    c.add_argument("sims", nargs="+", help="CSVs written by `hotcold simulate`")
    c.add_argument("--out", default="results/tables/cache_sim.csv")
    c.set_defaults(func=cmd_cache_sim)

    a = sub.add_parser("aggregate", help="summary, speed-up, FAE and rows-moved tables from run records")
    a.add_argument("records", nargs="*", help="record.json files (default: every run under --runs)")
    a.add_argument("--runs", default="results/runs", help="runs directory searched when no records are given")
    a.add_argument("--out", default="results/tables")
    a.add_argument("--exact-rtol", type=float, default=AGGREGATE.exact_rtol,
                   help="relative parameter difference under which a run counts as exact")
    a.set_defaults(func=cmd_aggregate)

    so = sub.add_parser("scaleout-tables", help="comm_traffic, flexshard_headroom and proactive tables from "
                                                "scale-out run records and shard-sim CSVs")
    so.add_argument("records", nargs="*", help="record.json files of scale-out runs")
    so.add_argument("--shard-sims", nargs="*", default=[], help="CSVs written by `hotcold shard-sim`")
    so.add_argument("--out", default="results/tables")
    so.set_defaults(func=cmd_scaleout_tables)

    f = sub.add_parser("figures", help="paper figures from the tables")
    f.add_argument("--tables", default="results/tables")
    f.add_argument("--out", default="paper_figs")
    f.set_defaults(func=cmd_figures)

    cl = sub.add_parser("claims", help="claims.csv/.md and the claims figure: each paper's headline claim beside "
                                       "hotcold's measured and modelled numbers")
    cl.add_argument("records", nargs="+", help="record.json files of the runs (one-process and scale-out)")
    cl.add_argument("--comm-traffic", default="results/tables/comm_traffic.csv", help="from `hotcold scaleout-tables`")
    cl.add_argument("--profiles", nargs="+", required=True, help="hardware profiles (YAML) the modelled values use")
    cl.add_argument("--data", default="results/data", help="datasets directory (the dense model's sizes)")
    cl.add_argument("--out", default="results/tables")
    cl.add_argument("--figures", default="paper_figs")
    cl.set_defaults(func=cmd_claims)

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

    cv = sub.add_parser("costmodel-validation", help="the cost model's phase times against measured runs: "
                                                     "costmodel_validation.csv and .md")
    cv.add_argument("records", nargs="+", help="record.json files")
    cv.add_argument("--profile", required=True, help="hardware profile YAML (e.g. from hotcold calibrate)")
    cv.add_argument("--data", default="results/data", help="datasets directory (the dense model's sizes)")
    cv.add_argument("--out", default="results/tables")
    cv.set_defaults(func=cmd_costmodel_validation)

    be = sub.add_parser("bench", help="benchmarks: `bench embedding` times the core embedding step against "
                                      "FBGEMM's TBE and measures gather bandwidth")
    be.add_argument("what", choices=["embedding"])
    be.add_argument("--threads", type=int, default=1, help="torch threads")
    be.add_argument("--batch", type=int, default=2048, help="samples per batch")
    be.add_argument("--dim", type=int, default=16, help="embedding dimension")
    be.add_argument("--cap", type=int, default=200_000, help="rows per table at most (Criteo Kaggle's 26 tables)")
    be.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the ids")
    be.add_argument("--steps", type=int, default=40, help="timed steps of each side per repeat")
    be.add_argument("--repeats", type=int, default=7, help="interleaved repeats (medians are reported)")
    be.add_argument("--check-steps", type=int, default=20, help="steps of the weight-agreement check (0: skip)")
    be.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    be.add_argument("--optimizers", nargs="+", choices=["sgd", "adagrad"], default=["sgd", "adagrad"])
    be.add_argument("--no-compile", action="store_true",
                    help="run the harness's backward + update (sparse_step) plainly, not compiled")
    be.add_argument("--out", help="write the result as JSON (.json) or CSV (.csv)")
    be.set_defaults(func=cmd_bench)

    hc = sub.add_parser("hit-rate-curves", help="hit_rate_curves.png/.pdf: hit rate against cache size per dataset, "
                                                "from `simulate --curves-out` CSVs")
    hc.add_argument("curves", nargs="+", help="curves CSVs written by `hotcold simulate --curves-out`")
    hc.add_argument("--tables", help="tables directory: summary.csv marks the trained sizes, counters.csv their "
                                     "measured hit rates (optional)")
    hc.add_argument("--out", default="paper_figs")
    hc.set_defaults(func=cmd_hit_rate_curves)
    return p


def cmd_bench(args: argparse.Namespace) -> None:
    from hotcold.bench import BenchConfig, render, run, write

    cfg = BenchConfig(threads=args.threads, batch=args.batch, dim=args.dim, cap=args.cap, zipf=args.zipf,
                      steps=args.steps, repeats=args.repeats, check_steps=args.check_steps, device=args.device,
                      optimizers=tuple(args.optimizers), compile=not args.no_compile)
    result = run(cfg)
    print(render(result))
    if args.out:
        write(result, Path(args.out))
        print(f"wrote {args.out}")


def main(argv: list[str] | None = None) -> int:
    """Run one verb; bad input, I/O failures and corrupt files print one line and exit 2.

    Caught: configuration and value errors, OSError (missing files, failed
    downloads, disk full), and the errors of truncated or corrupt archives
    (EOFError, tarfile and zlib errors). Anything else is a bug and keeps its
    traceback.
    """
    import tarfile
    import zlib

    args = parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, ValueError, OSError, EOFError, tarfile.TarError, zlib.error) as e:
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"hotcold {args.verb}: error: {message}", file=sys.stderr)
        return 2
    return 0
