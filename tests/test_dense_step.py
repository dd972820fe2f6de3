"""The dense step as a CUDA graph: the same bits as eager, and a clear fallback where it cannot be captured.

Without a GPU the graph is emulated (``Emulated``: "capture" keeps the
function, "replay" runs it over the static buffers), which pins everything
but CUDA itself: the inputs copied in, the gradients and the loss handed out,
the warm-up before the capture. A real capture is checked by the CUDA cases.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from hotcold import dense_step
from hotcold.config import ConfigError
from hotcold.train import train
from test_stores import run_cfg

CPU = torch.device("cpu")


class Emulated:
    """The CUDA calls of ``DenseStep`` on the CPU: no streams; capture keeps the function, replay runs it."""

    captures = 0

    def __init__(self, device) -> None:
        self.device = device

    def on_side(self):
        return contextlib.nullcontext()

    def capture(self, fn):
        type(self).captures += 1
        return fn, None

    def replay(self, graph, out):
        return graph()


class Failing(Emulated):
    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.fixture
def graphs_here(monkeypatch):
    """This CPU counts as a GPU for the dense step, with ``backend`` standing in for CUDA's graph calls."""
    def use(backend):
        monkeypatch.setattr(dense_step, "graph_obstacle", lambda device, world: None)
        monkeypatch.setattr(dense_step, "CudaGraphs", backend)
    return use


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("method", ["device", "lru", "fae"])
def test_replayed_dense_step_trains_the_eager_bits(small_dataset, graphs_here, method, optimizer):
    eager = train(run_cfg(method, optimizer, steps=10, cuda_graphs="off"), small_dataset, CPU, progress=False)
    graphs_here(Emulated)
    before = Emulated.captures
    graphed = train(run_cfg(method, optimizer, steps=10, cuda_graphs="on"), small_dataset, CPU, progress=False)
    assert Emulated.captures == before + 1
    assert eager.store_report["dense_step"] == "eager" and graphed.store_report["dense_step"] == "graph"
    for (name, a), (_, b) in zip(eager.named_parameters(), graphed.named_parameters()):
        assert torch.equal(a, b), f"{method}/{optimizer}: {name}"
    assert eager.metrics["auc"] == graphed.metrics["auc"]


def test_a_failed_capture_falls_back_to_eager_and_says_why(small_dataset, graphs_here):
    eager = train(run_cfg("device", steps=8, cuda_graphs="off"), small_dataset, CPU, progress=False)
    graphs_here(Failing)
    got = train(run_cfg("device", steps=8, cuda_graphs="auto"), small_dataset, CPU, progress=False)
    assert got.store_report["dense_step"] == "eager"
    assert "capture failed (RuntimeError: operation not permitted" in got.store_report["dense_step_note"]
    for (name, a), (_, b) in zip(eager.named_parameters(), got.named_parameters()):
        assert torch.equal(a, b), name
    with pytest.raises(RuntimeError, match="train.cuda_graphs is on, but the capture failed"):
        train(run_cfg("device", steps=8, cuda_graphs="on"), small_dataset, CPU, progress=False)


def test_auto_on_a_cpu_is_eager_and_on_is_refused(small_dataset):
    got = train(run_cfg("device", steps=4, cuda_graphs="auto"), small_dataset, CPU, progress=False)
    assert got.store_report["dense_step"] == "eager"
    assert got.store_report["dense_step_note"] == "no CUDA device (the trainer is cpu)"
    with pytest.raises(ConfigError, match="train.cuda_graphs is on, but no CUDA device"):
        train(run_cfg("device", steps=4, cuda_graphs="on"), small_dataset, CPU, progress=False)
