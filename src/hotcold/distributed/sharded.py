"""``sharded`` and ``flexshard``: hybrid-parallel embedding rows, owned per a sharding plan.

Each rank trains on its slice of the global batch; its lookups go to the
ranks that serve their rows and the vectors and gradients come back through
counted all-to-alls, the owners applying the same ``RowOptimizer`` as the
``device`` store (the steps of one batch: ``ShardedStore``). ``flexshard``
is this store with FlexShard's tiered plan. Their options: ``sharded_options.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotcold.config import ConfigError
from hotcold.counters import all_resident, exchanges_row_squares
from hotcold.distributed.comm import Comm, Pending, ids_tensor
from hotcold.distributed.host_lookups import host_counts
from hotcold.distributed.host_tier import HostTier, device_first
from hotcold.distributed.plan_types import ALL, NODE, SHARDED, PlanInputs
from hotcold.distributed.plans import build_plan, check_store_plan
from hotcold.distributed.replica_sync import SPARSE, sync_sends
from hotcold.options.sharded import FlexShardOptions, ShardedOptions
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import Ledger
from hotcold.options.sharded import LOOKUP, REDUCE_SCATTER
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.rows import Lookup, RowGroups, init_table, sum_by_index
from hotcold.embedding.update import row_square_sums


@dataclass
class Exchange:
    """One batch's routing on this rank: its lookups' order and counts, and the rows others asked of it."""

    lk: Lookup
    order: torch.Tensor            # int64 [L * columns]: the lookups' pieces (column shards) by serving rank
    send_counts: np.ndarray        # int64 [P] lookups this rank sends each rank
    recv_counts: np.ndarray        # int64 [P] lookups each rank sends this one
    served: torch.Tensor           # int64 [R] local positions of the rows asked of this rank, by source rank
    #: ``reduce_scatter`` protocol: int64 [R] the flat (sample, column) position in the global batch [P*B*K] of
    #: every row asked of this rank (from the lengths each rank sent), in ``served``'s order; None: ``lookup``
    pooled: torch.Tensor | None = None


@dataclass
class RouteInFlight:
    """An ``Exchange`` whose ids' all-to-all is still in flight: ``wait()`` fills in the rows asked of this rank."""

    ex: Exchange
    ids: Pending | None            # the rows others ask of this rank, global indices [R]; None: arrived
    local_index: np.ndarray        # global row -> local position (the store's)

    def done(self) -> bool:
        return self.ids is None or self.ids.done()

    def wait(self) -> Exchange:
        if self.ids is not None:
            self.ex.served = torch.from_numpy(self.local_index[self.ids.wait().cpu().numpy()])
            self.ids = None
        return self.ex


class ShardedStore(EmbeddingStore):
    """Rows owned per a sharding plan, served to the other ranks by all-to-alls.

    Each rank trains on its slice of the global batch. Per step:

    1. *input all-to-all*: the rank's lookups (every one, not deduplicated, so a
       history of L events costs L ids) go to the ranks that serve their rows;
    2. the owners look the rows up;
    3. *output all-to-all*: the vectors go back, unpooled;
    4. after the dense backward, *gradient all-to-all*: each lookup's gradient
       (scaled by ``1/P`` in ``World.sync_dense``: every rank's loss is the mean
       over its slice) goes to the serving rank, which sums the gradients of its rows;
    5. replicated rows reduce their gradients in their replica group (every
       rank for the ``ALL`` tier, one rank per node for the ``NODE`` tier);
       column-wise shards exchange each row's squared-gradient partial sums
       with its table's other shard owners for row-wise Adagrad (unless each
       shard keeps its own state, ``plan_options`` ``state: shard``);
    6. the owners apply ``RowOptimizer``, the same update as the ``device`` store.
    """

    Options = ShardedOptions
    needs_frequencies = True
    spans_ranks = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.comm: Comm = spec.comm if spec.comm is not None else Comm(Topology(1))
        self.comm.reset()
        self.rank, self.world = self.comm.rank, self.comm.world
        opts = self.options
        check_store_plan(opts, f"store {type(self).__name__}")  # the registry checks a config's; a spec's here
        counts = spec.frequencies.numpy() if spec.frequencies is not None else np.zeros(spec.num_rows, np.int64)
        self.inputs = PlanInputs.for_training(
            spec.table_sizes, counts, self.comm.topology, spec.dim, self.optimizer.state_width(spec.dim),
            opts.memory_headroom, opts.planner_options(), spec.batch_share, wire=self.comm.wire)
        self.sharding = build_plan(opts.plan, self.inputs)
        sh = self.sharding
        self.width = spec.dim // sh.columns
        owned, on_device = device_first(np.flatnonzero(sh.owned(self.rank)), sh.off_device)  # host rows last
        self.owned_rows = owned                                          # [M] global rows held here
        self.local_index = np.full(sh.num_rows, -1, dtype=np.int64)
        self.local_index[owned] = np.arange(owned.size)
        self.bounds = np.concatenate([[0], np.cumsum(spec.table_sizes)]).astype(np.int64)
        # the column shard of each held row (0 under a row plan): its columns [j * width, (j + 1) * width)
        self.shard_of = (torch.from_numpy(sh.shard_index(self.rank)[self.table_of(owned)]) if sh.columns > 1
                         else torch.zeros(owned.size, dtype=torch.int64))
        full = init_table(spec.table_sizes, spec.dim, spec.seed).view(sh.num_rows, sh.columns, self.width)
        full = full[torch.from_numpy(owned), self.shard_of]              # [M, width]
        self.weight = full[:on_device].contiguous().to(self.device)
        self.state = self.optimizer.init_state(on_device, self.width, self.device)  # a column shard's own columns
        self.host_tier = (HostTier(full[on_device:], self.optimizer, on_device, self.device)
                          if on_device < owned.size else None)
        tier = sh.tier[owned]
        self.tier = torch.from_numpy(tier.astype(np.int64))               # [M] tier of each held row
        # replicated tiers held here: (their local positions [n], each held row's index among them [M], group)
        self.replicas = []
        topo = self.comm.topology
        for t, group in ((ALL, None), (NODE, topo.cross_node_group(topo.local(self.rank)))):
            positions = np.flatnonzero(tier == t)
            if positions.size:
                index = np.full(owned.size, -1, dtype=np.int64)
                index[positions] = np.arange(positions.size)
                self.replicas.append((torch.from_numpy(positions), torch.from_numpy(index), group))
        self.rw_protocol = getattr(opts, "rw_protocol", LOOKUP)
        if self.rw_protocol == REDUCE_SCATTER:
            tables = spec.column_tables
            if tables is not None and len(set(tables)) < len(tables):
                raise ConfigError("store.rw_protocol reduce_scatter sum-pools one id per sample and table (DLRM "
                                  "style); this dataset's histories share tables and are pooled by the model")
        # row-wise state over each row's columns, from the squares its table's shard owners exchange
        self.column_exchange = (sh.columns > 1 and exchanges_row_squares(self.optimizer.state_width(spec.dim))
                                and sh.details.get("column_state", "row") == "row")
        self.shares = sh.holds() & sh.holds()[self.rank] if sh.columns > 1 else None  # [P, T] tables held with me
        self._last: Exchange | None = None
        self._served_total = 0
        self._host_total = 0

    # -- routing ---------------------------------------------------------------------------------
    def route(self, ids: torch.Tensor, collective: str | None = "input_a2a") -> Exchange:
        """Send this rank's lookups to the ranks serving them; learn which rows others ask of it."""
        return self.send_route(ids, collective).wait()

    def send_route(self, ids: torch.Tensor, collective: str | None = "input_a2a") -> "RouteInFlight":
        """``route`` with the ids' all-to-all left in flight (the counts before it are exchanged at once)."""
        lk = self.plan(ids)
        rows = lk.rows.numpy()
        p, sh = self.world, self.sharding
        if sh.columns > 1:  # piece i * columns + j: lookup i's column shard j, on its table's rank j
            assert sh.column_ranks is not None
            dest = sh.column_ranks[self.table_of(rows)].reshape(-1)
        else:
            dest = sh.serving_rank(self.rank, rows)
        order_np = np.argsort(dest, kind="stable")
        send_counts = np.bincount(dest, minlength=p).astype(np.int64)
        data, order = rows[order_np // sh.columns], torch.from_numpy(order_np)
        recv_counts = self.comm.exchange_counts(send_counts, collective)
        got = self.comm.all_to_all(ids_tensor(data, self.device), send_counts, recv_counts, collective, async_op=True)
        return RouteInFlight(Exchange(lk, order, send_counts, recv_counts, torch.empty(0, dtype=torch.int64)), got,
                             self.local_index)

    def table_of(self, rows: np.ndarray) -> np.ndarray:
        """int64 [L]: the table of each global row."""
        return np.searchsorted(self.bounds, rows, side="right") - 1

    def gather_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """Held rows at local ``positions`` [R] -> [R, width]."""
        if self.host_tier is not None:
            return self.host_tier.gather(self.weight, positions)
        return self.weight.index_select(0, positions.to(self.device, non_blocking=True))

    def answer(self, ex: Exchange, vectors: torch.Tensor, collective: str | None = "output_a2a") -> torch.Tensor:
        """Send the served vectors [R, width] back; assemble this rank's lookups [L, D] in lookup order."""
        got = self.comm.all_to_all(vectors, ex.recv_counts, ex.send_counts, collective, on_wire=True).wait()
        return self.assemble(ex, got)

    def assemble(self, ex: Exchange, got: torch.Tensor) -> torch.Tensor:
        """The pieces the output all-to-all brought [L * columns, width], in the wire's type -> this rank's
        lookups [L, D] in lookup order, in the store's type."""
        got = got.to(self.weight.dtype)
        out = torch.empty_like(got)
        out.index_copy_(0, ex.order.to(got.device), got)
        return out.view(-1, self.dim)

    # -- the protocol ---------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        if self.rw_protocol == REDUCE_SCATTER:
            return self._pooled_forward(ids, timer)
        ex = self.route(ids)
        timer.mark("input_a2a")
        vectors = self.gather_rows(ex.served)
        timer.mark("emb_fwd")
        return self._finish_forward(ex, vectors, timer)

    def _finish_forward(self, ex: Exchange, vectors: torch.Tensor, timer: Marker) -> torch.Tensor:
        out = self.to_batch(self.answer(ex, vectors), ex.lk)
        timer.mark("output_a2a")
        self._last = ex
        return out

    # -- TorchRec's pooled row-wise (``rw_protocol: reduce_scatter``) ----------------------------------------
    def send_lengths(self, ex: Exchange, shape: tuple[int, int]) -> torch.Tensor:
        """Input all-to-all of the per-sample lengths (TorchRec's bucketised KJT lengths, int64): every rank gets,
        for each (sample, column) of this rank's slice [B, K], how many of its ids it serves (0 or 1 here), and
        returns, per source rank, the flat positions in the global batch [P * B * K] of the ids it received."""
        b, k = shape
        n = b * k
        dest = np.full(n, -1, dtype=np.int64)
        at = np.arange(n) if ex.lk.positions is None else ex.lk.positions.numpy()
        dest[at] = self.sharding.serving_rank(self.rank, ex.lk.rows.numpy())
        lengths = (dest[None, :] == np.arange(self.world)[:, None]).astype(np.int64).reshape(-1)  # [P * B * K]
        counts = np.full(self.world, n, dtype=np.int64)
        got = self.comm.all_to_all(ids_tensor(lengths, self.device), counts, counts, "input_a2a").wait()
        return torch.from_numpy(np.flatnonzero(got.cpu().numpy()))  # rank-major: served's order

    def _pooled_forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        """The owners pool their rows' partial sums for every sample and column of the global batch; a
        reduce-scatter leaves each rank the sums of its own samples (one id per sample and table: the row)."""
        ex = self.route(ids)
        ex.pooled = self.send_lengths(ex, ex.lk.shape)
        timer.mark("input_a2a")
        b, k = ex.lk.shape
        vectors = self.gather_rows(ex.served)
        partial = torch.zeros(self.world * b * k, self.dim, dtype=self.comm.reduce_dtype(), device=vectors.device)
        partial.index_add_(0, ex.pooled.to(vectors.device), vectors.to(partial.dtype))
        timer.mark("emb_fwd")
        pooled = self.comm.reduce_scatter(partial, "output_a2a", on_wire=True).to(self.weight.dtype)
        timer.mark("output_a2a")
        self._last = ex
        return pooled.view(b, k, self.dim)

    def _pooled_grads(self, ex: Exchange, grad: torch.Tensor) -> torch.Tensor:
        """TorchRec's backward of the reduce-scatter: an all-gather of every sample's pooled gradient; each owner
        keeps those of the rows it served [R, D], in ``served``'s order."""
        every = self.comm.all_gather(grad.reshape(-1, self.dim), "grad_a2a", on_wire=True)
        assert ex.pooled is not None
        return every.index_select(0, ex.pooled.to(every.device))

    def send_grads(self, ex: Exchange, grad: torch.Tensor, async_op: bool = False) -> Pending:
        """Each lookup's gradient [B, K, D] to its serving rank; the owner receives [R, width]."""
        g = self.from_batch(grad, ex.lk).reshape(-1, self.width)  # [L * columns, width]: the pieces
        g = g.index_select(0, ex.order.to(g.device))
        return self.comm.all_to_all(g, ex.send_counts, ex.recv_counts, "grad_a2a", async_op=async_op, on_wire=True)

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        ex = self._last
        received = self._pooled_grads(ex, grad) if ex.pooled is not None else self.send_grads(ex, grad).wait()
        timer.mark("grad_a2a")
        self.update(ex, received, timer)

    def update(self, ex: Exchange, received: torch.Tensor, timer: Marker) -> None:
        """Sum the received gradients by row, reduce replicas, apply the row optimizer; book the step."""
        received = received.to(self.weight.dtype)  # from the wire's type
        groups = RowGroups.of(ex.served)  # planned on the host
        uniq = groups.rows
        slots = uniq.to(self.device, non_blocking=True)
        summed = sum_by_index(groups, received, self.spec.exact_sums)  # [U, width], float64 when exact
        timer.mark("emb_update")
        if self.replicas:
            self._reduce_replicas(uniq, summed)
            timer.mark("replica_allreduce")
            sharded = (self.tier.index_select(0, uniq) == SHARDED).to(self.device)
            slots, summed = slots[sharded], summed[sharded]
        sq_mean = None
        if self.column_exchange:  # each row's squares, over all its columns
            sq_mean = self._row_squares(uniq, summed) / self.dim
            timer.mark("column_allreduce")
        if self.host_tier is not None:  # host rows update on the host; the device rows below
            slots, summed = self.host_tier.apply(self.optimizer, slots, summed)
        self.optimizer.apply(self.weight, self.state, slots, summed, sq_mean)
        timer.mark("emb_update")
        self._book_step(ex)
        self._last = None

    def _row_squares(self, uniq: torch.Tensor, summed: torch.Tensor) -> torch.Tensor:
        """[U] each updated row's squared gradient summed over all its columns: every shard owner of a table
        sends every other one its partial sums of the table's rows updated this step (the same rows on each: every
        lookup of a table reaches all its owners), in row order, in the wire's reduce type; summed in rank order."""
        assert self.shares is not None
        part = row_square_sums(summed).to(self.comm.reduce_dtype())            # [U], in a fixed order
        table = torch.from_numpy(self.table_of(self.owned_rows[uniq.numpy()]))
        mine = self.shares[:, table.numpy()]                                    # [P, U] rows each rank shares
        mine[self.rank] = False
        counts = mine.sum(axis=1).astype(np.int64)
        send = torch.cat([part[torch.from_numpy(mine[q])] for q in range(self.world)])
        got = self.comm.all_to_all(send, counts, counts, "column_allreduce").wait()
        parts = torch.zeros(self.world, part.numel(), dtype=part.dtype, device=part.device)
        parts[self.rank] = part
        for q, block in enumerate(torch.split(got, counts.tolist())):
            if q != self.rank:
                parts[q, torch.from_numpy(mine[q]).to(part.device)] = block
        total = parts[0]
        for q in range(1, self.world):  # rank order, the same on every device
            total = total + parts[q]
        return total.to(summed.dtype)

    def _reduce_replicas(self, uniq: torch.Tensor, summed: torch.Tensor) -> None:
        """Sum each replicated tier's gradient over its group, then update the rows touched anywhere.

        Per group and step, the cheaper of a dense all-reduce of the whole tier and an all-gather of the rows its
        members touched (``replica_sync.sync_sends``, after an all-gather of their counts; the gathered rows are
        summed in rank order). Rows no rank touched have a zero gradient and are left alone, as in the ``device``
        store.
        """
        for positions, index, group in self.replicas:
            at = index.index_select(0, uniq)                  # [U] index in this tier, -1: another tier
            here = (at >= 0).nonzero().squeeze(1)
            mine, values = at[here].to(self.device), summed[here.to(self.device)]
            counts = self.comm.all_gather_counts(int(mine.numel()), group, "replica_allreduce")
            grad = torch.zeros(positions.numel(), self.width, dtype=summed.dtype, device=summed.device)
            how, _ = sync_sends(counts, positions.numel(), self.width, self.comm.wire.reduce_bytes)
            if how == SPARSE:
                for ids, got in self.comm.all_gather_rows(mine, values, counts, group, "replica_allreduce",
                                                          on_wire=True):
                    grad.index_copy_(0, ids, grad.index_select(0, ids) + got.to(grad.dtype))  # ids distinct
            else:
                grad.index_copy_(0, mine, values)
                grad = self.comm.all_reduce(grad, group, "replica_allreduce", on_wire=True).wait().to(summed.dtype)
            touched = grad.ne(0).any(dim=1)
            self.optimizer.apply(self.weight, self.state, positions.to(self.device)[touched], grad[touched])

    def _book_step(self, ex: Exchange, early: int = 0) -> None:
        served = int(ex.served.numel())
        self._served_total += served
        counters = all_resident(ex.lk.size, int(ex.lk.unique()[0].numel()))
        for k, v in self.comm.ledger.take_step().items():
            setattr(counters, k, v)
        counters.served_lookups, counters.early_lookups = served, early
        if self.host_tier is not None:
            for k, v in host_counts(self.host_tier.lookups(ex.served), self.dim).items():
                setattr(counters, k, v)
            self._host_total += counters.host_lookups
        self._counters = counters

    # -- evaluation and export ------------------------------------------------------------------
    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        ex = self.route(ids, collective=None)
        return self.to_batch(self.answer(ex, self.gather_rows(ex.served), collective=None), ex.lk)

    def export(self) -> torch.Tensor:
        """Every row's weights on every rank: each row's primary copy summed into zeros over all ranks."""
        sh, topo = self.sharding, self.comm.topology
        full = torch.zeros(sh.num_rows, self.dim, dtype=torch.float32, device=self.device)  # NCCL: on the GPU
        tier = sh.tier[self.owned_rows]
        primary = ((tier == SHARDED) | ((tier == NODE) & (topo.node(self.rank) == 0))
                   | ((tier == ALL) & (self.rank == 0)))
        rows = torch.from_numpy(self.owned_rows[primary]).to(self.device)
        held = self.weight.detach() if self.host_tier is None else self.host_tier.rows(self.weight.detach())
        mask = torch.from_numpy(primary)
        full.view(sh.num_rows, sh.columns, self.width)[rows, self.shard_of[mask].to(self.device)] = \
            held[mask.to(self.device)]
        return self.comm.all_reduce(full, None, None).wait().cpu()

    def report(self) -> dict[str, Any]:
        """The plan, lookups served per rank, and every collective's bytes over the run (all steps, all ranks):
        totals split intra/inter node, and the [P, P] matrix of bytes each source rank sent each destination."""
        served = self.comm.gather_objects(self._served_total)
        matrices = self.comm.gather_objects(self.comm.ledger.total)  # each rank's row of every matrix
        ledger = Ledger(self.comm.topology)
        for c in ledger.total:
            ledger.add(c, sum(m[c] for m in matrices))
        collectives = ledger.summary()
        for c, m in ledger.total.items():
            collectives[c]["matrix"] = m.tolist()
        mean = float(np.mean(served)) if served else 0.0
        host = {} if self.sharding.off_device is None else {
            "host_lookups_per_rank": [int(h) for h in self.comm.gather_objects(self._host_total)]}
        return {**self.sharding.describe(self.dim, self.optimizer.state_width(self.dim), self.inputs.budget_bytes()),
                "served_lookups_per_rank": [int(s) for s in served],
                "load_imbalance": float(max(served) / mean) if mean > 0 else float("nan"),
                "wire": self.comm.wire.record(), "rw_protocol": self.rw_protocol,
                "collectives": collectives, **host}


class FlexShardStore(ShardedStore):
    """FlexShard (Sethi et al. 2023): per-row tiers chosen by a solver over the topology's costs."""

    Options = FlexShardOptions
