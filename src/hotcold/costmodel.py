"""A cost model: a run's counters and a hardware profile -> modelled per-phase step times.

Counters (``hotcold.counters``) say what a step looked up and moved; a
profile (``workflows/config/hardware/*.yaml``, or ``hotcold calibrate``'s
output) says how fast a machine does each kind of work. ``predict`` walks
through what each store's code does in each phase (``timing.PHASES`` and the
scale-out phases, the names the runs measure) and prices every piece as a
named term, so a prediction says which term dominates.

Primitive costs (ms), from the profile's rates:

- a host row gather (``index_select``) or scatter (``index_copy_``,
  ``index_add_``) of n rows of b bytes: ``n * row_ns + n * b / host_memory_bw``
  from a table larger than the last-level cache, ``n * cached_row_ns`` from one
  that fits. The rule: the table the phase gathers from (every row for
  ``device`` and ``hybrid``; a cache's slots; FAE's hot rows; ScratchPipe's
  scratchpad; a rank's shard; a per-batch buffer such as ``sum_by_index``'s
  [unique, D]) fits when ``sharers x its bytes <= host_cache_mib``, sharers
  being the processes on one machine (a ``cpu`` profile: the run's P ranks;
  a ``gpu`` profile: the ranks of a node). A table of unknown size (no dataset,
  no report to infer it from) is taken to be large;
- the loader's read of the global batch of B samples (every rank reads it and
  keeps its slice): ``B * host_data_sample_ns + B * sample_bytes / host_memory_bw``;
- an element-wise pass over b bytes: ``b / memory_bw``;
- id planning: ``ids * host_id_plan_ns`` (global rows from column ids) and
  ``ids * host_unique_ns`` (``RowGroups.of``: the lookups grouped by row by one sort);
- a cache or scratchpad directory's bookkeeping:
  ``unique_rows * host_directory_row_ns + slots_scanned * host_directory_slot_ns``;
- every op ``host_op_us`` of host dispatch (on a GPU ``max(host_op_us,
  device_kernel_us)``);
- a device gather or scatter of n rows: ``n * b / (device_memory_bw *
  device_gather_efficiency)``; a copy over PCIe: ``bytes / pcie_bw +
  pcie_latency_us``;
- the dense forward, backward and optimizer: ``dense_ops * op latency +
  flops / dense_flops``.

On a ``cpu`` profile the trainer device is host memory: ``ship`` and
``.to(device)`` are no-ops, so activations cost no transfer, and a cache's
fetch or write-back is a host gather plus a host scatter.

Overlap (what the techniques claim, as the code implements it):

- ScratchPipe: the gather of missing rows and the scatter of evicted rows
  (the ``gather``/``scatter`` stages of ``MovePipeline``) run on worker
  threads (on a GPU with the copies on a side stream) while the W batches
  ahead of them train. They are assumed to run on resources the training
  path does not use; only their excess over W steps of training shows in the
  step (``h2d``, where training waits for them). The copy-out and, on a CPU,
  the copy-in run on the training thread and are in the step.
- Proactive: the early lookups run while the gradient all-to-all is in
  flight; ``early_lookup`` is their time, and ``grad_a2a`` is what remains of
  the collective after them (``max(0, a2a - early)``).
- Nothing else overlaps: the timer's phases are sequential on the training path.

Shared cores (a ``cpu`` profile, P ranks of t threads on C = ``host_cores``
cores, the record's core count when the profile has none): at P t > C the
ranks take turns. A rank waiting in a gloo collective sleeps, so its compute
phases run at full speed; before each collective it waits ``(P t / C - 1)``
times the compute it did since the previous collective (the peers' turns:
``<collective>.wait_for_peers``), and loopback transfers, CPU work, take
``P t / C`` times longer. A GPU profile gives each rank its own GPU: no sharing.
A rank's dense step and the batch it ships are its 1/P slice of the global batch.

Collectives: every rank sends its bytes to ranks on its own node at
``intra_node_bw`` and to other nodes at ``inter_node_bw`` (both per GPU, one
direction), the two links in parallel; a collective takes as long as its
slowest rank: ``max_r max(intra_r / intra_bw, inter_r / inter_bw) +
collective_latency``. From a run's record the per-rank bytes come from the
store report's [P, P] matrices; from totals only (``shard-sim`` rows,
counters), each collective's bytes are assumed split evenly over ranks and
between intra- and inter-node links in the proportion of the totals.
Counters of a run over P ranks are sums over ranks: per-rank lookup work is
assumed to be the total / P times the run's ``load_imbalance`` (max / mean
lookups served), or 1 when the record has none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hotcold.config import ConfigError

KINDS = ("cpu", "gpu")

#: rate -> (unit, what it is); every profile gives these
HOST_RATES = {
    "host_memory_bw": ("GB/s", "host memory bandwidth (a large memcpy: bytes copied / time)"),
    "host_gather_row_ns": ("ns/row", "fixed cost per row of a host row gather (index_select) beyond its bytes"),
    "host_scatter_row_ns": ("ns/row", "fixed cost per row of a host row scatter (index_copy_/index_add_)"),
    "host_id_plan_ns": ("ns/id", "global rows from column ids (offset add, padding check)"),
    "host_unique_ns": ("ns/id", "RowGroups.of (lookups grouped by row, one sort), per id of a batch"),
    "host_directory_row_ns": ("ns/row", "cache/scratchpad directory bookkeeping per unique row"),
    "host_directory_slot_ns": ("ns/slot", "directory scan per slot when choosing victims"),
    "host_op_us": ("us/op", "host dispatch latency of one tensor op"),
    "dense_flops": ("GFLOP/s", "fp32 rate the DLRM MLPs and interaction reach (forward, backward, optimizer)"),
    "host_cache_mib": ("MiB", "last-level cache of the host: the tables that fit in it use the cached row rates"),
    "host_cached_gather_row_ns": ("ns/row", "a host row gather from a table that fits in the last-level cache, "
                                            "per row, its bytes included"),
    "host_cached_scatter_row_ns": ("ns/row", "a host row scatter into a table that fits in the last-level cache, "
                                             "per row, its bytes included"),
    "host_data_sample_ns": ("ns/sample", "the loader's read of one sample (memory-mapped dense features, ids and "
                                         "label at sorted rows, into tensors) beyond its bytes"),
}
#: optional: the cores the processes of a ``cpu`` profile's machine share
SHARED_RATES = {
    "host_cores": ("count", "cores the host's processes share: P ranks of t threads beyond them slow down"),
    "host_parallel_efficiency": ("fraction", "a one-thread process's speed when every core runs one, as a share "
                                             "of its speed alone (shared caches, memory, hyperthreads)"),
}
DEVICE_RATES = {
    "pcie_h2d_bw": ("GB/s", "host-to-device copy bandwidth, pinned, effective"),
    "pcie_d2h_bw": ("GB/s", "device-to-host copy bandwidth, pinned, effective"),
    "pcie_latency_us": ("us", "latency of one host-device copy"),
    "device_memory_bw": ("GB/s", "device memory bandwidth"),
    "device_gather_efficiency": ("fraction", "share of device bandwidth a row gather/scatter of D floats reaches"),
    "device_kernel_us": ("us", "kernel launch latency"),
}
COMM_RATES = {
    "collective_latency_us": ("us", "latency of one collective"),
    "intra_node_bw": ("GB/s", "intra-node (NVLink) bandwidth per GPU, one direction"),
    "inter_node_bw": ("GB/s", "inter-node (InfiniBand/Ethernet) bandwidth per GPU, one direction"),
    "gpus_per_node": ("count", "GPUs (ranks) per node"),
}
ALL_RATES = {**HOST_RATES, **SHARED_RATES, **DEVICE_RATES, **COMM_RATES}
#: the scale-out collectives (``distributed.traffic.COLLECTIVES``) and their phases, same names
COLLECTIVES = ("input_a2a", "output_a2a", "grad_a2a", "replica_allreduce", "column_allreduce", "dense_allreduce")
FLOAT = 4
MiB = 1 << 20


@dataclass(frozen=True)
class Rate:
    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class HardwareProfile:
    """A machine's rates; ``kind`` ``cpu``: the trainer device is host memory (no transfers)."""

    name: str
    description: str
    kind: str
    rates: dict[str, Rate]

    def value(self, key: str) -> float:
        if key not in self.rates:
            raise ConfigError(f"hardware profile {self.name!r} has no rate {key!r} (needed here)")
        return self.rates[key].value

    def has(self, key: str) -> bool:
        return key in self.rates

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "kind": self.kind,
                "rates": {k: {"value": r.value, "unit": r.unit, "source": r.source} for k, r in self.rates.items()}}


def required_rates(kind: str) -> dict[str, tuple[str, str]]:
    """The rates a profile of ``kind`` must give. The network's (``COMM_RATES``) are optional: a
    calibrated single-machine profile has none, and modelling a collective without them is an error."""
    return {**HOST_RATES, **DEVICE_RATES} if kind == "gpu" else dict(HOST_RATES)


def profile_from_dict(data: Any, where: str) -> HardwareProfile:
    """Validate a profile mapping; every problem is a ConfigError naming ``where`` and the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a hardware profile must be a mapping")
    unknown = sorted(set(data) - {"name", "description", "kind", "rates"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: description, kind, name, rates")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ConfigError(f"{where}: {key} must be a non-empty string")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
    raw = data.get("rates")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: rates must be a mapping of rate -> {{value, unit, source}}")
    need = required_rates(kind)
    bad = sorted(set(raw) - set(ALL_RATES))
    if bad:
        raise ConfigError(f"{where}: unknown rate(s) {bad}; known: {sorted(ALL_RATES)}")
    missing = sorted(set(need) - set(raw))
    if missing:
        raise ConfigError(f"{where}: missing rate(s) {missing} (a {kind} profile needs {sorted(need)})")
    rates = {}
    for key, entry in raw.items():
        at = f"{where}: rates.{key}"
        if not isinstance(entry, Mapping) or set(entry) != {"value", "unit", "source"}:
            raise ConfigError(f"{at} must be a mapping with exactly value, unit and source")
        v = entry["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{at}: value must be a finite number > 0, got {v!r}")
        unit = ALL_RATES[key][0]
        if entry["unit"] != unit:
            raise ConfigError(f"{at}: unit must be {unit!r}, got {entry['unit']!r}")
        if not isinstance(entry["source"], str) or len(entry["source"].strip()) < 8:
            raise ConfigError(f"{at}: source must say where the value comes from, got {entry['source']!r}")
        if key in ("device_gather_efficiency", "host_parallel_efficiency") and v > 1:
            raise ConfigError(f"{at}: a share of the bandwidth is at most 1, got {v!r}")
        rates[key] = Rate(float(v), unit, entry["source"].strip())
    return HardwareProfile(data["name"], data["description"].strip(), kind, rates)


def load_profile(path: str | Path) -> HardwareProfile:
    """A hardware profile from a YAML file (see ``workflows/config/hardware/``)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    return profile_from_dict(data, str(path))


# -- the workload --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """The dense model's sizes: what its FLOPs and ops are counted from."""

    num_dense: int = 13
    num_tables: int = 26
    dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 32, 1)
    history: int = 0          # sequence model: events of the history (0: DLRM)
    rows: int = 0             # embedding rows of all tables (0: unknown)

    @classmethod
    def of(cls, ds: Any, model_cfg: Any) -> "ModelShape":
        """From an open ``Dataset`` and a ``ModelConfig``."""
        hist = int(ds.sequence["max_length"]) if ds.sequence else 0
        return cls(ds.num_dense, ds.num_tables, model_cfg.embedding_dim, tuple(model_cfg.bottom_mlp),
                   tuple(model_cfg.top_mlp), hist, int(sum(ds.cardinalities)))

    @property
    def id_columns(self) -> int:
        """Id columns of a sample: one per table, and a history's events (item and category each)."""
        return self.num_tables if not self.history else 3 + 2 * self.history

    @property
    def sample_bytes(self) -> int:
        """Bytes the loader reads for one sample: float32 dense features, int32 ids, a float32 label."""
        return (self.num_dense + self.id_columns + 1) * FLOAT

    def _layers(self) -> list[tuple[int, int]]:
        d = self.dim
        if self.history:
            widths = [7 * d, *self.top_mlp]
            return [(2 * d, 2 * d)] + list(zip(widths, widths[1:]))
        f = self.num_tables + 1
        bottom = [self.num_dense, *self.bottom_mlp]
        top = [d + f * (f - 1) // 2, *self.top_mlp]
        return list(zip(bottom, bottom[1:])) + list(zip(top, top[1:]))

    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample: 3 x the forward's (backward: two matmuls per matmul)."""
        fwd = sum(2.0 * a * b for a, b in self._layers())
        if self.history:
            fwd += 2 * 2.0 * self.history * 2 * self.dim          # scores and pooling einsums
        else:
            f = self.num_tables + 1
            fwd += 2.0 * f * f * self.dim                           # the pairwise-dot bmm
        return 3.0 * fwd

    def dense_ops(self) -> int:
        """Tensor ops of a dense step: per linear layer ~6 (addmm, activation; backward 2 mm, sum,
        activation), 4 Adagrad ops per parameter tensor (weight, bias), and ~20 for the interaction or
        attention, concatenations and the loss."""
        n = len(self._layers())
        return 6 * n + 8 * n + 20


@dataclass(frozen=True)
class Workload:
    """What the model needs from one run (per step; counters are sums over ranks)."""

    method: str
    batch_size: int
    counters: dict[str, float]
    shape: ModelShape
    row_optimizer: str = "adagrad"
    store: dict[str, Any] = field(default_factory=dict)         # the run's store options
    report: dict[str, Any] = field(default_factory=dict)        # the record's store report
    world: int = 1
    ranks_per_node: int = 1
    threads: int = 1                                            # torch threads of each rank
    cores: int = 0                                              # the run's machine's cores (0: not recorded)
    assumptions: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, record: Mapping[str, Any], shape: ModelShape | None = None) -> "Workload":
        """From a record's config, summary (``counters_per_step``) and store report.

        ``shape``: the dense model's sizes (``ModelShape.of(dataset, model config)``); without it a
        DLRM with Criteo's 13 dense features and one table per id column is assumed (and said so).
        """
        if record.get("status", "ok") != "ok" or "summary" not in record:
            raise ConfigError(f"record {record.get('method')}/{record.get('variant')}: not a trained run")
        cfg, summary = record.get("config", {}), record["summary"]
        model, train = cfg.get("model", {}), cfg.get("train", {})
        dist = cfg.get("distributed", {})
        prov = record.get("provenance") or {}
        counters = {k: float(v) for k, v in summary.get("counters_per_step", {}).items()}
        batch = int(summary.get("batch_size", train.get("batch_size", 1024)))
        notes = []
        if shape is None:
            k = counters.get("lookups", 0.0) / max(batch, 1)
            shape = ModelShape(num_tables=max(1, round(k)), dim=int(model.get("embedding_dim", 16)),
                               bottom_mlp=tuple(model.get("bottom_mlp", (64, 16))),
                               top_mlp=tuple(model.get("top_mlp", (64, 32, 1))))
            notes.append(f"model shape assumed: DLRM, 13 dense features, {shape.num_tables} tables")
        return cls(method=record.get("method", cfg.get("method", "")), batch_size=batch, counters=counters,
                   shape=shape, row_optimizer=train.get("row_optimizer", "adagrad"),
                   store=dict(cfg.get("store") or {}), report=dict(record.get("store") or {}),
                   world=int(summary.get("world", dist.get("world", 1)) or 1),
                   ranks_per_node=int(summary.get("ranks_per_node", dist.get("ranks_per_node", 1)) or 1),
                   threads=int(prov.get("threads", 1) or 1), cores=int(prov.get("cores", 0) or 0),
                   assumptions=tuple(notes))

    def c(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    @property
    def state_width(self) -> int:
        return 1 if self.row_optimizer == "adagrad" else 0

    @property
    def vector_bytes(self) -> int:
        return self.shape.dim * FLOAT

    @property
    def row_bytes(self) -> int:
        return (self.shape.dim + self.state_width) * FLOAT

    def table_rows(self) -> float:
        """Embedding rows of all tables: the dataset's, else what the store report implies, else inf (a
        table of unknown size is taken to be larger than any cache)."""
        if self.shape.rows:
            return float(self.shape.rows)
        r = self.report
        for part, share in (("capacity", "cache_ratio"), ("hot_rows", "hot_ratio")):
            if r.get(part) and r.get(share):
                return float(r[part]) / float(r[share])
        return math.inf

    def table_bytes(self, rows: float, width: int | None = None) -> float:
        """Bytes of a table of ``rows`` rows of ``width`` bytes (default: one embedding vector)."""
        return rows * (self.vector_bytes if width is None else width)


# -- the prediction ------------------------------------------------------------------------------------

@dataclass
class Prediction:
    """Modelled ms per step: by phase, by named term (``phase.term``), and side work hidden from the step."""

    phases_ms: dict[str, float]
    terms_ms: dict[str, float]
    hidden_ms: dict[str, float]
    step_ms: float
    samples_per_s: float
    dominant: str
    profile: str
    assumptions: tuple[str, ...] = ()


class _Costs:
    """Primitive costs in ms on one profile (see the module docstring).

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
        """Dispatch of n ops on the trainer device."""
        us = self.p.value("host_op_us")
        if not self.host:
            us = max(us, self.p.value("device_kernel_us"))
        return n * us * 1e-3

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

    def d2h(self, nbytes: float, copies: float) -> float:
        if self.host or nbytes <= 0:
            return 0.0
        return nbytes / (self.p.value("pcie_d2h_bw") * 1e6) + copies * self.p.value("pcie_latency_us") * 1e-3

    def ids(self, n: float, key: str) -> float:
        return n * self._ns(key)


class _Terms:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, float]] = []
        self.hidden: dict[str, float] = {}

    def add(self, phase: str, name: str, ms: float) -> None:
        self.items.append((phase, name, max(0.0, float(ms))))


def _row_update(t: _Terms, c: _Costs, w: Workload, phase: str, lookups: float, unique: float,
                on_host: bool, table_rows: float) -> None:
    """``sum_by_index`` (into a [unique, D] buffer) then ``RowOptimizer.apply`` on ``unique`` rows of a
    table of ``table_rows`` rows (on the host or the trainer device)."""
    d_bytes = w.vector_bytes
    gather = c.host_gather if on_host else c.dev_gather
    scatter = c.host_scatter if on_host else c.dev_scatter
    stream = c.host_bytes if on_host else c.dev_bytes
    ops = c.host_ops if on_host else c.ops
    t.add(phase, "grad_sum", stream(unique * d_bytes) + scatter(lookups, d_bytes, unique * d_bytes) + ops(2))
    passes = 6 if w.state_width else 2  # adagrad: square, mean, divide, sqrt, scale, subtract
    weights, state = w.table_bytes(table_rows), w.table_bytes(table_rows, FLOAT)
    rows = gather(unique, d_bytes, weights) + scatter(unique, d_bytes, weights)
    if w.state_width:
        rows += gather(unique, FLOAT, state) + scatter(unique, FLOAT, state)
    t.add(phase, "row_optimizer", rows + stream(passes * unique * d_bytes) + ops(14 if w.state_width else 5))


def _batch_terms(t: _Terms, c: _Costs, w: Workload) -> None:
    """The loop's own work: read the global batch (every rank reads it, then keeps its slice), ship the
    rank's dense features and labels, its dense forward/backward."""
    b, k, nd = w.batch_size, w.shape.id_columns, w.shape.num_dense
    t.add("data", "read_batch", c.ids(b, "host_data_sample_ns") + c.host_bytes(b * w.shape.sample_bytes))
    b = b / max(1, w.world)
    t.add("h2d", "ship_batch", c.h2d(b * (nd * FLOAT + k + FLOAT), 3) + c.ops(3) + c.dev_bytes(b * k * 9))
    t.add("dense_fwd_bwd", "dense_compute", w.shape.flops_per_sample() * b / (c.p.value("dense_flops") * 1e6))
    t.add("dense_fwd_bwd", "dense_dispatch", c.ops(w.shape.dense_ops()))


def _device_lookup(t: _Terms, c: _Costs, w: Workload, lookups: float, unique: float, plan_phase: str,
                   table_rows: float) -> None:
    """A batch served from ``table_rows`` rows in device memory (``device``: every row; a cache's slots,
    FAE's hot rows, ScratchPipe's scratchpad)."""
    t.add(plan_phase, "plan_ids", c.ids(lookups, "host_id_plan_ns") + c.ids(lookups, "host_unique_ns")
          + c.h2d(8 * (2 * lookups + unique), 3) + c.host_ops(6))
    t.add("emb_fwd", "device_gather", c.dev_gather(lookups, w.vector_bytes, w.table_bytes(table_rows)) + c.ops(2))
    _row_update(t, c, w, "emb_update", lookups, unique, on_host=c.host, table_rows=table_rows)


def _host_lookup(t: _Terms, c: _Costs, w: Workload, lookups: float, unique: float) -> None:
    """The ``hybrid`` path: gather on the host, vectors over, gradients back, update on the host."""
    t.add("emb_fwd", "plan_ids", c.ids(lookups, "host_id_plan_ns") + c.host_ops(4))
    t.add("emb_fwd", "host_gather", c.host_gather(lookups, w.vector_bytes, w.table_bytes(w.table_rows())))
    t.add("h2d", "vectors_h2d", c.h2d(lookups * w.vector_bytes, 1) + c.ops(1))
    t.add("d2h", "grads_d2h", c.d2h(lookups * w.vector_bytes, 1) + c.ops(1))
    t.add("emb_update", "unique_ids", c.ids(lookups, "host_unique_ns"))
    _row_update(t, c, w, "emb_update", lookups, unique, on_host=True, table_rows=w.table_rows())


def _param_move(c: _Costs, w: Workload, rows: float, to_device: bool, slots: float) -> float:
    """Rows with their optimizer state between the host table and ``slots`` device slots: a gather on
    one side, the copy, a scatter on the other (on a CPU: a host gather and a host scatter)."""
    if rows <= 0:
        return 0.0
    ms = 0.0
    for nbytes in [w.vector_bytes] + ([FLOAT] if w.state_width else []):
        host, dev = w.table_bytes(w.table_rows(), nbytes), w.table_bytes(slots, nbytes)
        if to_device:
            ms += c.host_gather(rows, nbytes, host) + c.h2d(rows * nbytes, 1) + c.dev_scatter(rows, nbytes, dev)
        else:
            ms += c.dev_gather(rows, nbytes, dev) + c.d2h(rows * nbytes, 1) + c.host_scatter(rows, nbytes, host)
        ms += c.ops(3)
    return ms


def _cache(t: _Terms, c: _Costs, w: Workload) -> None:
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    cap = float(w.report.get("capacity", 0) or 0)
    scan = cap if w.c("evictions") > 0 else 0.0
    t.add("h2d", "directory", c.ids(unique, "host_directory_row_ns") + c.ids(scan, "host_directory_slot_ns"))
    t.add("d2h", "write_back", _param_move(c, w, w.c("param_rows_d2h"), to_device=False, slots=cap))
    t.add("h2d", "fetch", _param_move(c, w, w.c("param_rows_h2d"), to_device=True, slots=cap))
    slot_map = w.table_bytes(w.table_rows(), 8)  # the directory's slot of every row
    t.add("h2d", "slots", c.host_gather(lookups, 8, slot_map) + c.h2d(8 * (lookups + 2 * unique), 3) + c.host_ops(4))
    _device_lookup(t, c, w, lookups, unique, "h2d", table_rows=cap)


def _fae(t: _Terms, c: _Costs, w: Workload) -> None:
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    hot = min(1.0, max(0.0, w.c("hot_batch")))
    hot_rows = float(w.report.get("hot_rows", 0) or 0)
    per_row = w.table_bytes(w.table_rows(), 4)  # FAE's hot-slot map: an int32 per row
    t.add("emb_fwd", "classify", c.host_gather(lookups, 4, per_row) + c.host_bytes(lookups * 9) + c.host_ops(4))
    hot_t, cold_t = _Terms(), _Terms()
    _device_lookup(hot_t, c, w, lookups, unique, "h2d", table_rows=hot_rows or w.table_rows())
    hot_t.add("h2d", "slot_of", c.host_gather(lookups + unique, 4, per_row))
    _host_lookup(cold_t, c, w, lookups, unique)
    for share, part, label in ((hot, hot_t, "hot"), (1 - hot, cold_t, "cold")):
        for phase, name, ms in part.items:
            t.add(phase, f"{label}_{name}", share * ms)
    # a sync moves the whole hot set: the counters' param rows per step already average the syncs
    to_dev, to_host = w.c("param_rows_h2d"), w.c("param_rows_d2h")
    t.add("h2d", "hot_sync_h2d", _param_move(c, w, to_dev, True, hot_rows) if hot_rows else 0.0)
    t.add("d2h", "hot_sync_d2h", _param_move(c, w, to_host, False, hot_rows) if hot_rows else 0.0)


def _scratchpipe(t: _Terms, c: _Costs, w: Workload, step_without_side: float) -> None:
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    fetched, evicted = w.c("param_rows_h2d"), w.c("param_rows_d2h")
    window = max(1, int(w.report.get("window", w.store.get("window", 2)) or 1))
    # admission of batch i+W on the training thread: plan, unique, directory, copy-out of the victims
    scan = float(w.report.get("capacity", 0) or 0) if fetched > 0 else 0.0
    t.add("h2d", "admit", c.ids(lookups, "host_id_plan_ns") + c.ids(lookups, "host_unique_ns")
          + c.ids(unique, "host_directory_row_ns") + c.ids(scan, "host_directory_slot_ns") + c.host_ops(8))
    cap = float(w.report.get("capacity", 0) or 0) or w.table_rows()
    parts = [w.vector_bytes] + ([FLOAT] if w.state_width else [])
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
    _row_update(t, c, w, "emb_update", lookups, unique, on_host=c.host, table_rows=cap)
    overlap = window * (step_without_side + sum(ms for _, _, ms in t.items))
    total = sum(side.values())
    exposed = max(0.0, total - overlap)
    t.add("h2d", "side_wait", exposed)
    for name, ms in side.items():
        t.hidden[f"scratchpipe_{name}"] = ms * (1 - exposed / total) if total > 0 else 0.0


def _per_rank(w: Workload, total: float) -> float:
    """A per-rank share of a counter summed over ranks, at the run's load imbalance."""
    imbalance = float(w.report.get("load_imbalance", 1.0) or 1.0)
    if not math.isfinite(imbalance):
        imbalance = 1.0
    return total / max(1, w.world) * imbalance


def _sharded(t: _Terms, c: _Costs, w: Workload) -> None:
    lookups, served = w.c("lookups"), w.c("served_lookups") or w.c("lookups")
    local, mine = lookups / max(1, w.world), _per_rank(w, served)
    early = _per_rank(w, w.c("early_lookups"))
    comm = collective_ms(w, c.p)
    shard_rows = w.table_rows() / max(1, w.world)  # a row plan's rows, a column plan's slice: 1/P of the table
    shard = w.table_bytes(shard_rows)
    t.add("input_a2a", "route_ids", c.ids(local, "host_id_plan_ns") + c.host_gather(local, 8, local * 8)
          + c.host_ops(8))
    t.add("input_a2a", "comm", comm.get("input_a2a", 0.0))
    t.add("emb_fwd", "owner_gather", c.dev_gather(mine - early, w.vector_bytes, shard) + c.ops(2))
    t.add("output_a2a", "comm", comm.get("output_a2a", 0.0))
    t.add("output_a2a", "reorder", c.dev_gather(local, w.vector_bytes, w.table_bytes(local)) + c.ops(2))
    early_ms = c.dev_gather(early, w.vector_bytes, shard) + (c.ops(2) if early else 0.0)
    if w.method == "proactive":
        t.add("early_lookup", "early_gather", early_ms)
        t.add("grad_a2a", "comm", max(0.0, comm.get("grad_a2a", 0.0) - early_ms))
        t.hidden["proactive_early_lookup"] = min(early_ms, comm.get("grad_a2a", 0.0))
    else:
        t.add("grad_a2a", "comm", comm.get("grad_a2a", 0.0))
    t.add("emb_update", "unique_ids", c.ids(mine, "host_unique_ns"))
    _row_update(t, c, w, "emb_update", mine, _per_rank(w, w.c("unique_rows")) or mine, on_host=c.host,
                table_rows=shard_rows)
    for name in ("replica_allreduce", "column_allreduce", "dense_allreduce"):
        if comm.get(name, 0.0) > 0:
            t.add(name, "comm", comm[name])


def predict(workload: Workload, profile: HardwareProfile) -> Prediction:
    """Modelled per-phase times of one step of ``workload`` on ``profile`` (see the module docstring)."""
    w, t = workload, _Terms()
    c = _Costs(profile, sharers=w.world if profile.kind == "cpu" else w.ranks_per_node)
    _batch_terms(t, c, w)
    lookups, unique = w.c("lookups"), w.c("unique_rows")
    m = w.method
    if m == "device":
        _device_lookup(t, c, w, lookups, unique, "h2d", table_rows=w.table_rows())
    elif m == "hybrid":
        _host_lookup(t, c, w, lookups, unique)
    elif m in ("lru", "lfu", "freqcache"):
        _cache(t, c, w)
    elif m == "fae":
        _fae(t, c, w)
    elif m == "scratchpipe":
        base = sum(ms for _, _, ms in t.items)
        t.items = []
        _scratchpipe(t, c, w, base)
        _batch_terms(t, c, w)
    elif m in ("sharded", "proactive", "flexshard"):
        _sharded(t, c, w)
    else:
        raise ConfigError(f"cost model: no model of method {m!r}")
    compute, slowdown, notes = oversubscription(w, profile)
    if compute > 1 or slowdown > 1:
        _shared_cores(t, compute, slowdown)
    phases: dict[str, float] = {}
    terms: dict[str, float] = {}
    for phase, name, ms in t.items:
        phases[phase] = phases.get(phase, 0.0) + ms
        key = f"{phase}.{name}"
        terms[key] = terms.get(key, 0.0) + ms
    step = sum(phases.values())
    dominant = max(terms, key=terms.get) if terms else ""
    return Prediction(phases, terms, dict(t.hidden), step, w.batch_size / (step / 1e3) if step > 0 else math.nan,
                      dominant, profile.name, w.assumptions + notes)


#: a scale-out step's collectives in the order a rank reaches them (``train.py``, ``distributed/``)
STEP_ORDER = ("input_a2a", "output_a2a", "dense_allreduce", "grad_a2a", "replica_allreduce", "column_allreduce")
#: the compute a rank does before each collective (a phase, or ``phase.term``); the rest of the step
#: (the row update after the last collective, the next batch's read) comes before the first one
_BEFORE = {"output_a2a": ("emb_fwd",), "dense_allreduce": ("output_a2a.reorder", "dense_fwd_bwd"),
           "grad_a2a": ("early_lookup",), "column_allreduce": ("emb_update.unique_ids", "emb_update.grad_sum")}


def _shared_cores(t: _Terms, compute: float, slowdown: float) -> None:
    """P ranks on one machine's C cores (``oversubscription``). Every compute term runs ``compute`` times
    slower (cores busy side by side). At ``slowdown`` = P t / C > 1 the ranks take turns: a rank waiting
    in a gloo collective sleeps, so before each collective it waits ``(slowdown - 1)`` times the compute it
    did since the previous one (``<collective>.wait_for_peers``), and loopback transfers, CPU work, take
    ``slowdown`` times longer. The step comes to ``slowdown x (compute + transfers)``."""
    t.items = [(p, n, ms if n == "comm" else ms * compute) for p, n, ms in t.items]
    if slowdown <= 1:
        return
    present = [c for c in STEP_ORDER if any(p == c and n == "comm" for p, n, _ in t.items)]
    segment = {c: 0.0 for c in present}
    for phase, name, ms in t.items:
        if name == "comm" or not present:
            continue
        after = [c for c in present if phase in _BEFORE.get(c, ()) or f"{phase}.{name}" in _BEFORE.get(c, ())]
        segment[after[0] if after else present[0]] += ms
    t.items = [(p, n, ms * slowdown if n == "comm" else ms) for p, n, ms in t.items]
    for c in present:
        t.add(c, "wait_for_peers", (slowdown - 1) * segment[c])


def oversubscription(w: Workload, profile: HardwareProfile) -> tuple[float, float, tuple[str, ...]]:
    """(compute factor, slowdown, notes) of a scale-out run's P ranks of t threads on a ``cpu`` profile's
    machine of C cores (``host_cores``, else the record's; unknown: no sharing, and said so).

    Slowdown ``max(1, P t / C)``: the ranks take turns (``_shared_cores``). Compute factor: with b =
    ``min(P t, C)`` cores busy at once, ``1 + (1 / e - 1) (b - 1) / (C - 1)``, e being the profile's
    ``host_parallel_efficiency`` (1 when not calibrated, and said so). One process, or a ``gpu`` profile
    (a GPU and its host cores per rank): (1, 1)."""
    if profile.kind != "cpu" or w.world <= 1:
        return 1.0, 1.0, ()
    demand = max(1, w.world) * max(1, w.threads)
    cores = int(profile.value("host_cores")) if profile.has("host_cores") else w.cores
    if not cores:
        return 1.0, 1.0, (f"cores unknown: {demand} thread(s) assumed to have a core each",)
    notes: tuple[str, ...] = ()
    compute = 1.0
    if cores > 1 and demand > 1:
        if profile.has("host_parallel_efficiency"):
            busy = min(demand, cores)
            compute = 1 + (1 / profile.value("host_parallel_efficiency") - 1) * (busy - 1) / (cores - 1)
        else:
            notes = ("host_parallel_efficiency not calibrated: busy cores assumed as fast as one alone",)
    return compute, max(1.0, demand / cores), notes


def predict_record(record: Mapping[str, Any], profile: HardwareProfile,
                   shape: ModelShape | None = None) -> Prediction:
    return predict(Workload.from_record(record, shape), profile)


# -- collectives ---------------------------------------------------------------------------------------

def _comm_rates(profile: HardwareProfile) -> tuple[float, float, float]:
    """(intra GB/s, inter GB/s, latency ms); a clear error when the profile has no network."""
    for key in ("intra_node_bw", "inter_node_bw", "collective_latency_us"):
        if not profile.has(key):
            raise ConfigError(f"hardware profile {profile.name!r} has no {key}: it cannot model collectives")
    return profile.value("intra_node_bw"), profile.value("inter_node_bw"), profile.value("collective_latency_us") * 1e-3


def slowest_rank_ms(intra_bytes: Any, inter_bytes: Any, profile: HardwareProfile) -> float:
    """A collective's time: its slowest rank's sends (intra and inter links in parallel) plus its latency.

    ``intra_bytes``, ``inter_bytes``: each rank's bytes sent this step (sequences of equal length).
    """
    intra_bw, inter_bw, latency = _comm_rates(profile)
    times = [max(a / (intra_bw * 1e6), b / (inter_bw * 1e6)) for a, b in zip(intra_bytes, inter_bytes)]
    if not times or max(times) <= 0:
        return 0.0
    return max(times) + latency


def comm_ms(per_step_bytes: Mapping[str, float], world: int, ranks_per_node: int,
            profile: HardwareProfile) -> dict[str, float]:
    """Modelled ms per step of every collective from totals over ranks, and their ``total``.

    ``per_step_bytes``: a ``shard-sim`` row or a run's counters (``<collective>_bytes``,
    ``intra_node_bytes``, ``inter_node_bytes``). Each collective is split evenly over the ``world``
    ranks, and between intra- and inter-node links in the proportion of the totals (with one node
    everything is intra-node; with one rank per node everything is inter-node).
    """
    if world < 1 or ranks_per_node < 1 or world % ranks_per_node:
        raise ConfigError(f"comm_ms: ranks_per_node {ranks_per_node} must divide world {world}")
    intra, inter = float(per_step_bytes.get("intra_node_bytes", 0) or 0), \
        float(per_step_bytes.get("inter_node_bytes", 0) or 0)
    if world // ranks_per_node == 1:
        inter_share = 0.0
    elif ranks_per_node == 1:
        inter_share = 1.0
    else:
        inter_share = inter / (intra + inter) if intra + inter > 0 else 0.0
    out = {}
    for name in COLLECTIVES:
        total = float(per_step_bytes.get(f"{name}_bytes", 0) or 0)
        each = total / world
        out[name] = slowest_rank_ms([each * (1 - inter_share)] * world, [each * inter_share] * world, profile)
    out["total"] = sum(out.values())
    return out


def collective_ms(w: Workload, profile: HardwareProfile) -> dict[str, float]:
    """Per-step ms of each collective of a scale-out run: from the store report's [P, P] matrices when
    present (the slowest rank exactly), else from the counters' totals (``comm_ms``)."""
    import numpy as np

    collectives = w.report.get("collectives") or {}
    steps = None
    if collectives:
        total = sum(float(v.get("bytes", 0)) for v in collectives.values())
        per_step = sum(w.c(f"{n}_bytes") for n in COLLECTIVES)
        steps = total / per_step if per_step > 0 else None
    if not steps or not all("matrix" in v for v in collectives.values()):
        counters = {k: w.c(k) for k in w.counters}
        out = comm_ms(counters, w.world, w.ranks_per_node, profile)
        out.pop("total")
        return out
    # the report covers every step of the run (warm-up too): scale its bytes to the counters' mean step
    p, g = w.world, w.ranks_per_node
    nodes = np.arange(p) // g
    inter_mask = nodes[:, None] != nodes[None, :]
    out = {}
    for name in COLLECTIVES:
        entry = collectives.get(name)
        if not entry:
            out[name] = 0.0
            continue
        m = np.asarray(entry["matrix"], dtype=np.float64) / steps  # [P, P] bytes per step
        np.fill_diagonal(m, 0.0)
        out[name] = slowest_rank_ms((m * ~inter_mask).sum(axis=1), (m * inter_mask).sum(axis=1), profile)
    return out
