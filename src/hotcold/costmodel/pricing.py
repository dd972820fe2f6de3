"""Pricing: the primitive costs (ms) of a step's work on a profile, and the blocks the techniques share.

A step is priced as named terms ``(phase, term, ms)`` (``Terms``) in the
phases the runs measure, so that a prediction compares phase by phase with a
measured run. ``Costs`` turns a profile's rates into primitive costs (each
formula in its docstring and in docs/costmodel.md, "Primitive costs"); the
functions below price the blocks several techniques share.
"""
from __future__ import annotations

import math

from hotcold.costmodel.profile import HardwareProfile
from hotcold.costmodel.workload import Workload
from hotcold.counters import FLOAT_BYTES

MiB = 1 << 20


class Costs:
    """Primitive costs in ms on one profile.

    - a host row gather or scatter of n rows of b bytes: ``n * row_ns + n * b / host_memory_bw`` from a table
      larger than the last-level cache, ``n * cached_row_ns`` from one that fits: ``sharers x its bytes <=
      host_cache_mib``, sharers being the processes on one machine (a ``cpu`` profile: the run's P ranks; a
      ``gpu`` profile: a node's ranks). A table of unknown size is taken to be large;
    - the loader's read of B samples: ``B * host_data_sample_ns + B * sample_bytes / host_memory_bw``;
    - an element-wise pass over b bytes: ``b / memory_bw``; id planning: ``ids * host_id_plan_ns`` (global rows
      from column ids) and ``ids * host_unique_ns`` (``RowGroups.of``);
    - a cache's or scratchpad's directory: ``unique_rows * host_directory_row_ns + slots_scanned *
      host_directory_slot_ns``;
    - an op: ``host_op_us`` of dispatch (on a GPU ``dense_op_us``, else ``max(host_op_us, device_kernel_us)``);
    - a device gather or scatter of n rows: ``n * b / (device_memory_bw * device_gather_efficiency)``; a copy
      over PCIe: ``bytes / pcie_bw + pcie_latency_us``;
    - the dense forward, backward and optimizer: ``dense_ops * op latency + flops / dense_flops`` on a CPU; on a
      GPU the longer of launching its ops and running their kernels (``dense_terms``).

    On a ``cpu`` profile the trainer device is host memory: ``.to(device)`` is a no-op, so activations cost
    no transfer, and a cache's fetch or write-back is a host gather plus a host scatter.

    ``sharers``: the processes whose tables share the host's last-level cache (a run's ranks on one
    machine): a table fits when ``sharers`` tables of its size do.
    """

    def __init__(self, p: HardwareProfile, sharers: int = 1) -> None:
        self.p = p
        self.host = p.kind == "cpu"
        self.sharers = max(1, sharers)

    def fits(self, table_bytes: float) -> bool:
        """Whether a host table of ``table_bytes`` (one of each sharer) fits in the last-level cache."""
        return table_bytes * self.sharers <= self.p.value("host_cache_mib") * MiB

    def _ns(self, key: str) -> float:
        return self.p.value(key) * 1e-6

    def host_bytes(self, nbytes: float) -> float:
        return nbytes / (self.p.value("host_memory_bw") * 1e6)

    def host_gather(self, rows: float, row_bytes: float, table_bytes: float = math.inf) -> float:
        """A gather of ``rows`` rows from a table of ``table_bytes`` (default: larger than any cache)."""
        if self.fits(table_bytes):
            return rows * self._ns("host_cached_gather_row_ns")
        return rows * self._ns("host_gather_row_ns") + self.host_bytes(rows * row_bytes)

    def host_scatter(self, rows: float, row_bytes: float, table_bytes: float = math.inf) -> float:
        if self.fits(table_bytes):
            return rows * self._ns("host_cached_scatter_row_ns")
        return rows * self._ns("host_scatter_row_ns") + self.host_bytes(rows * row_bytes)

    def ops(self, n: float) -> float:
        """Dispatch of n ops on the trainer device: on a GPU each is launched eagerly from the training path,
        at ``dense_op_us`` where the profile measured it (the dense step's ops, with the code around them),
        else at ``max(host_op_us, device_kernel_us)`` (a bare launch loop's floor)."""
        if self.host:
            return n * self.p.value("host_op_us") * 1e-3
        if self.p.has("dense_op_us"):
            return n * self.p.value("dense_op_us") * 1e-3
        return n * max(self.p.value("host_op_us"), self.p.value("device_kernel_us")) * 1e-3

    def host_ops(self, n: float) -> float:
        return n * self.p.value("host_op_us") * 1e-3

    def dev_bytes(self, nbytes: float) -> float:
        if self.host:
            return self.host_bytes(nbytes)
        return nbytes / (self.p.value("device_memory_bw") * 1e6)

    def dev_gather(self, rows: float, row_bytes: float, table_bytes: float = math.inf) -> float:
        """A gather on the trainer device; a GPU's does not depend on the table's size (one rate)."""
        if self.host:
            return self.host_gather(rows, row_bytes, table_bytes)
        return rows * row_bytes / (self.p.value("device_memory_bw") * self.p.value("device_gather_efficiency") * 1e6)

    def dev_scatter(self, rows: float, row_bytes: float, table_bytes: float = math.inf) -> float:
        if self.host:
            return self.host_scatter(rows, row_bytes, table_bytes)
        return self.dev_gather(rows, 2 * row_bytes)  # read-modify-write

    def h2d(self, nbytes: float, copies: float) -> float:
        """Host-to-device copies: nothing on a CPU (``.to(cpu)`` returns the tensor itself)."""
        if self.host or nbytes <= 0:
            return 0.0
        return nbytes / (self.p.value("pcie_h2d_bw") * 1e6) + copies * self.p.value("pcie_latency_us") * 1e-3

    def ship(self, nbytes: float, tensors: float) -> float:
        """Host tensors shipped to the device as the stores do (``rows.ship``): each pinned, then copied without
        blocking: 3 ops a tensor and the copies. Nothing on a CPU."""
        if self.host:
            return 0.0
        return self.h2d(nbytes, tensors) + self.ops(3 * tensors)

    def d2h(self, nbytes: float, copies: float) -> float:
        if self.host or nbytes <= 0:
            return 0.0
        return nbytes / (self.p.value("pcie_d2h_bw") * 1e6) + copies * self.p.value("pcie_latency_us") * 1e-3

    def ids(self, n: float, key: str) -> float:
        return n * self._ns(key)


class Terms:
    """One step's named terms ``(phase, term, ms)`` in the order priced, and the side work hidden from it.

    The phases are those the runs measure (``timing.PHASES`` and the scale-out phases).
    """

    def __init__(self) -> None:
        self.items: list[tuple[str, str, float]] = []
        self.hidden: dict[str, float] = {}

    def add(self, phase: str, name: str, ms: float) -> None:
        self.items.append((phase, name, max(0.0, float(ms))))


def row_update(t: Terms, c: Costs, w: Workload, phase: str, lookups: float, unique: float,
               on_host: bool, table_rows: float) -> None:
    """``sum_by_index`` (into a [unique, D] buffer) then ``RowOptimizer.apply`` on ``unique`` rows of a
    table of ``table_rows`` rows (on the host or the trainer device)."""
    grad_sum(t, c, w, phase, lookups, unique, on_host)
    row_optimizer(t, c, w, phase, unique, on_host, table_rows)


def grad_sum(t: Terms, c: Costs, w: Workload, phase: str, lookups: float, unique: float, on_host: bool) -> None:
    """``sum_by_index``: ``lookups`` gradients summed into a [unique, D] buffer (on the host or the device)."""
    d_bytes = w.vector_bytes
    scatter = c.host_scatter if on_host else c.dev_scatter
    stream = c.host_bytes if on_host else c.dev_bytes
    ops = c.host_ops if on_host else c.ops
    t.add(phase, "grad_sum", stream(unique * d_bytes) + scatter(lookups, d_bytes, unique * d_bytes) + ops(2))


def row_optimizer(t: Terms, c: Costs, w: Workload, phase: str, unique: float, on_host: bool, table_rows: float,
                  name: str = "row_optimizer") -> None:
    """``RowOptimizer.apply`` on ``unique`` rows of a table of ``table_rows`` rows: read and write each row
    (and its Adagrad state), the element-wise passes."""
    d_bytes = w.vector_bytes
    gather = c.host_gather if on_host else c.dev_gather
    scatter = c.host_scatter if on_host else c.dev_scatter
    stream = c.host_bytes if on_host else c.dev_bytes
    ops = c.host_ops if on_host else c.ops
    # row-wise adagrad: square, mean, divide, sqrt, scale, subtract; per element also a sqrt and add per element
    passes = (7 if w.state_width > 1 else 6) if w.state_width else 2
    weights, state = w.table_bytes(table_rows), w.table_bytes(table_rows, w.state_bytes)
    rows = gather(unique, d_bytes, weights) + scatter(unique, d_bytes, weights)
    if w.state_width:
        rows += gather(unique, w.state_bytes, state) + scatter(unique, w.state_bytes, state)
    t.add(phase, name, rows + stream(passes * unique * d_bytes) + ops(14 if w.state_width else 5))


def batch_terms(t: Terms, c: Costs, w: Workload) -> None:
    """The loop's own work: read the rank's slice of the global batch, ship its dense features and labels, its
    dense forward/backward."""
    k, nd = w.shape.id_columns, w.shape.num_dense
    b = w.batch_size / max(1, w.world)
    t.add("data", "read_batch", c.ids(b, "host_data_sample_ns") + c.host_bytes(b * w.shape.sample_bytes))
    shipped = b * (nd * FLOAT_BYTES + k + FLOAT_BYTES)  # dense features, padding mask, labels
    t.add("h2d", "ship_batch", (c.ops(3) if c.host else c.ship(shipped, 3)) + c.dev_bytes(b * k * 9))
    dense_terms(t, c, w, b)


def dense_terms(t: Terms, c: Costs, w: Workload, b: float) -> None:
    """The dense forward, backward and optimizer of ``b`` samples.

    A CPU (or a GPU profile without the launch rates) runs the ops one after the other: their dispatch, then
    ``flops / dense_flops``. A GPU runs its kernels while the host launches the next ones: each op's kernels
    take ``dense_graph_op_us`` (the small step's per-op time as a CUDA graph: launched by the GPU itself) plus
    the arithmetic, and an eager step takes the longer of that and launching its ops (``dense_op_us`` each).
    A replayed graph also copies its inputs in and its loss out (5 eager ops)."""
    p, ops = c.p, w.shape.dense_ops()
    compute = w.shape.flops_per_sample() * b / (p.value("dense_flops") * 1e6)
    if c.host or not p.has("dense_op_us"):
        t.add("dense_fwd_bwd", "dense_compute", compute)
        t.add("dense_fwd_bwd", "dense_dispatch", c.ops(ops))
        return
    kernels = ops * p.value("dense_graph_op_us") * 1e-3 if p.has("dense_graph_op_us") else 0.0
    if w.dense_graphed:
        inputs = b * (w.shape.num_dense + w.shape.num_tables * w.shape.dim + 2) * FLOAT_BYTES
        t.add("dense_fwd_bwd", "graph_inputs", c.ops(5) + c.dev_bytes(2 * inputs))
        t.add("dense_fwd_bwd", "dense_kernels", kernels)
        t.add("dense_fwd_bwd", "dense_compute", compute)
        return
    launch = ops * p.value("dense_op_us") * 1e-3
    t.add("dense_fwd_bwd", "dense_launch", launch)
    t.add("dense_fwd_bwd", "dense_compute", max(0.0, kernels + compute - launch))  # what the launches leave over


def device_lookup(t: Terms, c: Costs, w: Workload, lookups: float, unique: float, plan_phase: str,
                  table_rows: float) -> None:
    """A batch served from ``table_rows`` rows in device memory (``device``: every row; a cache's slots,
    FAE's hot rows, ScratchPipe's scratchpad)."""
    t.add(plan_phase, "plan_ids", c.ids(lookups, "host_id_plan_ns") + c.ids(lookups, "host_unique_ns")
          + c.ship(8 * (2 * lookups + unique), 3) + c.host_ops(6))
    t.add("emb_fwd", "device_gather", c.dev_gather(lookups, w.vector_bytes, w.table_bytes(table_rows)) + c.ops(2))
    row_update(t, c, w, "emb_update", lookups, unique, on_host=c.host, table_rows=table_rows)


def host_lookup(t: Terms, c: Costs, w: Workload, lookups: float, unique: float) -> None:
    """The ``hybrid`` path: gather on the host, vectors over, gradients back, update on the host."""
    t.add("emb_fwd", "plan_ids", c.ids(lookups, "host_id_plan_ns") + c.host_ops(4))
    t.add("emb_fwd", "host_gather", c.host_gather(lookups, w.vector_bytes, w.table_bytes(w.table_rows())))
    t.add("h2d", "vectors_h2d", c.h2d(lookups * w.vector_bytes, 1) + c.ops(1))
    t.add("d2h", "grads_d2h", c.d2h(lookups * w.vector_bytes, 1) + c.ops(1))
    t.add("emb_update", "unique_ids", c.ids(lookups, "host_unique_ns"))
    row_update(t, c, w, "emb_update", lookups, unique, on_host=True, table_rows=w.table_rows())


def param_move(c: Costs, w: Workload, rows: float, to_device: bool, slots: float) -> float:
    """Rows with their optimizer state between the host table and ``slots`` device slots: a gather on
    one side, the copy, a scatter on the other (on a CPU: a host gather and a host scatter)."""
    if rows <= 0:
        return 0.0
    ms = 0.0
    for nbytes in [w.vector_bytes] + ([w.state_bytes] if w.state_width else []):
        host, dev = w.table_bytes(w.table_rows(), nbytes), w.table_bytes(slots, nbytes)
        if to_device:
            ms += c.host_gather(rows, nbytes, host) + c.h2d(rows * nbytes, 1) + c.dev_scatter(rows, nbytes, dev)
        else:
            ms += c.dev_gather(rows, nbytes, dev) + c.d2h(rows * nbytes, 1) + c.host_scatter(rows, nbytes, host)
        ms += c.ops(3)
    return ms
