"""``fbgemm``: FBGEMM's table-batched embedding (TBE), the kernel under TorchRec, as a peer store.

An optional extra (``pip install -e .[peers]``): this module imports without
``fbgemm_gpu`` and asks for it only when a TBE is built. The store runs
``SplitTableBatchedEmbeddingBagsCodegen`` with sum pooling over bags of one
id (one bag per sample and id column, empty for padding), so its output is
the [B, K, D] lookup every store returns, and FBGEMM's optimizer fused into
its backward (``EXACT_SGD`` or ``EXACT_ROWWISE_ADAGRAD``) is the sparse update.

Placement: on a CPU, HOST (FBGEMM's CPU kernels); on a GPU, DEVICE, or
MANAGED_CACHING (the UVM cache of TorchRec's sharded tables) with
``cache: lru`` or ``cache: lfu`` at ``cache_ratio`` (or ``cache_rows``) of
all rows, as the harness's caches. FBGEMM's cache is set-associative
(32 ways on CUDA): it holds ``ceil(ratio * N / 32)`` sets, and a row can
only go into its own set, so it may miss where a fully associative cache
of the same size would hit. A managed cache on a CPU is ``infeasible``.

Counters (``StepCounters``):

- HOST and DEVICE placement hold every row where the lookup runs:
  ``lookups``, ``unique_rows``, all hits (``all_resident``), nothing moved.
  Unique rows are counted on the host after the timed step.
- MANAGED_CACHING: hits and misses come from FBGEMM's own cache state. Before
  the step's forward (which is where FBGEMM fills its cache), the batch's
  unique rows are looked up in the cache directory with FBGEMM's
  ``lxu_cache_lookup``: ``unique_misses`` are those not resident, ``misses``
  their lookups. After the forward the same lookup finds the rows FBGEMM
  could not admit (every way of their set taken by the batch); the others
  were fetched, ``param_rows_h2d`` (weights only: row-wise Adagrad's state
  stays in device memory under MANAGED_CACHING). ``evictions``: fetched rows
  that did not land in a free slot (slot occupancy from the cache state);
  FBGEMM writes every evicted row back to host memory, ``param_rows_d2h``.
  Not exposed by FBGEMM and left at zero: the traffic of rows it could not
  admit, which its kernels read and update in place in UVM (they count as
  misses only). These lookups run in the ``h2d`` phase; the counts are read
  after the timed step.

Exactness: FBGEMM's SGD and row-wise Adagrad are the harness's
(``RowOptimizer``): Adagrad adds the mean squared gradient of the row to its
state and divides by ``sqrt(state) + eps``. The weights agree with the
``device`` store up to float32 summation order (see the README for the
measured differences). FBGEMM needs ``embedding_dim`` a multiple of 4.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from hotcold.config import ConfigError, InfeasibleError, is_real
from hotcold.embedding.base import init_table, ship

INSTALL_HINT = "pip install -e .[peers]"
CACHES = ("lru", "lfu")


class PeerUnavailableError(ConfigError):
    """A peer method whose optional package is not installed: its runs are skipped, not failed."""


def available() -> str | None:
    """None when fbgemm_gpu's TBE imports here; otherwise the reason (for notes and skips)."""
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as e:  # ImportError, or the OSError of a CUDA build on a machine without its libraries
        return f"fbgemm_gpu is not usable here ({type(e).__name__}: {e}); install it with `{INSTALL_HINT}`"
    return None


def require_available() -> None:
    """Raise ``PeerUnavailableError`` with the reason when fbgemm_gpu's TBE does not import."""
    reason = available()
    if reason is not None:
        raise PeerUnavailableError(reason)


def make_tbe(table_sizes: Sequence[int], dim: int, optimizer: Any, device: torch.device, *,
             weights: torch.Tensor | None = None, feature_table_map: Sequence[int] | None = None,
             cache: str | None = None, cache_ratio: float | None = None) -> torch.nn.Module:
    """A TBE with sum pooling and the optimizer fused into its backward, weights from ``weights``.

    optimizer: a ``RowOptimizer`` (EXACT_SGD, or EXACT_ROWWISE_ADAGRAD with its lr and eps).
    weights: float32 [sum(sizes), D] (default ``init_table(sizes, dim, 0)``).
    feature_table_map: the table of each id column (default: column t is table t).
    CPU device: HOST placement; CUDA: DEVICE placement, or MANAGED_CACHING with ``cache``
    'lru'/'lfu' holding ``cache_ratio`` of all rows.
    Raises ``PeerUnavailableError`` without fbgemm_gpu, ``InfeasibleError`` for a cache on a CPU,
    ``ConfigError`` for other bad arguments.
    """
    device = torch.device(device)
    sizes = [int(n) for n in table_sizes]
    if cache is not None:
        if cache not in CACHES:
            raise ConfigError(f"fbgemm: cache must be one of {list(CACHES)} or none, got {cache!r}")
        if device.type != "cuda":
            raise InfeasibleError("FBGEMM's managed cache (MANAGED_CACHING, UVM) needs a GPU; this run is on "
                                  f"{device.type}")
        if not (is_real(cache_ratio) and 0 < cache_ratio <= 1):
            raise ConfigError(f"fbgemm: cache_ratio must be in (0, 1], got {cache_ratio!r}")
    if dim % 4:
        raise ConfigError(f"fbgemm: FBGEMM's TBE needs embedding_dim a multiple of 4, got {dim}")
    require_available()
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
    kind = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[optimizer.kind]
    extra: dict[str, Any] = {}
    if cache is not None:
        extra = {"cache_algorithm": CacheAlgorithm.LRU if cache == "lru" else CacheAlgorithm.LFU,
                 "cache_load_factor": float(cache_ratio)}
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


def tbe_weights(tbe: torch.nn.Module) -> torch.Tensor:
    """Every row's weights, float32 [sum(sizes), D] on the CPU, in global-row order (cache flushed first)."""
    tbe.flush()  # MANAGED_CACHING: the cached rows are the current ones; a no-op without a cache
    return torch.cat([w.detach().to("cpu", torch.float32) for w in tbe.split_embedding_weights()])


def tbe_row_states(tbe: torch.nn.Module) -> torch.Tensor:
    """Row-wise Adagrad's state of every row, float32 [sum(sizes)] on the CPU (SGD: empty)."""
    states = tbe.split_optimizer_states()
    if not states or not states[0]:
        return torch.zeros(0)
    return torch.cat([s[0].detach().reshape(-1).to("cpu", torch.float32) for s in states])
