"""The network benchmark of ``hotcold calibrate``: loopback gloo all-to-alls, fitted to latency + bytes / bandwidth.

The scale-out runs here are P gloo processes on this machine whose nodes are
simulated, so two one-thread processes time ``all_to_all_single`` at a few
sizes (``gloo_all_to_all_ms``) and a line is fitted (``fit_latency_bandwidth``).
"""
from __future__ import annotations

import datetime as dt
import socket
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from hotcold.calibrate.rates import Calibration
from hotcold.config import ConfigError
from hotcold.files import atomic_write_text
from hotcold.timing import time_ms

GLOO_BYTES = (1 << 10, 16 << 10, 128 << 10, 512 << 10, 2 << 20)  # bytes each rank sends its peer


def network_rates(cal: Calibration, sizes: tuple[int, ...] = GLOO_BYTES) -> None:
    """Loopback gloo collectives: the scale-out runs' P processes on this machine, one thread each."""
    points = gloo_all_to_all_ms(sizes, max(5, cal.repeats))
    latency_us, bw = fit_latency_bandwidth(points)
    sizes_kib = ", ".join(f"{b // 1024}" for b, _ in points)
    how = (f"all_to_all_single between 2 gloo processes (1 thread each) on 127.0.0.1, each sending its peer "
           f"{sizes_kib} KiB; median of repeats per size, then a weighted least-squares line ms = latency + "
           "bytes / bandwidth")
    cal.put("collective_latency_us", latency_us, f"{how}: its intercept")
    for key in ("intra_node_bw", "inter_node_bw"):
        cal.put(key, bw, f"{how}: 1 / its slope. The scale-out runs here simulate their nodes "
                         "(ranks_per_node): intra- and inter-node traffic both go over loopback, at this rate")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _gloo_worker(rank: int, world: int, port: int, sizes: tuple[int, ...], repeats: int, out: str) -> None:
    """One rank of the loopback benchmark; rank 0 writes {bytes: median ms} to ``out`` as JSON."""
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=60))
    try:
        result = {}
        for nbytes in sizes:
            src = torch.rand(world * max(1, nbytes // 4))
            dst = torch.empty_like(src)
            times = []
            for r in range(repeats + 1):
                dist.barrier()
                ms = time_ms(lambda: dist.all_to_all_single(dst, src))
                if r:
                    times.append(ms)
            result[str(nbytes)] = statistics.median(times)
        if rank == 0:
            atomic_write_text(Path(out), json.dumps(result))
    finally:
        dist.destroy_process_group()


def gloo_all_to_all_ms(sizes: tuple[int, ...], repeats: int) -> list[tuple[int, float]]:
    """(bytes each rank sends its peer, median ms) of ``all_to_all_single`` between two gloo processes
    (forked; spawned where there is no fork) on 127.0.0.1, one thread each."""
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="hotcold-gloo-") as tmp:
        out = Path(tmp) / "times.json"
        # fork where there is one: a spawned child spends seconds importing torch; the children use one
        # thread each, so the parent's thread pools are never entered after the fork
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        mp.start_processes(_gloo_worker, args=(2, free_port(), tuple(sizes), repeats, str(out)), nprocs=2,
                           join=True, start_method=method)
        result = json.loads(out.read_text())
    return [(int(b), float(ms)) for b, ms in result.items()]


def fit_latency_bandwidth(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(latency us, bandwidth GB/s) of the line ``ms = latency + bytes / bandwidth`` through
    (bytes, ms) points, least squares weighted by 1 / ms^2 (relative errors: the small sizes fix the
    latency, the large ones the bandwidth). A negative intercept is a latency below resolution: 0."""
    if len({b for b, _ in points}) < 2 or any(ms <= 0 or b < 0 for b, ms in points):
        raise ConfigError(f"collective fit: need positive times at two sizes or more, got {points}")
    x = np.array([b for b, _ in points], dtype=np.float64)
    y = np.array([ms for _, ms in points], dtype=np.float64)
    w = 1.0 / y**2
    a = np.stack([np.ones_like(x), x], axis=1) * np.sqrt(w)[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(a, y * np.sqrt(w), rcond=None)
    if slope <= 0:
        raise ConfigError(f"collective fit: the times do not grow with the bytes sent ({points}): "
                          "the machine was too busy to measure; calibrate again on a quieter machine")
    return max(float(intercept), 0.0) * 1e3, 1.0 / (float(slope) * 1e6)
