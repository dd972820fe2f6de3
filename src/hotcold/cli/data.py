"""Verbs that make and describe datasets: ``generate``, ``download``, ``preprocess``, ``profile``, ``dataset-stats``."""
from __future__ import annotations

import argparse
from pathlib import Path

from hotcold.cli.args import load_mapping
from hotcold.config import ProfileConfig, TrainConfig

PROFILE, TRAIN = ProfileConfig(), TrainConfig()


def add_generate(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="write a generated dataset directory")
    g.add_argument("--spec", required=True, help="generator config: JSON object or a YAML/JSON file")
    g.add_argument("--out", required=True, help="dataset directory to write")
    g.add_argument("--no-progress", action="store_true")
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> None:
    from hotcold.data.generators import GeneratorConfig, generate

    manifest = generate(GeneratorConfig.from_dict(load_mapping(args.spec)), Path(args.out),
                        progress=not args.no_progress)
    print(f"wrote {args.out}: {manifest['rows']} rows, {len(manifest['cardinalities'])} tables")


def add_download(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("download", help="fetch a real dataset's raw files (source.json records provenance)")
    d.add_argument("--spec", required=True, help="source config: JSON object or a YAML/JSON file")
    d.add_argument("--out", required=True, help="directory for the raw files")
    d.add_argument("--name", required=True, help="the dataset's name in the config")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_download)


def cmd_download(args: argparse.Namespace) -> None:
    from hotcold.data.sources.prepare import fetch
    from hotcold.data.sources.source_config import SourceConfig

    record = fetch(SourceConfig.from_dict(load_mapping(args.spec)), Path(args.out), name=args.name,
                   progress=not args.no_progress)
    print(f"fetched {len(record['files'])} file(s) into {args.out}")


def add_preprocess(sub: argparse._SubParsersAction) -> None:
    pp = sub.add_parser("preprocess", help="turn fetched raw files into a dataset directory")
    pp.add_argument("--spec", required=True, help="source config: JSON object or a YAML/JSON file")
    pp.add_argument("--raw", required=True, help="directory written by `hotcold download`")
    pp.add_argument("--out", required=True, help="dataset directory to write")
    pp.add_argument("--name", required=True, help="the dataset's name")
    pp.add_argument("--no-progress", action="store_true")
    pp.set_defaults(func=cmd_preprocess)


def cmd_preprocess(args: argparse.Namespace) -> None:
    from hotcold.data.sources.prepare import preprocess
    from hotcold.data.sources.source_config import SourceConfig

    manifest = preprocess(SourceConfig.from_dict(load_mapping(args.spec)), Path(args.raw), Path(args.out),
                          name=args.name, progress=not args.no_progress)
    print(f"wrote {args.out}: {manifest['rows']} rows, {len(manifest['cardinalities'])} tables")


def add_profile(sub: argparse._SubParsersAction) -> None:
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


def cmd_profile(args: argparse.Namespace) -> None:
    from hotcold.data.format import Dataset
    from hotcold.trace.profile import profile_dataset, save_profile

    prof = profile_dataset(Dataset.open(args.dataset), sample_fraction=args.sample_fraction,
                           batch_size=args.batch_size, window=args.window, batches=args.batches, seed=args.seed)
    save_profile(prof, Path(args.out))
    print(f"wrote profile of {args.dataset} into {args.out}")


def add_dataset_stats(sub: argparse._SubParsersAction) -> None:
    ds = sub.add_parser("dataset-stats", help="dataset_stats.csv and the coverage figure from profiles")
    ds.add_argument("profiles", nargs="+", help="profile directories")
    ds.add_argument("--out", default="results/tables/dataset_stats.csv")
    ds.add_argument("--figures", default="paper_figs")
    ds.set_defaults(func=cmd_dataset_stats)


def cmd_dataset_stats(args: argparse.Namespace) -> None:
    from hotcold.trace.profile import coverage_figure, dataset_stats, write_dataset_stats

    dirs = [Path(p) for p in args.profiles]
    write_dataset_stats(dataset_stats(dirs), Path(args.out))
    for path in [Path(args.out), *coverage_figure(dirs, Path(args.figures))]:
        print(f"wrote {path}")
