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

from hotcold.costmodel.collectives import collective_ms
from hotcold.costmodel.pricing import Costs, Terms, device_lookup, host_lookup, param_move, row_update
from hotcold.costmodel.workload import Workload
from hotcold.counters import FLOAT_BYTES

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
    t.add("h2d", "slots", c.host_gather(lookups, 8, slot_map) + c.h2d(8 * (lookups + 2 * unique), 3) + c.host_ops(4))
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
    # admission of batch i+W on the training thread: plan, unique, directory, copy-out of the victims
    scan = float(w.report.get("capacity", 0) or 0) if fetched > 0 else 0.0
    t.add("h2d", "admit", c.ids(lookups, "host_id_plan_ns") + c.ids(lookups, "host_unique_ns")
          + c.ids(unique, "host_directory_row_ns") + c.ids(scan, "host_directory_slot_ns") + c.host_ops(8))
    cap = float(w.report.get("capacity", 0) or 0) or w.table_rows()
    parts = [w.vector_bytes] + ([FLOAT_BYTES] if w.state_width else [])
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
    t.add("h2d", "slots", c.host_gather(lookups, 8, slot_map) + c.h2d(8 * (lookups + 2 * unique), 3)
          + c.host_ops(3))
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

    @classmethod
    def of(cls, c: Costs, w: Workload) -> "_Exchange":
        lookups, served = w.c("lookups"), w.c("served_lookups") or w.c("lookups")
        local, mine = lookups / max(1, w.world), _per_rank(w, served)
        early = _per_rank(w, w.c("early_lookups"))
        comm = collective_ms(w, c.p)
        return cls(local, mine, early, w.table_rows() / max(1, w.world), comm)


def _forward(t: Terms, c: Costs, w: Workload, x: _Exchange) -> None:
    """Ids to their owners, the owners' gathers (but the early ones), vectors back in the batch's order."""
    shard = w.table_bytes(x.shard_rows)
    t.add("input_a2a", "route_ids", c.ids(x.local, "host_id_plan_ns") + c.host_gather(x.local, 8, x.local * 8)
          + c.host_ops(8))
    t.add("input_a2a", "comm", x.comm.get("input_a2a", 0.0))
    t.add("emb_fwd", "owner_gather", c.dev_gather(x.mine - x.early, w.vector_bytes, shard) + c.ops(2))
    t.add("output_a2a", "comm", x.comm.get("output_a2a", 0.0))
    t.add("output_a2a", "reorder", c.dev_gather(x.local, w.vector_bytes, w.table_bytes(x.local)) + c.ops(2))


def _update(t: Terms, c: Costs, w: Workload, x: _Exchange) -> None:
    """The owners' row update after the gradient all-to-all, then the step's all-reduces."""
    t.add("emb_update", "unique_ids", c.ids(x.mine, "host_unique_ns"))
    row_update(t, c, w, "emb_update", x.mine, _per_rank(w, w.c("unique_rows")) or x.mine, on_host=c.host,
               table_rows=x.shard_rows)
    for name in ("replica_allreduce", "column_allreduce", "dense_allreduce"):
        if x.comm.get(name, 0.0) > 0:
            t.add(name, "comm", x.comm[name])


def price_sharded(t: Terms, c: Costs, w: Workload) -> None:
    """The hybrid-parallel exchange over a plan's shards (table, row, column, balanced; FlexShard's tiers
    show in its counters: served lookups, the replicas' all-reduce)."""
    x = _Exchange.of(c, w)
    _forward(t, c, w, x)
    t.add("grad_a2a", "comm", x.comm.get("grad_a2a", 0.0))
    _update(t, c, w, x)


def price_proactive(t: Terms, c: Costs, w: Workload) -> None:
    """The exchange with Proactive's early lookups hidden behind the gradient all-to-all.

    The early lookups run while the gradient all-to-all is in flight;
    ``early_lookup`` is their time, and ``grad_a2a`` is what remains of the
    collective after them (``max(0, a2a - early)``).
    """
    x = _Exchange.of(c, w)
    _forward(t, c, w, x)
    early_ms = c.dev_gather(x.early, w.vector_bytes, w.table_bytes(x.shard_rows)) + (c.ops(2) if x.early else 0.0)
    a2a = x.comm.get("grad_a2a", 0.0)
    t.add("early_lookup", "early_gather", early_ms)
    t.add("grad_a2a", "comm", max(0.0, a2a - early_ms))
    t.hidden["proactive_early_lookup"] = min(early_ms, a2a)
    _update(t, c, w, x)

