"""The GPU path on the CPU (``accel.gpu_path_on_cpu``): every store's device-side decisions and bits, without a GPU.

On a GPU the stores keep device and host tensors apart, copy between them on
streams and decide on the device what it can decide; on a CPU trainer they
take their host paths. Run on CPU tensors with stand-in streams and events,
the GPU path must train the host path's bits: the same model as ``device``.
"""
from __future__ import annotations

import pytest
import torch

from hotcold import accel, methods
from hotcold.train import train

from test_stores import run_cfg
from tiers import tiered

CPU = torch.device("cpu")
ONE_PROCESS = [m for m in methods.names(spans_ranks=False) if not methods.get(m).peer]


def bits(a, b) -> bool:
    return all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))


DATA = [("small_dataset", "adagrad"), ("sequence_dataset", "adagrad"), ("multihot_dataset", "elementwise-adagrad")]


#: the default tier: every store on one dataset (the i-th store on the (i mod 3)-th: each dataset by some stores);
#: the slow tier: every store on every dataset
@pytest.mark.parametrize("data,row_optimizer,method", tiered(
    [(data, opt, method) for data, opt in DATA for method in ONE_PROCESS],
    {(*DATA[i % len(DATA)], method) for i, method in enumerate(ONE_PROCESS)}))
def test_the_gpu_path_trains_the_host_paths_bits(request, data, row_optimizer, method):
    ds = request.getfixturevalue(data)
    cfg = run_cfg(method, row_optimizer, steps=30)
    host = train(cfg, ds, CPU, progress=False, evaluation=False)
    with accel.gpu_path_on_cpu():
        gpu = train(cfg, ds, CPU, progress=False, evaluation=False)
    assert gpu.summary["pipeline"] and not host.summary["pipeline"]  # auto: the pipeline runs where the GPU path does
    assert gpu.store_report.get("directory", "device") == "device"  # a cache's directory on the device
    assert bits(gpu.named_parameters(), host.named_parameters())
    assert gpu.counters == host.counters


#: the default tier: the directories that evict by recency (lru), by dataset rank (freqcache) and by next use
#: (belady); the slow tier adds device (no directory) and lfu (by counts)
@pytest.mark.parametrize("method", tiered(["device", "lru", "lfu", "freqcache", "belady"], {"lru", "freqcache", "belady"}))
def test_a_gpu_step_never_waits_for_the_device(small_dataset, method):
    """On meta (a GPU's step without its values) every step runs, the pipeline ahead: no read of device values
    (which fails there) and no wait for the device on any thread (``accel.waits``)."""
    from hotcold.train import Trainer

    cfg = run_cfg(method, "adagrad", steps=30, pipeline="on")  # the caches evict: the host path waits 11 times
    trainer = Trainer(cfg, small_dataset, torch.device("meta"), progress=False)
    before = accel.waits()
    try:
        for i in range(cfg.train.steps):
            trainer.step(i)
    finally:
        trainer.close()
    assert accel.waits_since(before) == {}
    assert trainer.store.report().get("directory", "device") == "device"


def test_scratchpipe_waits_only_on_its_movers(small_dataset):
    """ScratchPipe on meta, the pipeline ahead: its planner plans and admits, its movers wait for their copies
    out of the scratchpad; the training thread and the step pipeline's worker never wait for the device."""
    from hotcold.train import Trainer

    cfg = run_cfg("scratchpipe", "adagrad", steps=30, pipeline="on")
    trainer = Trainer(cfg, small_dataset, torch.device("meta"), progress=False)
    before = accel.waits()
    try:
        for i in range(cfg.train.steps):
            trainer.step(i)
        waited, report = accel.waits_since(before), trainer.store.report()
    finally:
        trainer.close()
    assert waited and all(thread.startswith("scratchpipe-") for thread, _ in waited), waited
    assert report["planner"] == "thread"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CUDA's sync debug mode")
@pytest.mark.parametrize("method", ["device", "lru", "lfu", "freqcache"])
def test_timed_steps_on_a_gpu_never_synchronise(small_dataset, method):
    """With CUDA's sync debug mode at "error" after the warm-up, every timed step runs: no step makes the host
    wait for the GPU (a scalar read, a data-dependent shape, a stream or event wait), and none is counted."""
    from hotcold.train import Trainer

    cfg = run_cfg(method, "adagrad", steps=12)
    trainer = Trainer(cfg, small_dataset, torch.device("cuda"), progress=False)
    try:
        for i in range(cfg.train.warmup_steps + 1):  # the warm-up and the step that captures the dense graph
            trainer.step(i)
        before = accel.waits()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for i in range(cfg.train.warmup_steps + 1, cfg.train.steps - 1):  # the last step checks divergence
                trainer.step(i)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert accel.waits_since(before) == {}
    finally:
        trainer.close()
