"""One pricing function per technique: what its store's code does in each phase of a step, as named terms.

Every function has one signature (``PriceFn``): it adds its technique's
terms to ``t``, which arrives holding the loop's own (``batch_terms``: the
batch's read, its shipping, the dense step). No function tests a method's
name: a method's entry names its function. Only the overlap the techniques
claim is modelled, as the code implements it (``price_scratchpipe``,
``price_proactive``; docs/costmodel.md, "Overlap"); nothing else overlaps:
the timer's phases are sequential on the training path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from hotcold.costmodel.collectives import collective_ms, comm_rates, concurrent_ms
from hotcold.costmodel.pricing import (Costs, Terms, device_lookup, grad_sum, host_lookup, param_move, row_optimizer,
                                      row_update)
from hotcold.costmodel.workload import Workload
from hotcold.counters import PROACTIVE_WINDOWS

#: a technique's pricing: adds its terms of one step of the workload to the terms, at the profile's costs
PriceFn = Callable[[Terms, Costs, Workload], None]


def price_device(t: Terms, c: Costs, w: Workload) -> None:
    """Every row in device memory: plan the ids, gather, update on the device."""
    device_lookup(t, c, w, w.c("lookups"), w.c("unique_rows"), "h2d", table_rows=w.table_rows())


def price_hybrid(t: Terms, c: Costs, w: Workload) -> None:
    """Every row in host memory: gather there, vectors over, gradients back, update there."""
    host_lookup(t, c, w, w.c("lookups"), w.c("unique_rows"))


def price_cache(t: Terms, c: Costs, w: Workload) -> None:
    """A software cache of ``capacity`` device slots (LRU, LFU, the frequency-aware cache): its directory,
    write-backs and fetches of rows with their state, then a lookup served from the slots."""
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    cap = float(w.report.get("capacity", 0) or 0)
    scan = cap if w.c("evictions") > 0 else 0.0
    t.add("h2d", "directory", c.ids(unique, "host_directory_row_ns") + c.ids(scan, "host_directory_slot_ns"))
    t.add("d2h", "write_back", param_move(c, w, w.c("param_rows_d2h"), to_device=False, slots=cap))
    t.add("h2d", "fetch", param_move(c, w, w.c("param_rows_h2d"), to_device=True, slots=cap))
    slot_map = w.table_bytes(w.table_rows(), 8)  # the directory's slot of every row
    t.add("h2d", "slots", c.host_gather(lookups, 8, slot_map) + c.ship(8 * (lookups + 2 * unique), 3) + c.host_ops(4))
    device_lookup(t, c, w, lookups, unique, "h2d", table_rows=cap)


def price_fae(t: Terms, c: Costs, w: Workload) -> None:
    """FAE: a batch is hot (served from the device's hot rows) or cold (the hybrid path), in the
    proportion ``hot_batch``; the hot set's syncs as the counters' parameter rows."""
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    hot = min(1.0, max(0.0, w.c("hot_batch")))
    hot_rows = float(w.report.get("hot_rows", 0) or 0)
    per_row = w.table_bytes(w.table_rows(), 4)  # FAE's hot-slot map: an int32 per row
    t.add("emb_fwd", "classify", c.host_gather(lookups, 4, per_row) + c.host_bytes(lookups * 9) + c.host_ops(4))
    hot_t, cold_t = Terms(), Terms()
    device_lookup(hot_t, c, w, lookups, unique, "h2d", table_rows=hot_rows or w.table_rows())
    hot_t.add("h2d", "slot_of", c.host_gather(lookups + unique, 4, per_row))
    host_lookup(cold_t, c, w, lookups, unique)
    for share, part, label in ((hot, hot_t, "hot"), (1 - hot, cold_t, "cold")):
        for phase, name, ms in part.items:
            t.add(phase, f"{label}_{name}", share * ms)
    # a sync moves the whole hot set: the counters' param rows per step already average the syncs
    to_dev, to_host = w.c("param_rows_h2d"), w.c("param_rows_d2h")
    t.add("h2d", "hot_sync_h2d", param_move(c, w, to_dev, True, hot_rows) if hot_rows else 0.0)
    t.add("d2h", "hot_sync_d2h", param_move(c, w, to_host, False, hot_rows) if hot_rows else 0.0)


def price_scratchpipe(t: Terms, c: Costs, w: Workload) -> None:
    """ScratchPipe: admission of batch i+W on the training thread, the scratchpad lookup, and the side
    work of which only the excess over W steps of training is in the step.

    Overlap: the gather of missing rows and the scatter of evicted rows
    (the ``gather``/``scatter`` stages of ``MovePipeline``) run on worker
    threads (on a GPU with the copies on a side stream) while the W batches
    ahead of them train. They are assumed to run on resources the training
    path does not use; only their excess over W steps of training shows in the
    step (``h2d.side_wait``, where training waits for them). The copy-out and,
    on a CPU, the copy-in run on the training thread and are in the step.

    The loop's terms already in ``t`` are the step without ScratchPipe's own work; its terms are listed
    before them (the order in which the step's sums have always been taken)."""
    loop, t.items = t.items, []
    step_without_side = sum(ms for _, _, ms in loop)
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    fetched, evicted = w.c("param_rows_h2d"), w.c("param_rows_d2h")
    window = max(1, int(w.report.get("window", w.store.get("window", 2)) or 1))
    # batch i+W's rows (planned a step ahead by the step pipeline), then its admission on the training thread:
    # the directory, the copy-out of the victims
    scan = float(w.report.get("capacity", 0) or 0) if fetched > 0 else 0.0
    t.add("h2d", "plan_ids", c.ids(lookups, "host_id_plan_ns") + c.ids(lookups, "host_unique_ns"))
    t.add("h2d", "admit", c.ids(unique, "host_directory_row_ns") + c.ids(scan, "host_directory_slot_ns")
          + c.host_ops(8))
    cap = float(w.report.get("capacity", 0) or 0) or w.table_rows()
    parts = [w.vector_bytes] + ([w.state_bytes] if w.state_width else [])
    host = {b: w.table_bytes(w.table_rows(), b) for b in parts}
    pad = {b: w.table_bytes(cap, b) for b in parts}
    copy_out = sum(c.dev_gather(evicted, b, pad[b]) + c.d2h(evicted * b, 1) for b in parts)
    gather = sum(c.host_gather(fetched, b, host[b]) for b in parts)
    scatter = sum(c.host_scatter(evicted, b, host[b]) for b in parts)
    copy_in = sum(c.h2d(fetched * b, 1) + c.dev_scatter(fetched, b, pad[b]) for b in parts)
    if c.host:  # copy-out and copy-in run on the training thread; gather and scatter on the workers
        t.add("h2d", "copy_out", copy_out)
        t.add("h2d", "copy_in", copy_in)
        side = {"gather": gather, "scatter": scatter}
    else:       # on a GPU every stage is off the training stream
        side = {"copy_out": copy_out, "gather": gather, "scatter": scatter, "copy_in": copy_in}
    slot_map = w.table_bytes(w.table_rows(), 8)
    # in forward, on the training thread: the batch's slots and their grouping shipped
    t.add("emb_fwd", "lookup_slots", c.host_gather(lookups, 8, slot_map) + c.ship(8 * (lookups + 2 * unique), 3)
          + c.host_ops(5))
    t.add("emb_fwd", "device_gather", c.dev_gather(lookups, w.vector_bytes, pad[w.vector_bytes]) + c.ops(2))
    row_update(t, c, w, "emb_update", lookups, unique, on_host=c.host, table_rows=cap)
    overlap = window * (step_without_side + sum(ms for _, _, ms in t.items))
    total = sum(side.values())
    exposed = max(0.0, total - overlap)
    t.add("h2d", "side_wait", exposed)
    for name, ms in side.items():
        t.hidden[f"scratchpipe_{name}"] = ms * (1 - exposed / total) if total > 0 else 0.0
    t.items.extend(loop)


# -- scale-out: the hybrid-parallel exchange ------------------------------------------------------------

def _per_rank(w: Workload, total: float) -> float:
    """A per-rank share of a counter summed over ranks, at the run's load imbalance.

    Counters of a run over P ranks are sums over ranks: per-rank lookup work is
    taken to be the total / P times the run's ``load_imbalance`` (max / mean
    lookups served), or 1 when the record has none.
    """
    imbalance = float(w.report.get("load_imbalance", 1.0) or 1.0)
    if not math.isfinite(imbalance):
        imbalance = 1.0
    return total / max(1, w.world) * imbalance


@dataclass(frozen=True)
class _Exchange:
    """One rank's share of a sharded step, and the step's collectives in ms."""

    local: float            # lookups of the rank's slice of the batch
    mine: float             # lookups the rank serves
    early: float            # of which looked up early (Proactive; none in a plain exchange)
    shard_rows: float       # a row plan's rows, a column plan's slice: 1/P of the table
    comm: dict[str, float]  # collective -> ms
    unique: float = 0.0     # distinct rows the rank updates
    host: float = 0.0       # of the lookups it serves, those of rows in its host memory (``host_tier``)
    host_rows: float = 0.0  # the rows it keeps in host memory
    h2d_bytes: float = 0.0  # the host rows' vectors copied to the device (``vector_bytes_h2d``)
    d2h_bytes: float = 0.0  # their gradients copied back (``grad_bytes_d2h``)

    @classmethod
    def of(cls, c: Costs, w: Workload) -> "_Exchange":
        lookups, served = w.c("lookups"), w.c("served_lookups") or w.c("lookups")
        local, mine = lookups / max(1, w.world), _per_rank(w, served)
        early = _per_rank(w, w.c("early_lookups"))
        comm = collective_ms(w, c.p)
        shard_rows = w.table_rows() / max(1, w.world)
        host = min(mine, _per_rank(w, w.c("host_lookups")))
        held = w.report.get("host_rows_per_rank") or []
        host_rows = float(sum(held)) / len(held) if held else (shard_rows if host > 0 else 0.0)
        return cls(local, mine, early, shard_rows, comm, _per_rank(w, w.c("unique_rows")) or mine, host,
                   min(host_rows, shard_rows), _per_rank(w, w.c("vector_bytes_h2d")) if host else 0.0,
                   _per_rank(w, w.c("grad_bytes_d2h")) if host else 0.0)

    @property
    def host_share(self) -> float:
        """The share of the rank's served lookups (and, assumed alike, of its distinct rows) in host memory."""
        return self.host / self.mine if self.mine > 0 else 0.0


def _lookups(t: Terms, c: Costs, w: Workload, x: _Exchange, phase: str, name: str, n: float) -> None:
    """An owner's gather of ``n`` of its served lookups: from its device rows, and (a host tier) the host-row
    share of them gathered on the host and their vectors copied to the device (the ``hybrid`` store's blocks)."""
    on_host = n * x.host_share
    device_rows = x.shard_rows - x.host_rows
    t.add(phase, name, c.dev_gather(n - on_host, w.vector_bytes, w.table_bytes(device_rows)) + c.ops(2))
    if on_host > 0:
        t.add(phase, "host_gather", c.host_gather(on_host, w.vector_bytes, w.table_bytes(x.host_rows)))
        t.add(phase, "vectors_h2d", c.h2d(x.h2d_bytes * n / x.mine, 1) + c.ops(1))


def _route(t: Terms, c: Costs, x: _Exchange) -> None:
    """Ids to their owners: the global rows of the rank's slice, grouped by owner."""
    t.add("input_a2a", "route_ids", c.ids(x.local, "host_id_plan_ns") + c.host_gather(x.local, 8, x.local * 8)
          + c.host_ops(8))


def _output(t: Terms, c: Costs, w: Workload, x: _Exchange, comm: float) -> None:
    """The vectors back to the ranks that asked (``comm``: the output all-to-all's exposed ms), in the batch's order."""
    t.add("output_a2a", "comm", comm)
    t.add("output_a2a", "reorder", c.dev_gather(x.local, w.vector_bytes, w.table_bytes(x.local)) + c.ops(2))


def _forward(t: Terms, c: Costs, w: Workload, x: _Exchange) -> None:
    """Ids to their owners, the owners' gathers (but the early ones), vectors back in the batch's order."""
    _route(t, c, x)
    t.add("input_a2a", "comm", x.comm.get("input_a2a", 0.0))
    _lookups(t, c, w, x, "emb_fwd", "owner_gather", x.mine - x.early)
    _output(t, c, w, x, x.comm.get("output_a2a", 0.0))


def _update(t: Terms, c: Costs, w: Workload, x: _Exchange, dense: bool = True) -> None:
    """The owners' row update after the gradient all-to-all, then the step's all-reduces (``dense``: the dense
    all-reduce too, where it runs blocking after the exchange).

    The gradients of every served lookup are summed on the device; a host tier's share of the distinct rows
    has its sums copied to the host and updated there (``HostTier.apply``), the rest on the device."""
    t.add("emb_update", "unique_ids", c.ids(x.mine, "host_unique_ns"))
    grad_sum(t, c, w, "emb_update", x.mine, x.unique, on_host=c.host)
    host_unique = x.unique * x.host_share
    row_optimizer(t, c, w, "emb_update", x.unique - host_unique, on_host=c.host, table_rows=x.shard_rows - x.host_rows)
    if host_unique > 0:
        t.add("emb_update", "grads_d2h", c.d2h(x.d2h_bytes, 1) + c.ops(1))
        row_optimizer(t, c, w, "emb_update", host_unique, on_host=True, table_rows=x.host_rows,
                      name="host_row_optimizer")
    for name in ("replica_allreduce", "column_allreduce") + (("dense_allreduce",) if dense else ()):
        if x.comm.get(name, 0.0) > 0:
            t.add(name, "comm", x.comm[name])


def price_sharded(t: Terms, c: Costs, w: Workload) -> None:
    """The hybrid-parallel exchange over a plan's shards (table, row, column, balanced, RecShard; FlexShard's
    tiers show in its counters: served lookups, the replicas' all-reduce). Every collective blocks. A plan's
    host rows (RecShard's, FlexShard's never-seen rows: ``host_lookups``) take the ``hybrid`` store's path:
    gathered on the host, vectors copied over, summed gradients copied back, updated on the host."""
    x = _Exchange.of(c, w)
    _forward(t, c, w, x)
    t.add("grad_a2a", "comm", x.comm.get("grad_a2a", 0.0))
    _update(t, c, w, x)


def _lookup_ms(c: Costs, w: Workload, x: _Exchange, n: float) -> float:
    """The time of an owner's gather of ``n`` served lookups (``_lookups``)."""
    part = Terms()
    _lookups(part, c, w, x, "emb_fwd", "owner_gather", n)
    return sum(ms for _, _, ms in part.items)


def proactive_windows(c: Costs, w: Workload, x: _Exchange) -> dict[str, float]:
    """The ms each of Proactive's windows (``PROACTIVE_WINDOWS``) is open: while its collective is in flight.

    The input and output all-to-alls fly alone. The dense all-reduce and the gradient all-to-all are issued
    together and share the links: together they take their bytes over the link rate, the latency once
    (``concurrent_ms``). Sharing the links fairly, the smaller finishes first: the dense all-reduce is in flight
    for ``latency + t_d + min(t_d, t_g)`` (``t``: a collective's time alone, less its latency), the gradient
    all-to-all's window is the rest of the pair's time (none when the all-reduce finishes last)."""
    comm = x.comm
    out = {"input_a2a": comm.get("input_a2a", 0.0), "output_a2a": comm.get("output_a2a", 0.0)}
    dense, grad = comm.get("dense_allreduce", 0.0), comm.get("grad_a2a", 0.0)
    if dense > 0 and grad > 0:
        latency = comm_rates(c.p)[2]
        both = concurrent_ms(w, c.p, ("dense_allreduce", "grad_a2a"))
        t_d, t_g = max(0.0, dense - latency), max(0.0, grad - latency)
        out["dense_allreduce"] = min(both, latency + t_d + min(t_d, t_g))
        out["grad_a2a"] = both - out["dense_allreduce"]
    else:
        out["dense_allreduce"], out["grad_a2a"] = dense, grad
    return out


def price_proactive(t: Terms, c: Costs, w: Workload) -> None:
    """The exchange with Proactive's lookups done while its collectives are in flight (``distributed.proactive``).

    Four windows a step (``proactive_windows``), in step order. In the
    input all-to-all's window (the next step's ids on their way) an owner
    looks up the current step's own rows (``served - early``), then early
    rows with the window's time left; the early lookups (``early_lookups``,
    looked up for this step in an earlier step's windows) fill the output
    all-to-all's, the dense all-reduce's and the gradient all-to-all's
    windows in that order, and what is left runs at the end of the gradient
    window, exposed. Lookups are charged in full in their phases (own:
    ``emb_fwd``, early: ``early_lookup``); each window's collective is
    charged only its time not covered by the lookups in it, and that cover
    is ``t.hidden["proactive_<window>"]``: at most the window, and all of
    them together at most the lookups. The dense all-reduce runs beside the
    gradient all-to-all, not after the exchange.
    """
    x = _Exchange.of(c, w)
    own = _lookup_ms(c, w, x, x.mine - x.early) if x.mine - x.early > 0 or x.early <= 0 else 0.0
    early = _lookup_ms(c, w, x, x.early) if x.early > 0 else 0.0
    windows = proactive_windows(c, w, x)
    hidden: dict[str, float] = {}
    left = early
    for name in PROACTIVE_WINDOWS:
        open_ms = windows[name]
        if name == "input_a2a":
            hidden[name] = min(own, open_ms)
            open_ms -= hidden[name]
        else:
            hidden[name] = 0.0
        take = min(left, open_ms)
        hidden[name] += take
        left -= take
    _route(t, c, x)
    t.add("input_a2a", "comm", windows["input_a2a"] - hidden["input_a2a"])
    if x.mine - x.early > 0 or x.early <= 0:  # every served row looked up early: no gather of its own
        _lookups(t, c, w, x, "emb_fwd", "owner_gather", x.mine - x.early)
    _output(t, c, w, x, windows["output_a2a"] - hidden["output_a2a"])
    if x.early > 0:
        _lookups(t, c, w, x, "early_lookup", "early_gather", x.early)
    for name in ("dense_allreduce", "grad_a2a"):
        if windows[name] > 0 or name == "grad_a2a":
            t.add(name, "comm", windows[name] - hidden[name])
    for name in PROACTIVE_WINDOWS:
        t.hidden[f"proactive_{name}"] = hidden[name]
    _update(t, c, w, x, dense=False)
