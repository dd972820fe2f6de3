"""``resume``: clear what a killed Snakemake left in the workflow's directory (`make reproduce` runs it first)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_resume(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("resume", help="before rerunning a killed workflow: end its orphaned jobs, clear its stale "
                                      "Snakemake lock and its half-written files")
    r.add_argument("--workdir", default=".", help="the workflow's working directory (Snakemake's --directory)")
    r.add_argument("--grace", type=float, default=10.0,
                   help="seconds an orphaned job has to end after SIGTERM before it is killed")
    r.set_defaults(func=cmd_resume)


def cmd_resume(args: argparse.Namespace) -> None:
    from hotcold.workflow.resume import resume

    print(resume(Path(args.workdir), args.grace).line())
