"""The trainer device's benchmarks of ``hotcold calibrate``: the DLRM dense step, and the GPU's copies and kernels.

On a CPU the dense step gives ``dense_flops`` and how well one-thread
processes run side by side (``host_parallel_efficiency``); on a GPU its time
per op eagerly and replayed as a CUDA graph, and ``dense_flops`` at a batch
bound by arithmetic (``dense_rates``). ``cuda_rates``: pinned copies,
device memory, a row gather and the kernel latency, timed with CUDA events.
"""
from __future__ import annotations

import multiprocessing
import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from hotcold.calibrate.rates import Calibration, MiB
from hotcold.config import ConfigError, ModelConfig
from hotcold.costmodel.workload import ModelShape
from hotcold.files import atomic_write_text
from hotcold.machine import cores
from hotcold.timing import median_ms

#: DLRM's Criteo Kaggle MLPs (bottom, top) and a batch at which their dense step is bound by arithmetic on a GPU
KAGGLE_MLPS = ((512, 256, 64, 16), (512, 256, 1))
BIG_BATCH = 1 << 18


def dense_rates(cal: Calibration, device: torch.device, op_us: float, on: str | None = None) -> None:
    """The DLRM dense step (default model sizes, Criteo's 13 features) on ``device``.

    On a CPU the step is arithmetic: ``dense_flops`` is its FLOPs over its time less its ops' dispatch.
    On a GPU a step of this size is bound by launching its ops: its time per op is ``dense_op_us``
    (eagerly) and ``dense_graph_op_us`` (replayed as a CUDA graph), and ``dense_flops`` is measured
    on a step big enough to be bound by arithmetic (``_dense_rate``)."""
    cfg = ModelConfig(embedding_dim=cal.dim, bottom_mlp=(64, cal.dim))
    k = max(1, cal.lookups // cal.batch)
    shape = ModelShape(13, k, cal.dim, cfg.bottom_mlp, cfg.top_mlp)
    step, what = _dense_step(device, cfg, k, cal.batch)
    ms = median_ms(step, cal.repeats, device)
    what = f"{what}, batch {cal.batch}; forward, backward, Adagrad"
    if device.type == "cuda":
        ops = shape.dense_ops()
        cal.put("dense_op_us", ms * 1e3 / ops, f"{what}, launched eagerly: time / its {ops} ops", on)
        graphed = _graphed_ms(device, cfg, k, cal.batch, cal.repeats)
        if isinstance(graphed, float):
            cal.put("dense_graph_op_us", graphed * 1e3 / ops,
                    f"{what}, replayed as a CUDA graph: time / its {ops} ops", on)
        else:
            cal.notes.append(f"dense_graph_op_us not measured: {graphed}")
        _dense_rate(cal, device, on)
        return
    _parallel_rate(cal, step)
    flops = shape.flops_per_sample() * cal.batch
    compute_ms = max(ms - shape.dense_ops() * op_us * 1e-3, ms * 0.05)
    cal.put("dense_flops", flops / (compute_ms * 1e6),
            f"{what}: counted FLOPs / (time less {shape.dense_ops()} ops of dispatch)", on)


def _dense_rate(cal: Calibration, device: torch.device, on: str | None) -> None:
    """``dense_flops`` on a GPU: DLRM's Kaggle MLPs at a batch whose arithmetic outlasts launching its ops."""
    cfg = ModelConfig(embedding_dim=16, bottom_mlp=KAGGLE_MLPS[0], top_mlp=KAGGLE_MLPS[1])
    shape = ModelShape(13, 26, 16, cfg.bottom_mlp, cfg.top_mlp)
    step, what = _dense_step(device, cfg, 26, BIG_BATCH)
    ms = median_ms(step, max(3, cal.repeats // 2), device)
    flops = shape.flops_per_sample() * BIG_BATCH
    launch = shape.dense_ops() * cal.rates["dense_op_us"]["value"] * 1e-3
    bound = "" if ms > 2 * launch else f" (a lower bound: the step took {ms:.2f} ms, its launches ~{launch:.2f})"
    cal.put("dense_flops", flops / (ms * 1e6),
            f"{what}, batch {BIG_BATCH}; forward, backward, Adagrad: counted FLOPs / time{bound}", on)


def _parallel_rate(cal: Calibration, step: Callable[[], None]) -> None:
    """How well this machine's cores run one-thread processes side by side (the scale-out ranks):
    the dense step alone in one forked process, then in one per core at once."""
    procs = min(cores(), 8)
    if procs < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return
    alone = _concurrent_ms(step, 1, cal.repeats)[0]
    together = statistics.median(_concurrent_ms(step, procs, cal.repeats))
    cal.put("host_parallel_efficiency", min(1.0, alone / together),
            f"the dense step (one thread) alone in a process, then in {procs} processes at once, one per core: "
            "median time alone / median time together")


def cuda_rates(cal: Calibration) -> str:
    """The GPU's rates: pinned copies each way, device memory, a row gather, a kernel; the card's name."""
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    r = cal.repeats
    n = 256 * MiB // 4
    host = torch.rand(n).pin_memory()
    gpu = torch.empty(n, device=dev)
    ms = median_ms(lambda: gpu.copy_(host, non_blocking=True), r, dev)
    cal.put("pcie_h2d_bw", n * 4 / (ms * 1e6), "pinned 256 MiB host-to-device copy, CUDA events", name)
    ms = median_ms(lambda: host.copy_(gpu, non_blocking=True), r, dev)
    cal.put("pcie_d2h_bw", n * 4 / (ms * 1e6), "pinned 256 MiB device-to-host copy, CUDA events", name)
    small = torch.rand(16).pin_memory()
    tiny = torch.empty(16, device=dev)
    ms = median_ms(lambda: [tiny.copy_(small, non_blocking=True) for _ in range(100)], r, dev)
    cal.put("pcie_latency_us", ms * 10, "100 pinned 64-byte host-to-device copies, per copy", name)
    other = torch.empty_like(gpu)
    ms = median_ms(lambda: other.copy_(gpu), r, dev)
    bw = 2 * n * 4 / (ms * 1e6)
    cal.put("device_memory_bw", bw, "device copy of 256 MiB, bytes read + written / time", name)
    rows = 1024 * MiB // (4 * cal.dim)
    table = torch.rand(rows, cal.dim, device=dev)
    ids = torch.randint(0, rows, (cal.lookups * 16,), device=dev)
    ms = median_ms(lambda: table.index_select(0, ids), r, dev)
    moved = 2 * ids.numel() * 4 * cal.dim  # read + write
    cal.put("device_gather_efficiency", min(1.0, moved / (ms * 1e6) / bw),
            f"index_select of {ids.numel()} uniform rows of {cal.dim} floats from a 1 GiB table: "
            "bytes read + written / time, as a share of device_memory_bw", name)
    a = torch.ones(1, device=dev)
    ms = median_ms(lambda: [a.add_(1) for _ in range(1000)], r, dev)
    cal.put("device_kernel_us", ms, "1000 one-element additions back to back, per kernel (CUDA events)", name)
    return name


def _dense_step(device: torch.device, cfg: ModelConfig, tables: int, batch: int
                ) -> tuple[Callable[[], torch.Tensor], str]:
    """One DLRM dense step (forward, backward, dense Adagrad) on random inputs, and what it is in words."""
    from hotcold.model.dlrm import DLRM
    from hotcold.model.optim import DenseAdagrad

    torch.manual_seed(0)
    model = DLRM(13, tables, cfg).to(device)
    opt = DenseAdagrad(model.parameters(), lr=0.01, eps=1e-8)
    dense = torch.rand(batch, 13, device=device)
    emb = torch.rand(batch, tables, cfg.embedding_dim, device=device, requires_grad=True)
    labels = torch.randint(0, 2, (batch,), device=device).float()
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        emb.grad = None
        loss = loss_fn(model(dense, emb), labels)
        loss.backward()
        opt.step()
        return loss

    return step, (f"DLRM dense step (13 dense, {tables} tables, D={cfg.embedding_dim}, MLPs "
                  f"{list(cfg.bottom_mlp)}/{list(cfg.top_mlp)}")


def _graphed_ms(device: torch.device, cfg: ModelConfig, tables: int, batch: int, repeats: int) -> float | str:
    """The median ms of the dense step replayed as a CUDA graph (``dense_step.CudaGraphs``), or why not."""
    from hotcold.dense_step import CudaGraphs

    step, _ = _dense_step(device, cfg, tables, batch)
    graphs = CudaGraphs(device)
    try:
        with graphs.on_side():  # warm-up on the capture's stream, as capture requires
            for _ in range(3):
                step()
        graph, _ = graphs.capture(step)
    except Exception as e:  # noqa: BLE001 - the profile says why the rate is missing
        return f"capture failed ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
    return median_ms(graph.replay, repeats, device)


def _concurrent_ms(fn: Callable[[], Any], procs: int, repeats: int) -> list[float]:
    """Median ms of ``fn`` in each of ``procs`` forked one-thread processes started together."""
    import json

    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs)

    def child(path: str) -> None:
        torch.set_num_threads(1)
        barrier.wait()
        atomic_write_text(Path(path), json.dumps(median_ms(fn, repeats)))

    with tempfile.TemporaryDirectory(prefix="hotcold-parallel-") as tmp:
        paths = [str(Path(tmp) / f"{i}.json") for i in range(procs)]
        children = [ctx.Process(target=child, args=(path,)) for path in paths]
        for c in children:
            c.start()
        for c in children:
            c.join()
        if any(c.exitcode for c in children):
            raise ConfigError(f"calibrate: a benchmark process failed (exit codes {[c.exitcode for c in children]})")
        return [float(json.loads(Path(path).read_text())) for path in paths]
