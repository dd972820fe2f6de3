"""Verbs that turn results into tables and figures: ``aggregate``, ``scaleout-tables``, ``figures``, ``claims``,
``costmodel-validation``, ``hit-rate-curves``."""
from __future__ import annotations

import argparse
from pathlib import Path

from hotcold.config import AggregateConfig

AGGREGATE = AggregateConfig()


def add_aggregate(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("aggregate", help="summary, speed-up, FAE and rows-moved tables from run records")
    a.add_argument("records", nargs="*", help="record.json files (default: every run under --runs)")
    a.add_argument("--runs", default="results/runs", help="runs directory searched when no records are given")
    a.add_argument("--out", default="results/tables")
    a.add_argument("--exact-rtol", type=float, default=AGGREGATE.exact_rtol,
                   help="relative parameter difference under which a run counts as exact")
    a.set_defaults(func=cmd_aggregate)


def cmd_aggregate(args: argparse.Namespace) -> None:
    from hotcold.analysis.run_records import find_records
    from hotcold.analysis.tables import aggregate

    records = [Path(p) for p in args.records] or find_records(Path(args.runs))
    frame = aggregate(records, Path(args.out), args.exact_rtol)
    print(f"aggregated {len(frame)} runs into {args.out}")


def add_scaleout_tables(sub: argparse._SubParsersAction) -> None:
    so = sub.add_parser("scaleout-tables", help="comm_traffic, flexshard_headroom and proactive tables from "
                                                "scale-out run records and shard-sim CSVs")
    so.add_argument("records", nargs="*", help="record.json files of scale-out runs")
    so.add_argument("--shard-sims", nargs="*", default=[], help="CSVs written by `hotcold shard-sim`")
    so.add_argument("--out", default="results/tables")
    so.set_defaults(func=cmd_scaleout_tables)


def cmd_scaleout_tables(args: argparse.Namespace) -> None:
    from hotcold.analysis.scaleout import scaleout_tables

    frames = scaleout_tables([Path(p) for p in args.records], [Path(p) for p in args.shard_sims], Path(args.out))
    print(f"wrote {', '.join(frames)} into {args.out}: {len(frames['comm_traffic'])} traffic rows from "
          f"{len(args.records)} scale-out record(s) and {len(args.shard_sims)} shard-sim table(s)")


def add_figures(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("figures", help="paper figures from the tables")
    f.add_argument("--tables", default="results/tables")
    f.add_argument("--out", default="paper_figs")
    f.add_argument("--set", dest="which", choices=["all", "one-process", "scale-out"], default="all",
                   help="draw every figure (default), or only the one-process runs' or the scale-out runs'")
    f.set_defaults(func=cmd_figures)


def cmd_figures(args: argparse.Namespace) -> None:
    from hotcold.analysis.figures import make_figures

    for path in make_figures(Path(args.tables), Path(args.out), args.which):
        print(f"wrote {path}")


def add_claims(sub: argparse._SubParsersAction) -> None:
    cl = sub.add_parser("claims", help="claims.csv/.md and the claims figure: each paper's headline claim beside "
                                       "hotcold's measured and modelled numbers")
    cl.add_argument("records", nargs="+", help="record.json files of the runs (one-process and scale-out)")
    cl.add_argument("--comm-traffic", default="results/tables/comm_traffic.csv", help="from `hotcold scaleout-tables`")
    cl.add_argument("--profiles", nargs="+", required=True, help="hardware profiles (YAML) the modelled values use")
    cl.add_argument("--data", default="results/data", help="datasets directory (the dense model's sizes)")
    cl.add_argument("--out", default="results/tables")
    cl.add_argument("--figures", default="paper_figs")
    cl.add_argument("--sims", nargs="*", default=[], help="`hotcold simulate` CSVs (<dataset>.csv): paper-scale "
                                                          "counters of what the configuration does not train")
    cl.add_argument("--shard-sims", nargs="*", default=[], help="`hotcold shard-sim` CSVs (<dataset>.csv)")
    cl.add_argument("--sim-configs", default="{}", help="JSON: dataset -> {simulate: {seed, train}, shard_sim: "
                                                        "{seed, train, model}}, the configs the simulations ran under")
    cl.add_argument("--gpu-records", nargs="*", default=[],
                    help="GPU-timed record.json files or folders (a GPU run's committed evidence, a gpu-check "
                         "output): the claims measured on that GPU (default: this reproduction's own CUDA runs)")
    cl.add_argument("--gpu-profile", help="the GPU's calibrated profile: the claims modelled on it")
    cl.set_defaults(func=cmd_claims)


def cmd_claims(args: argparse.Namespace) -> None:
    from hotcold.analysis.claims.report import claims_report

    frame, written = claims_report([Path(p) for p in args.records], Path(args.comm_traffic), args.profiles,
                                   args.data, Path(args.out), Path(args.figures), [Path(p) for p in args.sims],
                                   [Path(p) for p in args.shard_sims], args.sim_configs,
                                   [Path(p) for p in args.gpu_records], args.gpu_profile)
    print(f"wrote {len(frame)} claims into {Path(args.out) / 'claims.md'} and {', '.join(map(str, written))}")


def add_costmodel_validation(sub: argparse._SubParsersAction) -> None:
    cv = sub.add_parser("costmodel-validation", help="the cost model's phase times against measured runs: "
                                                     "costmodel_validation.csv and .md")
    cv.add_argument("records", nargs="+", help="record.json files")
    cv.add_argument("--profile", required=True, help="hardware profile YAML (e.g. from hotcold calibrate)")
    cv.add_argument("--data", default="results/data", help="datasets directory (the dense model's sizes)")
    cv.add_argument("--out", default="results/tables")
    cv.set_defaults(func=cmd_costmodel_validation)


def cmd_costmodel_validation(args: argparse.Namespace) -> None:
    from hotcold.analysis.modelled import validation_report

    summary, profile = validation_report([Path(r) for r in args.records], args.profile, args.data, Path(args.out))
    print(f"wrote {Path(args.out) / 'costmodel_validation.csv'} and .md: {len(summary)} method(s) "
          f"on profile {profile.name}")


def add_hit_rate_curves(sub: argparse._SubParsersAction) -> None:
    hc = sub.add_parser("hit-rate-curves", help="hit_rate_curves.png/.pdf: hit rate against cache size per dataset, "
                                                "from `simulate --curves-out` CSVs")
    hc.add_argument("curves", nargs="+", help="curves CSVs written by `hotcold simulate --curves-out`")
    hc.add_argument("--tables", help="tables directory: summary.csv marks the trained sizes, counters.csv their "
                                     "measured hit rates (optional)")
    hc.add_argument("--out", default="paper_figs")
    hc.set_defaults(func=cmd_hit_rate_curves)


def cmd_hit_rate_curves(args: argparse.Namespace) -> None:
    from hotcold.analysis.hit_rate_curves import draw

    written = draw([Path(p) for p in args.curves], Path(args.tables) if args.tables else None, Path(args.out))
    print("wrote " + ", ".join(str(p) for p in written))
