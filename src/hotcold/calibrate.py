"""``hotcold calibrate``: measure this machine's rates with micro-benchmarks and write a hardware profile.

Each benchmark times the operation the stores really run (``index_select``
gathers, ``index_copy_`` scatters, ``to_global`` and ``torch.unique`` id
planning, the cache directory's planning, the DLRM dense step), repeats it
and keeps the median. Tables are larger than the last-level cache and ids are
drawn per table with the Criteo-style generator's power law, so gathers see
the runs' repeats and cached hot rows (uniform ids over a table beyond the
cache cost some 20x more a row here).

On a CPU the trainer device is host memory and ``.to(cpu)`` is a no-op, so
the profile is of kind ``cpu`` with host rates only. With ``device="cuda"``
it adds pinned H2D/D2H bandwidth, device bandwidth, a device row gather's
share of it and the kernel latency, timed with CUDA events, and the dense
rate on the GPU. Collective rates need several GPUs and are not measured.
"""
from __future__ import annotations

import datetime as dt
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hotcold.config import ConfigError, ModelConfig
from hotcold.costmodel import ALL_RATES, ModelShape, profile_from_dict
from hotcold.files import atomic_write_text

MiB = 1 << 20


def _median_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    """Median wall ms of ``fn`` over ``repeats`` calls, after one warm-up call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        sync()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def _cuda_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median ms of ``fn`` by CUDA events."""
    fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


class Calibration:
    """The measured rates, each with a source naming its benchmark, the processor and the date."""

    def __init__(self, dim: int, batch_size: int, lookups: int, repeats: int, table_mib: int) -> None:
        self.dim, self.batch, self.lookups, self.repeats = dim, batch_size, lookups, repeats
        self.rows = table_mib * MiB // (4 * dim)
        self.rates: dict[str, dict[str, Any]] = {}
        self.when = dt.date.today().isoformat()
        self.cpu = _cpu_name()
        self.gen = torch.Generator().manual_seed(0)

    def put(self, key: str, value: float, how: str, on: str | None = None) -> None:
        self.rates[key] = {"value": float(max(value, 1e-6)), "unit": ALL_RATES[key][0],
                           "source": f"measured by hotcold calibrate on {on or self.cpu}, {self.when}: {how}"}

    # -- host ---------------------------------------------------------------------------------------

    def host(self) -> None:
        """Host rates; the benchmarks run interleaved, round by round, so a slow spell of a shared
        machine lands on all of them a little rather than on one of them wholly."""
        from hotcold.data.format import to_global

        n = 64 * MiB // 4
        src, dst = torch.rand(n), torch.empty(n)
        table = torch.rand(self.rows, self.dim)
        row = 4 * self.dim
        k = max(1, self.lookups // self.batch)
        ids = torch.from_numpy(_powerlaw_ids(self.batch, k, self.rows, 0))
        uniq = torch.unique(ids)
        uniq = uniq[torch.randperm(uniq.numel(), generator=self.gen)]
        vals = torch.rand(uniq.numel(), self.dim)
        col = np.random.default_rng(0).integers(0, 100_000, size=(self.batch, k))
        offsets = np.arange(k, dtype=np.int64) * 100_000
        a = torch.ones(1)
        ms = _interleaved({
            "copy": lambda: dst.copy_(src),
            "gather": lambda: table.index_select(0, ids),
            "scatter": lambda: table.index_copy_(0, uniq, vals),
            "plan": lambda: torch.from_numpy(to_global(col, offsets)).reshape(-1),
            "unique": lambda: torch.unique(ids, return_inverse=True, return_counts=True),
            "op": lambda: [a.add(a) for _ in range(1000)],
        }, self.repeats)
        bw = n * 4 / (ms["copy"] * 1e6)
        self.put("host_memory_bw", bw, "copy of a 64 MiB float32 tensor, bytes copied / time")
        mib = self.rows * row // MiB
        self.put("host_gather_row_ns", ms["gather"] * 1e6 / self.lookups - row / bw,
                 f"index_select of a batch of {ids.numel()} ids ({k} tables, power law 1.3 as the Criteo-style "
                 f"data's) from a {mib} MiB table of {self.dim} floats, per row, less its bytes at host_memory_bw")
        self.put("host_scatter_row_ns", ms["scatter"] * 1e6 / uniq.numel() - row / bw,
                 f"index_copy_ of the {uniq.numel()} distinct rows of those ids into the same table, per row, "
                 "less its bytes at host_memory_bw")
        self.put("host_id_plan_ns", ms["plan"] * 1e6 / col.size, f"to_global of a [{self.batch}, {k}] id batch, per id")
        self.put("host_unique_ns", ms["unique"] * 1e6 / self.lookups,
                 f"torch.unique (inverse, counts) of those {ids.numel()} ids, per id")
        self.put("host_op_us", ms["op"], "1000 additions of one-element tensors, per op")
        self._directory()

    def _directory(self) -> None:
        """LRU cache directory in steady state at two capacities: per unique row and per slot scanned."""
        from hotcold.trace.policies import CacheDirectory, cache_policy

        rng = np.random.default_rng(1)
        u = max(1, self.lookups // 5)
        per_cap = {}
        for cap in (4 * u, 32 * u):
            n = 64 * cap
            d = CacheDirectory(n, cap, cache_policy("lru", n, cap)[0])
            fill = cap // u + 2  # batches that fill the cache: later steps evict
            batches = [np.unique(rng.integers(0, n, size=u)) for _ in range(fill + self.repeats)]
            for b in batches[:fill]:
                d.access(b, np.ones_like(b))
            times = []
            for b in batches[fill:]:
                t0 = time.perf_counter_ns()
                d.access(b, np.ones_like(b))
                times.append((time.perf_counter_ns() - t0) / 1e6)
            per_cap[cap] = (statistics.median(times), float(np.mean([b.size for b in batches[fill:]])))
        (c1, (t1, u1)), (c2, (t2, _)) = sorted(per_cap.items())
        slot_ns = max((t2 - t1) * 1e6 / (c2 - c1), 1e-3)
        self.put("host_directory_slot_ns", slot_ns,
                 f"LRU CacheDirectory.access in steady state at {c1} and {c2} slots: the time's slope per slot")
        self.put("host_directory_row_ns", (t1 * 1e6 - slot_ns * c1) / u1,
                 f"the same at {c1} slots, less the slots' share, per unique row ({u1:.0f} a step)")

    # -- dense --------------------------------------------------------------------------------------

    def dense(self, device: torch.device, op_us: float, on: str | None = None) -> None:
        """The DLRM dense step (default model sizes, Criteo's 13 features) on ``device``."""
        from hotcold.model.dlrm import DLRM
        from hotcold.model.optim import DenseAdagrad

        cfg = ModelConfig(embedding_dim=self.dim, bottom_mlp=(64, self.dim))
        k = max(1, self.lookups // self.batch)
        shape = ModelShape(13, k, self.dim, cfg.bottom_mlp, cfg.top_mlp)
        torch.manual_seed(0)
        model = DLRM(13, k, cfg).to(device)
        opt = DenseAdagrad(model.parameters(), lr=0.01, eps=1e-8)
        dense = torch.rand(self.batch, 13, device=device)
        emb = torch.rand(self.batch, k, self.dim, device=device, requires_grad=True)
        labels = torch.randint(0, 2, (self.batch,), device=device).float()
        loss_fn = torch.nn.BCEWithLogitsLoss()

        def step() -> None:
            opt.zero_grad()
            loss_fn(model(dense, emb), labels).backward()
            opt.step()

        if device.type == "cuda":
            ms = _cuda_ms(step, self.repeats)
        else:
            ms = _median_ms(step, self.repeats)
        flops = shape.flops_per_sample() * self.batch
        compute_ms = max(ms - shape.dense_ops() * op_us * 1e-3, ms * 0.05)
        self.put("dense_flops", flops / (compute_ms * 1e6),
                 f"DLRM dense step (13 dense, {k} tables, D={self.dim}, MLPs {list(cfg.bottom_mlp)}/"
                 f"{list(cfg.top_mlp)}, batch {self.batch}; forward, backward, Adagrad): counted FLOPs / "
                 f"(time less {shape.dense_ops()} ops of dispatch)", on)

    # -- CUDA ---------------------------------------------------------------------------------------

    def cuda(self) -> str:
        dev = torch.device("cuda")
        name = torch.cuda.get_device_name(dev)
        r = self.repeats
        n = 256 * MiB // 4
        host = torch.rand(n).pin_memory()
        gpu = torch.empty(n, device=dev)
        ms = _cuda_ms(lambda: gpu.copy_(host, non_blocking=True), r)
        self.put("pcie_h2d_bw", n * 4 / (ms * 1e6), "pinned 256 MiB host-to-device copy, CUDA events", name)
        ms = _cuda_ms(lambda: host.copy_(gpu, non_blocking=True), r)
        self.put("pcie_d2h_bw", n * 4 / (ms * 1e6), "pinned 256 MiB device-to-host copy, CUDA events", name)
        small = torch.rand(16).pin_memory()
        tiny = torch.empty(16, device=dev)
        ms = _cuda_ms(lambda: [tiny.copy_(small, non_blocking=True) for _ in range(100)], r)
        self.put("pcie_latency_us", ms * 10, "100 pinned 64-byte host-to-device copies, per copy", name)
        other = torch.empty_like(gpu)
        ms = _cuda_ms(lambda: other.copy_(gpu), r)
        bw = 2 * n * 4 / (ms * 1e6)
        self.put("device_memory_bw", bw, "device copy of 256 MiB, bytes read + written / time", name)
        rows = 1024 * MiB // (4 * self.dim)
        table = torch.rand(rows, self.dim, device=dev)
        ids = torch.randint(0, rows, (self.lookups * 16,), device=dev)
        ms = _cuda_ms(lambda: table.index_select(0, ids), r)
        moved = 2 * ids.numel() * 4 * self.dim  # read + write
        self.put("device_gather_efficiency", min(1.0, moved / (ms * 1e6) / bw),
                 f"index_select of {ids.numel()} uniform rows of {self.dim} floats from a 1 GiB table: "
                 "bytes read + written / time, as a share of device_memory_bw", name)
        a = torch.ones(1, device=dev)
        ms = _cuda_ms(lambda: [a.add_(1) for _ in range(1000)], r)
        self.put("device_kernel_us", ms, "1000 one-element additions back to back, per kernel (CUDA events)", name)
        return name


def _interleaved(benchmarks: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall ms of each benchmark over ``repeats`` rounds; each round runs every benchmark once
    (after one warm-up round)."""
    times: dict[str, list[float]] = {k: [] for k in benchmarks}
    for r in range(repeats + 1):
        for name, fn in benchmarks.items():
            t0 = time.perf_counter_ns()
            fn()
            if r:
                times[name].append((time.perf_counter_ns() - t0) / 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def _powerlaw_ids(batch: int, columns: int, rows: int, seed: int, exponent: float = 1.3) -> np.ndarray:
    """Global rows [batch * columns] of a batch over ``columns`` tables of ``rows // columns`` rows each,
    id rank r of each table drawn with P ~ (r+1)^-exponent (the Criteo-style generator's law, exponent 1.3)
    and ranks scattered over the table by a fixed permutation."""
    rng = np.random.default_rng(seed)
    per = max(1, rows // columns)
    cdf = np.cumsum(np.arange(1, per + 1, dtype=np.float64) ** -exponent)
    ranks = np.searchsorted(cdf, rng.random((batch, columns)) * cdf[-1])
    ids = rng.permutation(per)[np.minimum(ranks, per - 1)]
    return (ids + np.arange(columns) * per).reshape(-1).astype(np.int64)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def calibrate(device: str = "cpu", dim: int = 16, batch_size: int = 1024, lookups: int | None = None,
              repeats: int = 15, table_mib: int = 64, name: str | None = None) -> dict[str, Any]:
    """Measure the rates; the profile as a mapping (validated by ``costmodel.profile_from_dict``)."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"calibrate: device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("calibrate: --device cuda, but torch sees no GPU")
    for key, v in (("dim", dim), ("batch_size", batch_size), ("repeats", repeats), ("table_mib", table_mib)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"calibrate: {key} must be a positive integer, got {v!r}")
    cal = Calibration(dim, batch_size, lookups or 26 * batch_size, repeats, table_mib)
    cal.host()
    on = None
    if device == "cuda":
        on = cal.cuda()
        cal.dense(torch.device("cuda"), max(cal.rates["host_op_us"]["value"],
                                            cal.rates["device_kernel_us"]["value"]), on)
    else:
        cal.dense(torch.device("cpu"), cal.rates["host_op_us"]["value"])
    label = on or cal.cpu
    profile = {"name": name or f"calibrated-{device}",
               "description": f"{label}, torch {torch.__version__}, measured by hotcold calibrate on {cal.when}",
               "kind": "gpu" if device == "cuda" else "cpu", "rates": cal.rates}
    profile_from_dict(profile, "calibrate")  # what we write must load
    return profile


def write_profile(profile: dict[str, Any], out: Path) -> Path:
    import yaml

    return atomic_write_text(Path(out), yaml.safe_dump(profile, sort_keys=False, width=120))
