"""One per-step counter schema for every store and every simulated policy.

Counters depend only on the data and the technique, never on the hardware.
Every store's ``step_counters`` and every row of a simulation carries all of
``FIELDS``, zeros where a technique does nothing of the kind, so a trained
run and a simulated one compare column by column. The kinds of traffic and
when a transfer is booked: ``StepCounters``; the glossary: docs/outputs.md,
"Counters".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: bytes of a float32: an embedding element, an optimizer state element, a looked-up vector's or gradient's element
FLOAT_BYTES = 4
#: the collectives a step may run, in step order; each counted as ``<name>_bytes``
COLLECTIVES = ("input_a2a", "output_a2a", "grad_a2a", "replica_allreduce", "column_allreduce", "dense_allreduce")
#: the collectives in flight while Proactive looks rows up early, in step order (``distributed.proactive``)
PROACTIVE_WINDOWS = ("input_a2a", "output_a2a", "dense_allreduce", "grad_a2a")


def _c(doc: str, default: int = 0) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass
class StepCounters:
    """What one training step looked up and moved.

    Two kinds of traffic are kept apart, and comparisons of traffic use bytes:

    - *parameter traffic*: embedding rows with their optimizer state (weights +
      state, ``(D + state) * 4`` bytes a row) copied between host and device
      memory: cache fills and write-backs, scratchpad fetches, FAE's hot-set
      synchronisations;
    - *activation traffic*: looked-up vectors sent to the device and their
      gradients sent back (``D * 4`` bytes each), as in the CPU-GPU hybrid.

    Scale-out runs add the bytes each rank sends in every collective (per
    collective, and split into intra- and inter-node); a run's record sums them
    over ranks.

    A transfer is booked at the step during which it happens: a look-ahead
    store's fetch for batch i+W is step i's traffic, and ``prefetch_batch`` says
    which batch it serves.
    """

    lookups: int = _c("non-padding lookups of the batch trained this step")
    unique_rows: int = _c("distinct rows among those lookups")
    hits: int = _c("lookups of rows already in device memory when the batch was planned")
    misses: int = _c("the other lookups, fetched first or served from the host (`lookups - hits`)")
    unique_hits: int = _c("distinct rows of the batch already in device memory when it was planned")
    unique_misses: int = _c("the other distinct rows (`unique_rows - unique_hits`)")
    evictions: int = _c("rows evicted from device memory during this step")
    param_rows_h2d: int = _c("parameter rows (weights + optimizer state) copied host to device")
    param_bytes_h2d: int = _c("their bytes: `param_rows_h2d * (D + state) * 4`")
    param_rows_d2h: int = _c("parameter rows copied device to host (write-backs, FAE's sync to the host)")
    param_bytes_d2h: int = _c("their bytes")
    vector_bytes_h2d: int = _c("activation traffic: looked-up vectors sent to the device (`D * 4` each)")
    grad_bytes_d2h: int = _c("activation traffic: their gradients sent back to the host")
    sync_rows: int = _c("FAE: hot rows synchronised when the batch kind switched (part of the parameter traffic)")
    sync_bytes: int = _c("FAE: their bytes")
    switches: int = _c("FAE: 1 when the batch kind switched before this batch (one hot-set sync)")
    hot_batch: int = _c("FAE: 1 when the batch ran entirely from device memory")
    prefetch_batch: int = _c("look-ahead: the batch the last fetch of this step serves (-1: no fetch)", -1)
    prefetch_unique_hits: int = _c("look-ahead: distinct rows of the batches admitted this step already resident")
    prefetch_unique_misses: int = _c("look-ahead: distinct rows of the batches admitted this step fetched")
    input_a2a_bytes: int = _c("scale-out: row ids (8 bytes each) and split sizes this rank sent to the rows' owners")
    output_a2a_bytes: int = _c("scale-out: looked-up vectors this rank's owned rows sent back to other ranks")
    grad_a2a_bytes: int = _c("scale-out: gradients of looked-up vectors this rank sent to the rows' owners")
    replica_allreduce_bytes: int = _c("scale-out: gradient all-reduce of replicated rows (ring), this rank's sends")
    column_allreduce_bytes: int = _c("scale-out, column-wise with row-wise Adagrad (`state: row`): each updated row's "
                                     "squared-gradient partial sums, sent to the table's other shard owners")
    dense_allreduce_bytes: int = _c("scale-out: gradient all-reduce of the dense layers (ring), this rank's sends")
    intra_node_bytes: int = _c("scale-out: all of this rank's collective bytes to ranks on its own node")
    inter_node_bytes: int = _c("scale-out: all of them to ranks on other nodes")
    served_lookups: int = _c("scale-out: lookups this rank served as owner or replica of the rows (its load)")
    early_lookups: int = _c("Proactive: of those, lookups served early, while an earlier step's collectives ran")
    host_lookups: int = _c("scale-out, RecShard: of the lookups this rank served, those of rows in its host memory "
                           "(their vectors and gradients are `vector_bytes_h2d` and `grad_bytes_d2h`)")

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in dataclasses.asdict(self).items()}

    @property
    def param_bytes(self) -> int:
        return self.param_bytes_h2d + self.param_bytes_d2h

    @property
    def activation_bytes(self) -> int:
        return self.vector_bytes_h2d + self.grad_bytes_d2h

    def set_param_traffic(self, rows_h2d: int, rows_d2h: int, row_bytes: int) -> "StepCounters":
        """Book parameter rows each way at ``row_bytes`` a row; returns self."""
        self.param_rows_h2d, self.param_bytes_h2d = rows_h2d, rows_h2d * row_bytes
        self.param_rows_d2h, self.param_bytes_d2h = rows_d2h, rows_d2h * row_bytes
        return self


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepCounters))


def row_bytes(dim: int, state_width: int) -> int:
    """Bytes of one parameter row: its weights and its optimizer state."""
    return (dim + state_width) * FLOAT_BYTES


def shard_state_floats(state_width: int, columns: int) -> int:
    """Floats of optimizer state each of a row's ``columns`` column shards keeps: row-wise Adagrad's one float
    whole on every shard, a per-element state (``state_width`` = the row's dim) split with the weights."""
    return state_width // columns if state_width > 1 else state_width


def exchanges_row_squares(state_width: int) -> bool:
    """Whether a row's column shards exchange its squared gradient's partial sums each step: row-wise Adagrad's
    state needs all of the row's columns; a per-element state only its own (``state_width`` > 1), SGD none."""
    return state_width == 1


def vector_bytes(dim: int) -> int:
    """Bytes of one looked-up vector (or its gradient)."""
    return dim * FLOAT_BYTES


def all_resident(lookups: int, unique_rows: int) -> StepCounters:
    """A batch served wholly from device memory, nothing moved."""
    return StepCounters(lookups=lookups, unique_rows=unique_rows, hits=lookups, unique_hits=unique_rows)


def all_host(lookups: int, unique_rows: int, dim: int) -> StepCounters:
    """A batch looked up in host memory: its vectors go to the device, their gradients come back."""
    moved = lookups * vector_bytes(dim)
    return StepCounters(lookups=lookups, unique_rows=unique_rows, misses=lookups, unique_misses=unique_rows,
                        vector_bytes_h2d=moved, grad_bytes_d2h=moved)


def glossary_markdown() -> str:
    """The counter glossary of docs/outputs.md: one table row per field, from the field docs."""
    lines = ["| counter | per step |", "|---|---|"]
    lines += [f"| `{f.name}` | {f.metadata['doc']} |" for f in dataclasses.fields(StepCounters)]
    return "\n".join(lines) + "\n"
