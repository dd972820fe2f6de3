"""The step pipeline: step i+1 planned on a worker while step i trains changes nothing that step i does.

Every one-process store trains the same bits, with the same counters step by
step, with the pipeline on and off; and on with either thread held back, so
that the next step's plan runs before this step's forward (the worker ahead)
or after its backward (the training thread ahead).
"""
from __future__ import annotations

import threading
import time

import pytest
import torch

from hotcold import methods
from hotcold.data.loader import Batch
from hotcold.embedding.base import EmbeddingStore
from hotcold.pipeline import StepPipeline
from hotcold.train import train
from test_stores import run_cfg, skip_missing
from tiers import tiered

CPU = torch.device("cpu")
HARNESS = [m for m in methods.names(spans_ranks=False, peer=False)]
STEPS = 12


def _named(res) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach().cpu()) for n, p in res.named_parameters()]


def _same(a, b, what: str) -> None:
    for (name, x), (_, y) in zip(_named(a), _named(b)):
        assert torch.equal(x, y), f"{what}: {name} differs by {float((x - y).abs().max()):.3g}"
    assert a.counters == b.counters, f"{what}: counters differ"


@pytest.fixture
def slowed(monkeypatch):
    """Hold back one side: ``slowed("forward")`` delays every store forward (the worker plans ahead of it),
    ``slowed("plan")`` every plan (the training thread waits for it)."""
    def hold(where: str) -> None:
        name, pause = ("forward", 0.004) if where == "forward" else ("prepare", 0.02)
        for cls in {methods.get(m).store for m in HARNESS}:
            fn = getattr(cls, name)
            monkeypatch.setattr(cls, name, lambda self, *a, fn=fn: (time.sleep(pause), fn(self, *a))[1])
    return hold


#: the default tier: every store under one row optimizer (the two alternately); the slow tier: under both
@pytest.mark.parametrize("method,row_optimizer", tiered(
    [(method, opt) for method in HARNESS for opt in ("sgd", "adagrad")],
    {(method, ("sgd", "adagrad")[i % 2]) for i, method in enumerate(HARNESS)}))
def test_pipeline_on_trains_the_bits_of_pipeline_off(small_dataset, method, row_optimizer, slowed):
    skip_missing(method)
    off = train(run_cfg(method, row_optimizer, steps=STEPS, pipeline="off"), small_dataset, CPU, progress=False)
    on = train(run_cfg(method, row_optimizer, steps=STEPS, pipeline="on"), small_dataset, CPU, progress=False)
    _same(on, off, f"{method}/{row_optimizer} pipeline on")
    assert off.summary["pipeline"] is False and off.summary["prepare_hidden"] == 0
    assert on.summary["pipeline"] is True and on.summary["prepare_ms_p50"] > 0
    slowed("forward")
    ahead = train(run_cfg(method, row_optimizer, steps=STEPS, pipeline="on"), small_dataset, CPU, progress=False)
    _same(ahead, off, f"{method}/{row_optimizer} with the worker a step ahead")


@pytest.mark.parametrize("method", ["lru", "scratchpipe", "fae"])
def test_a_slow_plan_keeps_the_bits(small_dataset, method, slowed):
    off = train(run_cfg(method, steps=STEPS, pipeline="off"), small_dataset, CPU, progress=False)
    slowed("plan")
    behind = train(run_cfg(method, steps=STEPS, pipeline="on"), small_dataset, CPU, progress=False)
    _same(behind, off, f"{method} with the training thread ahead")
    assert behind.summary["prepare_wait_ms_p50"] >= 10  # it did wait for the plans (20 ms each)


# -- the pipeline itself ----------------------------------------------------------------------------------------

class _Recorder(EmbeddingStore):
    """Records which thread prepared which batch, and when."""

    plans_ahead = True

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self._prepared = __import__("collections").deque()

    def prepare(self, ids, upcoming=()):
        self.calls.append((int(ids[0, 0]), threading.current_thread().name))

    forward = backward = lookup = export = None


def _batches(n: int):
    for i in range(n + 5):  # more than the steps: the pipeline must not read past them
        yield Batch(i, torch.zeros(2, 3), torch.full((2, 1), i), torch.zeros(2), [])


@pytest.mark.parametrize("ahead", [False, True])
def test_steps_are_prepared_in_order_and_never_past_the_last(ahead):
    store = _Recorder()
    pipe = StepPipeline(_batches(4), 4, store, CPU, ahead=ahead)
    try:
        got = [pipe.next().batch.step for _ in range(4)]
        with pytest.raises(StopIteration):
            pipe.next()
    finally:
        pipe.close()
    assert got == [0, 1, 2, 3]
    assert [i for i, _ in store.calls] == [0, 1, 2, 3]
    on_worker = [name.startswith("hotcold-plan") for _, name in store.calls]
    assert on_worker == [ahead] * 4
    assert len(pipe.prepared_ms) == len(pipe.waited_ms) == 4


def test_a_failed_plan_fails_the_step_that_needs_it():
    class Failing(_Recorder):
        def prepare(self, ids, upcoming=()):
            if int(ids[0, 0]) == 2:
                raise ValueError("bad batch 2")

    pipe = StepPipeline(_batches(4), 4, Failing(), CPU, ahead=True)
    try:
        pipe.next(), pipe.next()
        with pytest.raises(ValueError, match="bad batch 2"):
            pipe.next()
    finally:
        pipe.close()


def test_closing_a_cache_store_releases_a_plan_waiting_for_its_forward(small_dataset):
    """A step handed out but never trained (the training thread failed first): closing does not hang."""
    from hotcold.train import build, train_loader

    cfg = run_cfg("lru", steps=STEPS, pipeline="on")
    _, store, rows = build(cfg, small_dataset, CPU)
    pipe = StepPipeline(iter(train_loader(cfg, small_dataset, 0, rows=rows)), STEPS, store, CPU, ahead=True)
    pipe.next()  # step 0 handed out; the worker plans step 1 and waits for step 0's forward
    time.sleep(0.05)
    t0 = time.perf_counter()
    store.close()
    pipe.close()
    assert time.perf_counter() - t0 < 5
