"""``hotcold calibrate``: measure this machine's rates with micro-benchmarks and write a hardware profile.

The cost model prices counters with a profile's rates; this verb measures
them here, so that modelled and measured times can be compared on the
machine that ran the runs. Each benchmark times the operation the stores
really run, on tables and ids shaped like the runs' (``Calibration``); on a
CPU the profile is of kind ``cpu`` (host memory is the trainer device),
with ``--device cuda`` it adds the GPU's rates (``calibrate``). The rates:
docs/costmodel.md, "Hardware profiles" and "Calibration".
"""
from __future__ import annotations

import datetime as dt
import multiprocessing
import socket
import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hotcold.config import ConfigError, ModelConfig
from hotcold.costmodel import ALL_RATES, ModelShape, profile_from_dict
from hotcold.data.powerlaw import draw_ranks, powerlaw_cdf
from hotcold.files import atomic_write_text
from hotcold.machine import CACHE_SOURCE, cores, cpu_name, last_level_cache_bytes
from hotcold.timing import median_ms, time_ms

MiB = 1 << 20
SMALL_TABLE_MIB = 2          # a table that fits in any server's last-level cache
DATA_BATCHES = 200           # the calibration dataset's rows, in batches (the default runs' split: ~220)
GLOO_BYTES = (1 << 10, 16 << 10, 128 << 10, 512 << 10, 2 << 20)  # bytes each rank sends its peer


class Calibration:
    """The measured rates, each with a source naming its benchmark, the processor and the date.

    Each benchmark times the operation the stores really run (``index_select``
    gathers, ``index_copy_`` scatters, ``to_global`` and ``RowGroups.of`` id
    planning, the cache directory's planning, the DLRM dense step), repeats it
    and keeps the median (``timing.median_ms``). Tables are larger than the
    last-level cache and ids are drawn per table with the Criteo-style
    generator's power law (``data.powerlaw``), so gathers see the runs' repeats
    and cached hot rows (uniform ids over a table beyond the cache cost some 20x
    more a row here). The machine's facts (CPU, cores, cache) come from
    ``hotcold.machine``.
    """

    def __init__(self, dim: int, batch_size: int, lookups: int, repeats: int, table_mib: int) -> None:
        self.dim, self.batch, self.lookups, self.repeats = dim, batch_size, lookups, repeats
        self.rows = table_mib * MiB // (4 * dim)
        self.rates: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []   # rates not measured, and why
        self.when = dt.date.today().isoformat()
        self.cpu = f"{cpu_name()} ({torch.get_num_threads()} threads)"
        self.gen = torch.Generator().manual_seed(0)

    def put(self, key: str, value: float, how: str, on: str | None = None) -> None:
        self.rates[key] = {"value": float(max(value, 1e-6)), "unit": ALL_RATES[key][0],
                           "source": f"measured by hotcold calibrate on {on or self.cpu}, {self.when}: {how}"}

    # -- host ---------------------------------------------------------------------------------------

    def host(self) -> None:
        """Host rates; the benchmarks run interleaved, round by round, so a slow spell of a shared
        machine lands on all of them a little rather than on one of them wholly.

        Gathers and scatters are also timed on a table of ``SMALL_TABLE_MIB`` that
        fits in the last-level cache (the cost model uses those rates for tables that
        fit: cache slots, scratchpads, per-batch buffers), and the data phase is timed
        as the loader runs it: memory-mapped reads of a batch of sorted rows of a
        dataset written in the real format."""
        from hotcold.data.format import to_global
        from hotcold.embedding.rows import RowGroups

        n = 64 * MiB // 4
        src, dst = torch.rand(n), torch.empty(n)
        table = torch.rand(self.rows, self.dim)
        row = 4 * self.dim
        k = max(1, self.lookups // self.batch)
        ids = torch.from_numpy(_powerlaw_ids(self.batch, k, self.rows, 0))
        uniq = torch.unique(ids)
        uniq = uniq[torch.randperm(uniq.numel(), generator=self.gen)]
        vals = torch.rand(uniq.numel(), self.dim)
        small_rows = SMALL_TABLE_MIB * MiB // row
        small = torch.rand(small_rows, self.dim)
        small_ids = torch.from_numpy(_powerlaw_ids(self.batch, k, small_rows, 2))
        small_uniq = torch.unique(small_ids)
        small_uniq = small_uniq[torch.randperm(small_uniq.numel(), generator=self.gen)]
        small_vals = torch.rand(small_uniq.numel(), self.dim)
        col = np.random.default_rng(0).integers(0, 100_000, size=(self.batch, k))
        offsets = np.arange(k, dtype=np.int64) * 100_000
        a = torch.ones(1)
        with tempfile.TemporaryDirectory(prefix="hotcold-calibrate-") as tmp:
            batches = _data_batches(Path(tmp), self.batch, k, self.repeats + 1)
            ms = _interleaved({
                "copy": lambda: dst.copy_(src),
                "gather": lambda: table.index_select(0, ids),
                "scatter": lambda: table.index_copy_(0, uniq, vals),
                "small_gather": lambda: small.index_select(0, small_ids),
                "small_scatter": lambda: small.index_copy_(0, small_uniq, small_vals),
                "data": batches.__next__,
                "plan": lambda: torch.from_numpy(to_global(col, offsets)).reshape(-1),
                "unique": lambda: RowGroups.of(ids),
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
        self.put("host_cached_gather_row_ns", ms["small_gather"] * 1e6 / small_ids.numel(),
                 f"index_select of {small_ids.numel()} power-law ids from a {SMALL_TABLE_MIB} MiB table of "
                 f"{self.dim} floats (it fits in the last-level cache), per row, its bytes included")
        self.put("host_cached_scatter_row_ns", ms["small_scatter"] * 1e6 / small_uniq.numel(),
                 f"index_copy_ of their {small_uniq.numel()} distinct rows into the same table, per row, "
                 "its bytes included")
        sample = (13 + k + 1) * 4
        self.put("host_data_sample_ns", ms["data"] * 1e6 / self.batch - sample / bw,
                 f"BatchLoader reading a batch of {self.batch} sorted random rows of a memory-mapped dataset of "
                 f"{DATA_BATCHES} batches (13 float32 dense, {k} int32 ids, a float32 label: {sample} bytes a "
                 "sample; pages touched before), per sample, less its bytes at host_memory_bw")
        self.put("host_cache_mib", *_last_level_cache_mib())
        self.put("host_cores", cores(), "the cores this process may run on (os.sched_getaffinity)")
        self.put("host_id_plan_ns", ms["plan"] * 1e6 / col.size, f"to_global of a [{self.batch}, {k}] id batch, per id")
        self.put("host_unique_ns", ms["unique"] * 1e6 / self.lookups,
                 f"RowGroups.of (the stores' one stable sort grouping lookups by row) of those {ids.numel()} ids, per id")
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
            times = [time_ms(lambda: d.access(b, np.ones_like(b))) for b in batches[fill:]]
            per_cap[cap] = (statistics.median(times), float(np.mean([b.size for b in batches[fill:]])))
        (c1, (t1, u1)), (c2, (t2, _)) = sorted(per_cap.items())
        slot_ns = max((t2 - t1) * 1e6 / (c2 - c1), 1e-3)
        self.put("host_directory_slot_ns", slot_ns,
                 f"LRU CacheDirectory.access in steady state at {c1} and {c2} slots: the time's slope per slot")
        self.put("host_directory_row_ns", (t1 * 1e6 - slot_ns * c1) / u1,
                 f"the same at {c1} slots, less the slots' share, per unique row ({u1:.0f} a step)")

    # -- collectives ------------------------------------------------------------------------------

    def network(self, sizes: tuple[int, ...] = GLOO_BYTES) -> None:
        """Loopback gloo collectives: the scale-out runs' P processes on this machine, one thread each."""
        points = gloo_all_to_all_ms(sizes, max(5, self.repeats))
        latency_us, bw = fit_latency_bandwidth(points)
        sizes_kib = ", ".join(f"{b // 1024}" for b, _ in points)
        how = (f"all_to_all_single between 2 gloo processes (1 thread each) on 127.0.0.1, each sending its peer "
               f"{sizes_kib} KiB; median of repeats per size, then a weighted least-squares line ms = latency + "
               "bytes / bandwidth")
        self.put("collective_latency_us", latency_us, f"{how}: its intercept")
        for key in ("intra_node_bw", "inter_node_bw"):
            self.put(key, bw, f"{how}: 1 / its slope. The scale-out runs here simulate their nodes "
                              "(ranks_per_node): intra- and inter-node traffic both go over loopback, at this rate")

    # -- dense --------------------------------------------------------------------------------------

    def dense(self, device: torch.device, op_us: float, on: str | None = None) -> None:
        """The DLRM dense step (default model sizes, Criteo's 13 features) on ``device``.

        On a CPU the step is arithmetic: ``dense_flops`` is its FLOPs over its time less its ops' dispatch.
        On a GPU a step of this size is bound by launching its ops: its time per op is ``dense_op_us``
        (eagerly) and ``dense_graph_op_us`` (replayed as a CUDA graph), and ``dense_flops`` is measured
        on a step big enough to be bound by arithmetic (``_dense_rate``)."""
        cfg = ModelConfig(embedding_dim=self.dim, bottom_mlp=(64, self.dim))
        k = max(1, self.lookups // self.batch)
        shape = ModelShape(13, k, self.dim, cfg.bottom_mlp, cfg.top_mlp)
        step, what = _dense_step(device, cfg, k, self.batch)
        ms = median_ms(step, self.repeats, device)
        what = f"{what}, batch {self.batch}; forward, backward, Adagrad"
        if device.type == "cuda":
            ops = shape.dense_ops()
            self.put("dense_op_us", ms * 1e3 / ops, f"{what}, launched eagerly: time / its {ops} ops", on)
            graphed = _graphed_ms(device, cfg, k, self.batch, self.repeats)
            if isinstance(graphed, float):
                self.put("dense_graph_op_us", graphed * 1e3 / ops,
                         f"{what}, replayed as a CUDA graph: time / its {ops} ops", on)
            else:
                self.notes.append(f"dense_graph_op_us not measured: {graphed}")
            self._dense_rate(device, on)
            return
        self._parallel(step)
        flops = shape.flops_per_sample() * self.batch
        compute_ms = max(ms - shape.dense_ops() * op_us * 1e-3, ms * 0.05)
        self.put("dense_flops", flops / (compute_ms * 1e6),
                 f"{what}: counted FLOPs / (time less {shape.dense_ops()} ops of dispatch)", on)

    def _dense_rate(self, device: torch.device, on: str | None) -> None:
        """``dense_flops`` on a GPU: DLRM's Kaggle MLPs at a batch whose arithmetic outlasts launching its ops."""
        cfg = ModelConfig(embedding_dim=16, bottom_mlp=KAGGLE_MLPS[0], top_mlp=KAGGLE_MLPS[1])
        shape = ModelShape(13, 26, 16, cfg.bottom_mlp, cfg.top_mlp)
        step, what = _dense_step(device, cfg, 26, BIG_BATCH)
        ms = median_ms(step, max(3, self.repeats // 2), device)
        flops = shape.flops_per_sample() * BIG_BATCH
        launch = shape.dense_ops() * self.rates["dense_op_us"]["value"] * 1e-3
        bound = "" if ms > 2 * launch else f" (a lower bound: the step took {ms:.2f} ms, its launches ~{launch:.2f})"
        self.put("dense_flops", flops / (ms * 1e6),
                 f"{what}, batch {BIG_BATCH}; forward, backward, Adagrad: counted FLOPs / time{bound}", on)

    def _parallel(self, step: Callable[[], None]) -> None:
        """How well this machine's cores run one-thread processes side by side (the scale-out ranks):
        the dense step alone in one forked process, then in one per core at once."""
        procs = min(cores(), 8)
        if procs < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return
        alone = _concurrent_ms(step, 1, self.repeats)[0]
        together = statistics.median(_concurrent_ms(step, procs, self.repeats))
        self.put("host_parallel_efficiency", min(1.0, alone / together),
                 f"the dense step (one thread) alone in a process, then in {procs} processes at once, one per core: "
                 "median time alone / median time together")

    # -- CUDA ---------------------------------------------------------------------------------------

    def cuda(self) -> str:
        dev = torch.device("cuda")
        name = torch.cuda.get_device_name(dev)
        r = self.repeats
        n = 256 * MiB // 4
        host = torch.rand(n).pin_memory()
        gpu = torch.empty(n, device=dev)
        ms = median_ms(lambda: gpu.copy_(host, non_blocking=True), r, dev)
        self.put("pcie_h2d_bw", n * 4 / (ms * 1e6), "pinned 256 MiB host-to-device copy, CUDA events", name)
        ms = median_ms(lambda: host.copy_(gpu, non_blocking=True), r, dev)
        self.put("pcie_d2h_bw", n * 4 / (ms * 1e6), "pinned 256 MiB device-to-host copy, CUDA events", name)
        small = torch.rand(16).pin_memory()
        tiny = torch.empty(16, device=dev)
        ms = median_ms(lambda: [tiny.copy_(small, non_blocking=True) for _ in range(100)], r, dev)
        self.put("pcie_latency_us", ms * 10, "100 pinned 64-byte host-to-device copies, per copy", name)
        other = torch.empty_like(gpu)
        ms = median_ms(lambda: other.copy_(gpu), r, dev)
        bw = 2 * n * 4 / (ms * 1e6)
        self.put("device_memory_bw", bw, "device copy of 256 MiB, bytes read + written / time", name)
        rows = 1024 * MiB // (4 * self.dim)
        table = torch.rand(rows, self.dim, device=dev)
        ids = torch.randint(0, rows, (self.lookups * 16,), device=dev)
        ms = median_ms(lambda: table.index_select(0, ids), r, dev)
        moved = 2 * ids.numel() * 4 * self.dim  # read + write
        self.put("device_gather_efficiency", min(1.0, moved / (ms * 1e6) / bw),
                 f"index_select of {ids.numel()} uniform rows of {self.dim} floats from a 1 GiB table: "
                 "bytes read + written / time, as a share of device_memory_bw", name)
        a = torch.ones(1, device=dev)
        ms = median_ms(lambda: [a.add_(1) for _ in range(1000)], r, dev)
        self.put("device_kernel_us", ms, "1000 one-element additions back to back, per kernel (CUDA events)", name)
        return name


#: DLRM's Criteo Kaggle MLPs (bottom, top) and a batch at which their dense step is bound by arithmetic on a GPU
KAGGLE_MLPS = ((512, 256, 64, 16), (512, 256, 1))
BIG_BATCH = 1 << 18


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


def _free_port() -> int:
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
        mp.start_processes(_gloo_worker, args=(2, _free_port(), tuple(sizes), repeats, str(out)), nprocs=2,
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


def _data_batches(root: Path, batch: int, columns: int, count: int) -> Any:
    """An iterator of ``count`` training batches (``BatchLoader``, global shuffle) over a dataset of
    ``DATA_BATCHES`` batches written under ``root`` in the real format, its pages read once before."""
    from hotcold.data.format import Dataset, write_dataset
    from hotcold.data.loader import BatchLoader

    n = DATA_BATCHES * batch
    rng = np.random.default_rng(3)
    test = max(1, n // 100)
    write_dataset(root / "data", dense=rng.random((n, 13), dtype=np.float32),
                  sparse=rng.integers(0, 1000, size=(n, columns), dtype=np.int32),
                  labels=(rng.random(n) < 0.25).astype(np.float32), cardinalities=[1000] * columns,
                  splits={"train": (0, n - test), "test": (n - test, n)}, meta={"name": "calibrate"})
    ds = Dataset.open(root / "data")
    for arr in (ds.dense, ds.sparse, ds.labels):
        float(np.asarray(arr).sum())
    return iter(BatchLoader(ds, "train", batch, steps=count, seed=0))


def _last_level_cache_mib() -> tuple[float, str]:
    """(MiB, how it was found) of the largest data or unified CPU cache the kernel reports."""
    best = last_level_cache_bytes()
    if best:
        return best / MiB, CACHE_SOURCE
    return float(SMALL_TABLE_MIB), (f"not reported by the system: the {SMALL_TABLE_MIB} MiB table of the cached-row "
                                    "benchmarks is the largest known to fit")


def _interleaved(benchmarks: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall ms of each benchmark over ``repeats`` rounds; each round runs every benchmark once
    (after one warm-up round)."""
    times: dict[str, list[float]] = {k: [] for k in benchmarks}
    for r in range(repeats + 1):
        for name, fn in benchmarks.items():
            ms = time_ms(fn)
            if r:
                times[name].append(ms)
    return {k: statistics.median(v) for k, v in times.items()}


def _powerlaw_ids(batch: int, columns: int, rows: int, seed: int, exponent: float = 1.3) -> np.ndarray:
    """Global rows [batch * columns] of a batch over ``columns`` tables of ``rows // columns`` rows each,
    id rank r of each table drawn with P ~ (r+1)^-exponent (the Criteo-style generator's law, exponent 1.3)
    and ranks scattered over the table by a fixed permutation."""
    rng = np.random.default_rng(seed)
    per = max(1, rows // columns)
    ranks = draw_ranks(rng, (batch, columns), powerlaw_cdf(per, exponent))
    ids = rng.permutation(per)[ranks]
    return (ids + np.arange(columns) * per).reshape(-1).astype(np.int64)


def calibrate(device: str = "cpu", dim: int = 16, batch_size: int = 1024, lookups: int | None = None,
              repeats: int = 15, table_mib: int = 64, name: str | None = None, network: bool = True,
              threads: int | None = None) -> dict[str, Any]:
    """Measure the rates; the profile as a mapping (validated by ``costmodel.profile_from_dict``).

    ``network``: on a CPU, also time loopback gloo collectives (two spawned processes, a few seconds).
    ``threads``: torch's intra-op threads for the benchmarks, as the training jobs set them (None: as they are).

    On a CPU the trainer device is host memory and ``.to(cpu)`` is a no-op, so
    the profile is of kind ``cpu`` with host rates, the core count, how fast
    one-thread processes run side by side (the dense step alone, then one per core
    at once), and the network rates of the scale-out runs here: P gloo processes on this machine,
    whose "nodes" are simulated, so intra- and inter-node traffic both go over
    loopback; two processes of one thread each time ``all_to_all_single`` at a few
    sizes and a line ``latency + bytes / bandwidth`` is fitted. With
    ``device="cuda"`` it adds pinned H2D/D2H bandwidth, device bandwidth, a device
    row gather's share of it and the kernel latency, timed with CUDA events, and
    the dense rate on the GPU; NCCL collectives need two GPUs, so a CUDA profile
    has no network rates.
    """
    if threads is not None:
        torch.set_num_threads(max(1, threads))
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
        if network:
            cal.network()
    label = on or cal.cpu
    left = ("; no network rates: NCCL collectives need two GPUs" if device == "cuda"
            else "" if network else "; no network rates (not asked for)") + "".join(f"; {n}" for n in cal.notes)
    profile = {"name": name or f"calibrated-{device}",
               "description": f"{label}, torch {torch.__version__}, measured by hotcold calibrate on {cal.when}"
                              f"{left}",
               "kind": "gpu" if device == "cuda" else "cpu", "rates": cal.rates}
    profile_from_dict(profile, "calibrate")  # what we write must load
    return profile


def write_profile(profile: dict[str, Any], out: Path) -> Path:
    import yaml

    return atomic_write_text(Path(out), yaml.safe_dump(profile, sort_keys=False, width=120))
