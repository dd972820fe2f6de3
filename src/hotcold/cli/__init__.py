"""``hotcold <verb>``: every workflow rule runs one verb; each also runs by hand.

One module per group of verbs (``data``, ``train``, ``simulate``, ``report``,
``bench``, ``check``, ``resume``, ``gpucheck``), each verb an ``add_<verb>`` that declares its arguments beside
its ``cmd_<verb>`` handler. A handler reads its arguments, calls one
function of the package and prints what came of it; the work itself lives in
the package, where it runs and is tested without the command line.
"""
from __future__ import annotations

import argparse
import sys

from hotcold.cli import bench, check, data, gpucheck, report, resume, simulate, train
from hotcold.config import ConfigError

#: the top-level help's description (the first line of this docstring)
DESCRIPTION = "``hotcold <verb>``: every workflow rule runs one verb; each also runs by hand."

#: every verb, in the order ``hotcold --help`` lists them
VERBS = (data.add_generate, data.add_download, data.add_preprocess, data.add_profile, data.add_dataset_stats,
         train.add_train, train.add_train_group, train.add_infeasible, simulate.add_simulate, simulate.add_shard_sim,
         simulate.add_torchrec_peer, simulate.add_cache_sim, report.add_aggregate, report.add_scaleout_tables,
         report.add_figures, report.add_claims, bench.add_calibrate, report.add_costmodel_validation, bench.add_bench,
         report.add_hit_rate_curves, check.add_check_config, resume.add_resume, gpucheck.add_gpu_check)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotcold", description=DESCRIPTION)
    sub = p.add_subparsers(dest="verb", required=True)
    for add in VERBS:
        add(sub)
    return p


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
