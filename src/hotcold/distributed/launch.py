"""``hotcold train --nproc P``: start P ranks with torchrun, each running the same ``hotcold train``."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence


def torchrun_command(nproc: int, verb_args: Sequence[str]) -> list[str]:
    """torchrun on this machine (``--standalone``: a free port, no rendezvous server) running ``hotcold``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "hotcold", *verb_args]


def launch_ranks(nproc: int, verb_args: Sequence[str]) -> int:
    """Run the ranks to completion and return torchrun's exit status (non-zero when any rank failed).

    Each rank gets one intra-op thread unless told otherwise; torchrun stops
    the others when one rank fails.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(torchrun_command(nproc, verb_args), env=env)
