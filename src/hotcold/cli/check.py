"""``check-config``: a workflow config file checked as the workflow reads it (`make reproduce CONFIG=...` runs it
first)."""
from __future__ import annotations

import argparse


def add_check_config(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check-config", help="check a workflow config file (Snakemake's --configfile) as the workflow "
                                            "reads it: YAML, schema, datasets and runs; one line naming what is wrong")
    c.add_argument("path", help="the config file, merged over workflows/config/default.yaml")
    c.set_defaults(func=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> None:
    from hotcold.workflow.schema import check_config

    print(check_config(args.path))
