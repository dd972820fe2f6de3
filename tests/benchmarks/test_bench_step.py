"""The training step at the Kaggle DLRM shape (``hotcold bench step``): its aims, checked (``make bench``).

- ``device`` at most 70 aten operations (views apart) a timed step with the
  step pipeline on, every other one-process technique within 25 of it;
- the pipeline hides at least 80% of the host's preparation of a step from
  the training thread (one torch thread on a CPU);

on a generated Kaggle-style dataset with tables capped at 200k rows (one
thread), or ``HOTCOLD_BENCH_KAGGLE``'s. The whole table is in ``extra_info``.
"""
from __future__ import annotations

import os

import torch

from hotcold.bench.step import StepBenchConfig, render, run

MAX_DEVICE_OPS = 70
MAX_EXTRA_OPS = 25
MIN_HIDDEN = 0.8


def test_step_ops_and_hidden_preparation(benchmark):
    cfg = StepBenchConfig(steps=20, warmup=5, repeats=3, dataset=os.environ.get("HOTCOLD_BENCH_KAGGLE"),
                          device="cuda" if torch.cuda.is_available() else "cpu")
    result = benchmark.pedantic(run, args=(cfg,), rounds=1, iterations=1)
    print(render(result))
    rows = {m["method"]: m for m in result["methods"]}
    benchmark.extra_info.update({m: {k: v for k, v in r.items() if not k.startswith(("op_counts", "phase"))}
                                 for m, r in rows.items()})
    device = rows["device"]["ops_on"]
    assert device <= MAX_DEVICE_OPS, f"device: {device} operations a step (aim: <= {MAX_DEVICE_OPS})"
    over = {m: r["ops_on"] for m, r in rows.items() if r["ops_on"] > device + MAX_EXTRA_OPS}
    assert not over, f"more than {MAX_EXTRA_OPS} operations above device's {device}: {over}"
    short = {m: round(r["prepare_hidden"], 2) for m, r in rows.items() if not r["prepare_hidden"] >= MIN_HIDDEN}
    assert not short, f"the pipeline hides less than {MIN_HIDDEN:.0%} of the step's preparation: {short}"
