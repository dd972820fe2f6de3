"""``fbgemm``: FBGEMM's table-batched embedding (TBE), the kernel under TorchRec, as a peer store.

An optional extra (``pip install -e .[peers]``): this module imports without
``fbgemm_gpu`` and asks for it only when a TBE is built. The store runs
``SplitTableBatchedEmbeddingBagsCodegen`` with sum pooling over bags of one
id (one bag per sample and id column, empty for padding), so its output is
the [B, K, D] lookup every store returns, and FBGEMM's optimizer fused into
its backward (``EXACT_SGD``, ``EXACT_ROWWISE_ADAGRAD`` or ``EXACT_ADAGRAD``) is the sparse update.
Placement and phases: ``FbgemmStore``; counters: ``FbgemmStore._count``;
exactness and limits: docs/methods.md, "Peers: FBGEMM and TorchRec".
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import torch

from hotcold.config import ELEMENTWISE, ConfigError, InfeasibleError, is_real
from hotcold.counters import StepCounters, all_resident, row_bytes
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.rows import Lookup, init_table, ship
from hotcold.embedding.settle import PendingCounts
from hotcold.options.stores import CACHES, FbgemmOptions, managed_cache_infeasible

INSTALL_HINT = "pip install -e .[peers]"
CUDA_INSTALL_HINT = "pip uninstall fbgemm-gpu-cpu; pip install -e .[peers-cuda]"  # docs/gpu.md: offline, from a wheel
CPU_BUILD, CUDA_BUILD = "fbgemm-gpu-cpu", "fbgemm-gpu"  # the distributions that install the module fbgemm_gpu


class PeerUnavailableError(ConfigError):
    """A peer method whose optional package is not installed: its runs are skipped, not failed."""


def available(device: str | torch.device | None = None) -> str | None:
    """None when FBGEMM's TBE can run here on ``device``; otherwise the reason (for notes and skips).

    On the CPU (or None): whether the TBE imports. On ``cuda``: whether the
    CUDA build is installed (the CPU wheel ``fbgemm-gpu-cpu`` imports on a GPU
    machine too, but has no CUDA kernels) and a tiny TBE's forward runs on the
    GPU (``cuda_probe``, once per process and GPU).
    """
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as e:  # ImportError, or the OSError of a CUDA build on a machine without its libraries
        hint = CUDA_INSTALL_HINT if device is not None and torch.device(device).type == "cuda" else INSTALL_HINT
        return f"fbgemm_gpu is not usable here ({type(e).__name__}: {e}); install it with `{hint}`"
    if device is None or torch.device(device).type != "cuda":
        return None
    if not torch.cuda.is_available():
        return "FBGEMM on cuda: torch sees no GPU here"
    builds = installed_builds()
    if CPU_BUILD in builds and CUDA_BUILD not in builds:  # another build (a nightly, a local one): the probe decides
        return (f"FBGEMM on cuda needs its CUDA build ({CUDA_BUILD}), but this environment has {CPU_BUILD}=="
                f"{builds[CPU_BUILD]} (the CPU build has no CUDA kernels); install it with `{CUDA_INSTALL_HINT}`")
    index = torch.device(device).index
    return cuda_probe(torch.cuda.current_device() if index is None else index)


def installed_builds() -> dict[str, str]:
    """The installed distributions that provide the module ``fbgemm_gpu``: name -> version."""
    from importlib import metadata

    names = metadata.packages_distributions().get("fbgemm_gpu", [])
    return {name: metadata.version(name) for name in sorted(set(names))}


@functools.cache
def cuda_probe(index: int) -> str | None:
    """None when a tiny TBE (two tables of 8 rows, DEVICE placement) runs a forward on GPU ``index``; else why not."""
    try:
        device = torch.device("cuda", index)
        tbe = make_tbe([8, 8], 4, _PROBE_OPTIMIZER, device, probe=False)
        out = tbe(torch.tensor([1, 7, 2], device=device), torch.tensor([0, 1, 2, 2, 3], device=device))
        torch.cuda.synchronize(device)
        if tuple(out.shape) != (2, 8):
            return f"FBGEMM's CUDA TBE returned shape {list(out.shape)} for [2, 8] on cuda:{index}"
    except Exception as e:  # a missing kernel, a CUDA build for another CUDA or architecture
        return (f"FBGEMM's CUDA TBE does not run on cuda:{index} ({type(e).__name__}: {' '.join(str(e).split())[:300]}); "
                f"install the CUDA build matching this torch with `{CUDA_INSTALL_HINT}`")
    return None


class _ProbeOptimizer:
    kind, lr, eps = "sgd", 0.01, 1e-8


_PROBE_OPTIMIZER = _ProbeOptimizer()


def require_available(device: str | torch.device | None = None) -> None:
    """Raise ``PeerUnavailableError`` with the reason when FBGEMM's TBE cannot run on ``device`` (``available``)."""
    reason = available(device)
    if reason is not None:
        raise PeerUnavailableError(reason)


def make_tbe(table_sizes: Sequence[int], dim: int, optimizer: Any, device: torch.device, *,
             weights: torch.Tensor | None = None, feature_table_map: Sequence[int] | None = None,
             cache: str | None = None, cache_ratio: float | None = None, probe: bool = True) -> torch.nn.Module:
    """A TBE with sum pooling and the optimizer fused into its backward, weights from ``weights``.

    optimizer: a ``RowOptimizer`` (EXACT_SGD; EXACT_ROWWISE_ADAGRAD or, per element, EXACT_ADAGRAD with its lr
    and eps).
    weights: float32 [sum(sizes), D] (default ``init_table(sizes, dim, 0)``).
    feature_table_map: the table of each id column (default: column t is table t). FBGEMM 1.8.0's CPU
    row-wise Adagrad fails unless the columns of one table are adjacent (``table_order`` arranges them).
    CPU device: HOST placement; CUDA: DEVICE placement, or MANAGED_CACHING with ``cache``
    'lru'/'lfu' holding ``cache_ratio`` of all rows.
    Raises ``PeerUnavailableError`` without fbgemm_gpu (on CUDA: without its CUDA build, ``available``; ``probe``
    False skips that check, for the probe itself), ``InfeasibleError`` for a cache on a CPU, ``ConfigError`` for
    other bad arguments.
    """
    device = torch.device(device)
    sizes = [int(n) for n in table_sizes]
    if cache is not None:
        if cache not in CACHES:
            raise ConfigError(f"fbgemm: cache must be one of {list(CACHES)} or none, got {cache!r}")
        reason = managed_cache_infeasible(device.type)
        if reason:
            raise InfeasibleError(reason)
        if not (is_real(cache_ratio) and 0 < cache_ratio <= 1):
            raise ConfigError(f"fbgemm: cache_ratio must be in (0, 1], got {cache_ratio!r}")
    if dim % 4:
        raise ConfigError(f"fbgemm: FBGEMM's TBE needs embedding_dim a multiple of 4, got {dim}")
    require_available(device if probe else None)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        CacheAlgorithm,
        ComputeDevice,
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen

    if device.type == "cuda":
        location = EmbeddingLocation.DEVICE if cache is None else EmbeddingLocation.MANAGED_CACHING
        compute = ComputeDevice.CUDA
    else:
        location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
    kind = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            ELEMENTWISE: EmbOptimType.EXACT_ADAGRAD}[optimizer.kind]
    extra: dict[str, Any] = {}
    if cache is not None:
        extra = {"cache_algorithm": CacheAlgorithm.LRU if cache == "lru" else CacheAlgorithm.LFU,
                 "cache_load_factor": float(cache_ratio), "gather_uvm_cache_stats": True}
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(n, dim, location, compute) for n in sizes],
        feature_table_map=list(feature_table_map) if feature_table_map is not None else None,
        optimizer=kind, learning_rate=optimizer.lr, eps=optimizer.eps, weight_decay=0.0,
        pooling_mode=PoolingMode.SUM, device=device, **extra)
    init = init_table(sizes, dim, 0) if weights is None else weights
    if tuple(init.shape) != (sum(sizes), dim):
        raise ConfigError(f"fbgemm: weights must be [{sum(sizes)}, {dim}], got {list(init.shape)}")
    start = 0
    with torch.no_grad():
        for n, w in zip(sizes, tbe.split_embedding_weights()):
            w.copy_(init[start:start + n].to(w.device, w.dtype))
            start += n
    return tbe


def tbe_inputs(ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids int64 [B, K] (table-local ids per column, -1 = padding) -> (indices [L], offsets [K*B + 1]).

    TBE's feature-major layout: bag ``k * B + b`` holds ``ids[b, k]`` (none for padding,
    which pools to a zero vector); the TBE output [B, K*D] views as [B, K, D].
    """
    cols = ids.t().reshape(-1)        # [K*B], feature-major
    valid = cols >= 0
    offsets = torch.zeros(cols.numel() + 1, dtype=torch.int64)
    torch.cumsum(valid, 0, out=offsets[1:])
    indices = cols if bool(valid.all()) else cols[valid]
    return ship(indices.contiguous(), device), ship(offsets, device)


def table_order(column_tables: Sequence[int]) -> list[int] | None:
    """The id columns sorted by table (stable), or None when their tables already ascend."""
    tables = list(column_tables)
    if tables == sorted(tables):
        return None
    return sorted(range(len(tables)), key=lambda k: tables[k])


def tbe_weights(tbe: torch.nn.Module) -> torch.Tensor:
    """Every row's weights, float32 [sum(sizes), D] on the CPU, in global-row order (cache flushed first)."""
    tbe.flush()  # MANAGED_CACHING: the cached rows are the current ones; a no-op without a cache
    return torch.cat([w.detach().to("cpu", torch.float32) for w in tbe.split_embedding_weights()])


def tbe_row_states(tbe: torch.nn.Module) -> torch.Tensor:
    """Adagrad's state of every row, float32 on the CPU: row-wise [sum(sizes)], per element [sum(sizes), D]
    (SGD: empty)."""
    states = tbe.split_optimizer_states()
    if not states or not states[0]:
        return torch.zeros(0)
    return torch.cat([s[0].detach().to("cpu", torch.float32) for s in states])


def tbe_cache_slots(tbe: torch.nn.Module) -> int:
    """Rows FBGEMM's managed cache holds (sets x ways); 0 without a cache."""
    return int(tbe.lxu_cache_weights.shape[0])


class FbgemmStore(EmbeddingStore):
    """FBGEMM's TBE as a store: HOST placement on a CPU, DEVICE or MANAGED_CACHING (``cache``) on a GPU.

    Options: ``cache`` (``none``, the default; ``lru``; ``lfu``) and, with a
    cache, ``cache_ratio`` (share of all rows, default 0.015) or ``cache_rows``,
    as the harness's caches. Counters: ``_count``, and ``CacheCounts`` for the managed cache.

    Placement: on a CPU, HOST (FBGEMM's CPU kernels); on a GPU, DEVICE, or
    MANAGED_CACHING (the UVM cache of TorchRec's sharded tables) with
    ``cache: lru`` or ``cache: lfu``. FBGEMM's cache is set-associative
    (32 ways on CUDA): it holds ``ceil(ratio * N / 32)`` sets, and a row can
    only go into its own set, so it may miss where a fully associative cache
    of the same size would hit. A managed cache on a CPU is ``infeasible``.

    Phases: the TBE's inputs are ``h2d``; with a managed cache, planning the
    batch's unique rows and probing the cache before FBGEMM fills it is
    ``count`` (the harness's counting, not FBGEMM's work; the second probe
    runs after the step); the TBE's forward is ``emb_fwd``, including the
    cache fill FBGEMM does inside it; its fused backward and update are
    ``emb_update``. No phase waits for the GPU: the counts are read after the
    timed steps (``settle_counters``).

    Exactness: FBGEMM's SGD and row-wise Adagrad are the harness's
    (``RowOptimizer``): row-wise Adagrad adds the mean squared gradient of the row to its
    state and divides by ``sqrt(state) + eps``; EXACT_ADAGRAD does the same per element. The weights agree with the
    ``device`` store up to float32 summation order (docs/methods.md, "Exactness", and
    docs/measurements.md for the measured differences). FBGEMM needs ``embedding_dim`` a multiple of 4.
    """

    Options = FbgemmOptions

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.cache = None if self.options.cache == "none" else self.options.cache
        ratio = self.options.cache_share(spec.num_rows)
        tables = list(spec.column_tables) if spec.column_tables is not None else list(range(len(spec.table_sizes)))
        order = table_order(tables)
        # TBE's feature k is id column order[k]; None: the columns' own order
        self._order = None if order is None else torch.tensor(order, dtype=torch.int64)
        self._back = None if order is None else torch.argsort(self._order).to(self.device)  # column k: feature back[k]
        self._order_dev = None if order is None else self._order.to(self.device)
        self.tbe = make_tbe(spec.table_sizes, spec.dim, spec.optimizer, self.device,
                            weights=init_table(spec.table_sizes, spec.dim, spec.seed),
                            feature_table_map=tables if order is None else [tables[k] for k in order],
                            cache=self.cache, cache_ratio=ratio)
        self.requested_ratio = ratio
        self.row_bytes = row_bytes(spec.dim, 0)  # MANAGED_CACHING caches weights; the optimizer's state is not cached
        self._out: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None           # the last trained batch, counted after the step
        self._lk: Lookup | None = None                  # MANAGED_CACHING: the last batch's planned rows
        self._counts = CacheCounts(self._resident, self._occupied, self.device, self.row_bytes)
        self._done: dict[str, int] | None = None

    def _inputs(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """TBE's (indices, offsets) of ids [B, K], its features in table order."""
        return tbe_inputs(ids if self._order is None else ids.index_select(1, self._order), self.device)

    def _columns(self, out: torch.Tensor, b: int) -> torch.Tensor:
        """TBE output [B, K*D] -> [B, K, D] in the id columns' order."""
        out = out.view(b, -1, self.dim)
        return out if self._back is None else out.index_select(1, self._back)

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        indices, offsets = self._inputs(ids)
        timer.mark("h2d")
        if self.cache is not None:  # the harness's counting, charged to its own phase (not FBGEMM's h2d)
            self._lk = self.plan(ids)
            self._counts.before(self._lk)
            timer.mark(COUNT_PHASE)
        with torch.enable_grad():
            out = self.tbe(indices, offsets)  # [B, K*D]; fills the managed cache first
        self._out, self._ids, self._done = out, ids, None
        timer.mark("emb_fwd")
        return self._columns(out.detach(), ids.shape[0])

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._out is not None, "backward without forward"
        if self._order is not None:
            grad = grad.index_select(1, self._order_dev)
        self._out.backward(grad.reshape(self._out.shape))  # FBGEMM's fused backward + optimizer
        self._out = None
        timer.mark("emb_update")

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self._columns(self.tbe(*self._inputs(ids)), ids.shape[0])

    def export(self) -> torch.Tensor:
        return tbe_weights(self.tbe)

    def step_counters(self) -> dict[str, int]:
        """The last step's counters (``_count``). With a managed cache, the cache events are device-side counts:
        the dict's fields other than ``lookups`` and ``unique_rows`` are None until ``settle_counters``."""
        if self._done is None and self._ids is not None:
            if self.cache is None:
                self._done = self._count().as_dict()
            else:
                lk = self._lk
                self._done = self._counts.after(lk.size, lk.unique()[0].numel())
        return self._done if self._done is not None else StepCounters().as_dict()

    def settle_counters(self) -> None:
        """Read the managed cache's device-side counts of every step since the last call, in one transfer."""
        if self.cache is not None:
            self._counts.settle()

    def report(self) -> dict[str, Any]:
        if self.cache is None:
            return {"placement": "device" if self.device.type == "cuda" else "host"}
        stats = self.tbe.get_uvm_cache_stats().tolist()
        names = ("num_calls", "num_requested_indices", "num_unique_indices", "num_unique_misses",
                 "num_conflict_unique_misses", "num_conflict_misses")
        slots = tbe_cache_slots(self.tbe)
        return {"placement": "managed_caching", "cache": self.cache, "capacity": slots,
                "cache_ratio": slots / self.spec.num_rows, "requested_cache_ratio": self.requested_ratio,
                "fbgemm_uvm_cache_stats": dict(zip(names, map(int, stats)))}

    # --- counting -----------------------------------------------------------------------------------------

    def _count(self) -> StepCounters:
        """HOST and DEVICE placement hold every row where the lookup runs: ``lookups``, ``unique_rows``, all hits
        (``all_resident``), nothing moved; counted on the host after the timed step. MANAGED_CACHING: ``CacheCounts``."""
        lk = self.plan(self._ids)
        return all_resident(lk.size, lk.groups().size)

    def _resident(self, rows: torch.Tensor) -> torch.Tensor:
        """Whether each global row (= FBGEMM's linear cache index, every table cached) is in the cache: bool [U]."""
        loc = torch.ops.fbgemm.lxu_cache_lookup(rows, self.tbe.lxu_cache_state, self.tbe.total_cache_hash_size)
        return loc != -1

    def _occupied(self) -> torch.Tensor:
        return (self.tbe.lxu_cache_state != -1).sum()


COUNT_PHASE = "count"  # the step's phase of the managed cache's probe before the forward (the harness's, not FBGEMM's)
PROBED = ("unique_misses", "misses", "occupied_before", "not_admitted", "occupied_after")


class CacheCounts:
    """A managed cache's counters, from FBGEMM's own cache state, kept on the device through the steps.

    Before the step's forward (which is where FBGEMM fills its cache), the
    batch's unique rows are looked up in the cache directory with FBGEMM's
    ``lxu_cache_lookup`` (``before``, in the step's ``count`` phase):
    ``unique_misses`` are those not resident, ``misses`` their lookups. After
    the step (``after``, called by ``step_counters`` once the timer closed the
    step: FBGEMM's backward changes no slot) the same lookup finds the rows
    FBGEMM could not admit (every way of their set taken by the batch); the
    others were fetched, ``param_rows_h2d`` (weights only: row-wise Adagrad's
    state stays in device memory under MANAGED_CACHING). ``evictions``: fetched
    rows that did not land in a free slot (slot occupancy from the cache
    state); FBGEMM writes every evicted row back to host memory,
    ``param_rows_d2h``. Not exposed by FBGEMM and left at zero: the traffic of
    rows it could not admit, which its kernels read and update in place in UVM
    (they count as misses only).

    Nothing here waits for the GPU: each step's five counts stay a device
    tensor, and ``settle`` reads every pending step's in one transfer after the
    timed steps (``EmbeddingStore.settle_counters``), filling the dicts
    ``after`` returned.
    """

    def __init__(self, resident: Any, occupied: Any, device: torch.device, row_bytes: int) -> None:
        self._resident, self._occupied = resident, occupied  # rows [U] -> bool [U]; () -> int64 scalar (device)
        self.device, self.row_bytes = device, row_bytes
        self._rows: torch.Tensor | None = None
        self._before: list[torch.Tensor] = []
        self._pending = PendingCounts()

    def before(self, lk: Lookup) -> None:
        """The batch's unique rows against the cache before FBGEMM fills it (device tensors, no sync)."""
        uniq, _, counts = lk.unique()  # [U], [U]
        rows, counts = ship(uniq, self.device), ship(counts, self.device)
        missing = ~self._resident(rows)
        self._rows = rows
        self._before = [missing.sum(), (counts * missing).sum(), self._occupied()]

    def after(self, lookups: int, unique: int) -> dict[str, Any]:
        """After the step: the rows not admitted and the slots occupied; the step's counters, to be settled."""
        assert self._rows is not None, "after() without before()"
        probe = torch.stack([t.to(torch.int64) for t in
                             (*self._before, (~self._resident(self._rows)).sum(), self._occupied())])
        out = self._pending.add(probe, lambda *counted: cache_counters(lookups, unique, dict(zip(PROBED, counted)),
                                                                       self.row_bytes))
        out.update(lookups=lookups, unique_rows=unique)
        self._rows, self._before = None, []
        return out

    def settle(self) -> None:
        """Fill every pending step's counters from its device-side counts, read in one transfer."""
        self._pending.settle()


def cache_counters(lookups: int, unique: int, p: dict[str, int], row_bytes: int) -> StepCounters:
    """A managed-cache step's counters from its probe counts ``p`` (``PROBED``; see ``CacheCounts``)."""
    fetched = p["unique_misses"] - p["not_admitted"]
    evictions = fetched - (p["occupied_after"] - p["occupied_before"])
    c = StepCounters(lookups=lookups, unique_rows=unique, misses=p["misses"], hits=lookups - p["misses"],
                     unique_misses=p["unique_misses"], unique_hits=unique - p["unique_misses"], evictions=evictions)
    return c.set_param_traffic(fetched, evictions, row_bytes)
