"""One launch trains many scale-out cases in one process group (tests/test_distributed.py).

The tests start the ranks with ``rank_main``, forked from one process that imported torch and
the harness once (``test_distributed.launch``); by hand, under torchrun:
``python -m torch.distributed.run --standalone --nproc-per-node P tests/distributed_worker.py
CASES.json OUT.pt``. CASES.json: a list of ``{"name", "dataset" (directory), "run_config"
(RunConfig dict)}``, and ``"broken": true`` for a negative control (Proactive with
``reads_before_update``); rank 0 saves ``{name: {"params", "counters", "report", "summary"}}``
with torch.save.
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from unittest import mock

import torch

from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.distributed.proactive import ProactiveStore
from hotcold.distributed.world import World
from hotcold.train import train


def reads_before_update(store: ProactiveStore, target: int) -> torch.Tensor:
    """NEGATIVE CONTROL, tests only: Proactive's eligible rows without excluding those the steps in between
    update, so rows are read before their update (must diverge from the ``device`` store)."""
    served = store._ahead[target].ex.served
    if target == store._step:
        return torch.arange(served.numel())
    return store._early_ok.index_select(0, served).nonzero().squeeze(1)


def main(cases_path: str, out_path: str) -> None:
    torch.set_num_threads(1)
    cases = json.loads(open(cases_path).read())
    cpu = torch.device("cpu")
    world = World.join(cases[0]["ranks_per_node"], int(os.environ["WORLD_SIZE"]), cpu)
    results = {}
    for case in cases:
        cfg = RunConfig.from_dict(case["run_config"])
        with mock.patch.object(ProactiveStore, "eligible", reads_before_update) if case.get("broken") else nullcontext():
            res = train(cfg, Dataset.open(case["dataset"]), cpu, progress=False, world=world)
        if world.is_main:
            results[case["name"]] = {"params": res.named_parameters(), "counters": res.counters,
                                     "report": res.store_report, "summary": res.summary}
    if world.is_main:
        torch.save(results, out_path)
    world.close()


def rank_main(rank: int, world: int, port: int, cases_path: str, out_path: str, log_path: str) -> None:
    """One rank of ``world`` on this machine, with the environment torchrun gives its ranks; what it prints (a
    traceback too) goes to ``log_path``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      GROUP_RANK="0", GROUP_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    main(cases_path, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
