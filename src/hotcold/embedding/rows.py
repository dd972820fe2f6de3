"""A batch's rows: planning on the host, initial values, and gradient sums in a fixed order.

All tables of a model share one global row space: row ``offsets[t] + id`` is
id ``id`` of table ``t``. ``Lookup`` is what one batch reads, ``RowGroups``
its lookups grouped by row (planned on the host by one sort, so no store
synchronises the device to coalesce), and ``sum_by_index`` adds each row's
gradients in batch order, one after the other, on every processor: the sums
have the same bits on the CPU and on a GPU, run after run and at any thread
count, so a store that updates rows on the host trains the same bits as the
``device`` store updating them on the GPU. ``init_table`` gives every store
the same initial rows.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from hotcold.accel import Runtime
from hotcold.accel import normal_device
from hotcold.jit import KERNEL, jit

#: bits of the radix sort's digit at most: 2^11 counters a pass stay in a core's L1
RADIX_BITS = 11


@jit
def group_rows(rows):  # pragma: no cover - compiled; the plain-Python body is the same loop
    """int64 rows [L] (0 <= row < 2^31, L < 2^31) -> (order [L], distinct rows [U] ascending, offsets [U + 1]).

    A stable least-significant-digit radix sort of keys ``row << 32 | lookup``
    (digits of at most ``RADIX_BITS`` bits, as few passes as the largest row
    needs; one scan counts every pass's digits): ``order`` lists the lookups
    row by row, each row's in batch order, and the lookups of ``uniq[u]`` are
    ``order[offsets[u]:offsets[u + 1]]``.
    """
    n = rows.size
    top = 0
    for i in range(n):
        top = max(top, rows[i])
    bits = 1
    while top >> bits:
        bits += 1
    passes = (bits + RADIX_BITS - 1) // RADIX_BITS
    digit = (bits + passes - 1) // passes
    mask = (1 << digit) - 1
    count = np.zeros((passes, mask + 1), np.int64)
    keys = np.empty(n, np.int64)
    for i in range(n):
        keys[i] = (rows[i] << 32) | i
        for p in range(passes):
            count[p, (rows[i] >> (p * digit)) & mask] += 1
    other = np.empty(n, np.int64)
    for p in range(passes):
        start = 0
        for b in range(mask + 1):
            c = count[p, b]
            count[p, b] = start
            start += c
        shift = 32 + p * digit
        for i in range(n):
            b = (keys[i] >> shift) & mask
            other[count[p, b]] = keys[i]
            count[p, b] += 1
        keys, other = other, keys
    order = np.empty(n, np.int64)
    distinct = 0
    for i in range(n):
        order[i] = keys[i] & 0xFFFFFFFF
        if i == 0 or (keys[i] >> 32) != (keys[i - 1] >> 32):
            distinct += 1
    uniq = np.empty(distinct, np.int64)
    offsets = np.empty(distinct + 1, np.int64)
    u = -1
    for i in range(n):
        if i == 0 or (keys[i] >> 32) != (keys[i - 1] >> 32):
            u += 1
            uniq[u] = keys[i] >> 32
            offsets[u] = i
    offsets[distinct] = n
    return order, uniq, offsets


class RowGroups:
    """A batch's lookups grouped by the row they read: the plan of its gradient sum.

    rows [U] are the distinct rows, ascending; ``order`` [L] lists the lookups
    row by row (those of ``rows[0]`` first, each row's in batch order) and
    ``counts`` [U] says how many each row has. All int64 on the CPU, planned
    on the host by one stable sort.
    """

    def __init__(self, rows: torch.Tensor, order: torch.Tensor, counts: torch.Tensor) -> None:
        self.rows, self.order, self.counts = rows, order, counts
        self._inverse: dict[torch.device, torch.Tensor] = {}
        self._plan: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._offsets: torch.Tensor | None = None

    @classmethod
    def of(cls, rows: torch.Tensor) -> "RowGroups":
        """Group int64 rows [L] (>= 0) on the CPU.

        One stable sort of the rows gives the distinct rows, their counts and
        the order ``sum_by_index`` reads the gradients in: a radix sort
        (``group_rows``, compiled) where numba is installed and the rows and
        lookups fit its packed keys, else torch's stable sort (on int32 keys
        when the rows fit). The same groups either way (tested).
        """
        n = rows.numel()
        if KERNEL == "numba" and 0 < n < 2**31 and int(rows.max()) < 2**31:
            order, uniq, offsets = group_rows(rows.numpy())
            groups = cls(torch.from_numpy(uniq), torch.from_numpy(order), torch.from_numpy(np.diff(offsets)))
            groups._offsets = torch.from_numpy(offsets)
            return groups
        keys = rows.to(torch.int32) if n and int(rows.max()) < 2**31 else rows
        ordered, order = torch.sort(keys, stable=True)
        uniq, counts = torch.unique_consecutive(ordered, return_counts=True)
        return cls(uniq.to(torch.int64), order, counts)

    @property
    def size(self) -> int:
        """Distinct rows U."""
        return self.rows.numel()

    @property
    def offsets(self) -> torch.Tensor:
        """int64 [U + 1]: the lookups of row u are ``order[offsets[u]:offsets[u + 1]]``."""
        if self._offsets is None:
            self._offsets = torch.zeros(self.size + 1, dtype=torch.int64)
            torch.cumsum(self.counts, 0, out=self._offsets[1:])
        return self._offsets

    def plan(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``order`` [L] and the groups' starts [U] (int64) on ``device``: what ``sum_by_index`` reads there.

        Shipped once (one copy of both), then kept; a store calls it where it
        ships the step's other inputs, so the update itself moves nothing.
        """
        device = normal_device(device)
        if device not in self._plan:
            starts = self.offsets[:-1]
            if device.type == "cpu":
                self._plan[device] = (self.order, starts)
            else:
                both = ship(torch.cat([self.order.to(torch.int64), starts]), device)
                self._plan[device] = (both[: self.order.numel()], both[self.order.numel():])
        return self._plan[device]

    def inverse(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """int64 [L]: each lookup's index into ``rows``, on ``device`` (shipped once, then kept)."""
        cpu, device = torch.device("cpu"), normal_device(device)
        if cpu not in self._inverse:  # lookup order[j] reads row j's group: scatter the group numbers back
            group = torch.zeros(self.order.numel(), dtype=torch.int64)
            group[self.offsets[1:-1]] = 1
            self._inverse[cpu] = torch.empty_like(self.order).scatter_(0, self.order, torch.cumsum(group, 0))
        if device not in self._inverse:
            self._inverse[device] = ship(self._inverse[cpu], device)
        return self._inverse[device]


@dataclass
class Lookup:
    """The rows one batch looks up, planned on the host from its ids."""

    rows: torch.Tensor                 # int64 [L] global rows of the non-padding entries
    positions: torch.Tensor | None     # int64 [L] their flat positions in [B*K]; None: no padding
    shape: tuple[int, int]             # (B, K)
    _groups: RowGroups | None = field(default=None, repr=False)
    _positions: dict = field(default_factory=dict, repr=False)  # device -> ``positions`` there

    def positions_on(self, device: torch.device) -> torch.Tensor | None:
        """``positions`` on ``device`` (shipped once, then kept; a plan ships them with its other inputs)."""
        if self.positions is None or device.type == "cpu":
            return self.positions
        if device not in self._positions:
            self._positions[device] = ship(self.positions, device)
        return self._positions[device]

    @property
    def size(self) -> int:
        return self.rows.numel()

    def groups(self) -> RowGroups:
        """The lookups grouped by row, planned on the host once.

        ``torch.unique`` of a device tensor would synchronise the device
        inside the timed update.
        """
        if self._groups is None:
            self._groups = RowGroups.of(self.rows)
        return self._groups

    def unique(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The distinct rows [U] (ascending), each lookup's index into them [L] and their lookups [U]."""
        g = self.groups()
        return g.rows, g.inverse(), g.counts


#: rows drawn per staging chunk when a table is initialised on another device than the CPU
INIT_CHUNK_ROWS = 1 << 16


def table_bytes(num_rows: int, dim: int, state_width: int = 0) -> int:
    """Bytes of ``num_rows`` float32 rows of ``dim`` weights and ``state_width`` optimizer floats each."""
    return 4 * int(num_rows) * (int(dim) + int(state_width))


def init_table(table_sizes: Sequence[int], dim: int, seed: int,
               device: torch.device | str = "cpu", chunk_rows: int | None = None, extra_rows: int = 0) -> torch.Tensor:
    """Initial rows, float32 [sum(sizes) + extra_rows, dim] on ``device``, identical for every store and device.

    Table t is uniform in +-sqrt(1/n_t), as in the DLRM reference. The rows
    are drawn in place, in order, from one CPU generator (torch draws a
    uniform tensor element by element, so drawing a table in pieces gives the
    same bits as drawing it whole). On the CPU each table is drawn straight
    into the result; elsewhere (``chunk_rows`` rows at a time, default
    ``INIT_CHUNK_ROWS``) through one CPU staging buffer, so the host holds
    no copy of the table. ``chunk_rows`` on the CPU forces the staged path.
    ``extra_rows`` zero rows follow the tables' (a store's trash row).
    """
    gen = torch.Generator().manual_seed(seed)
    device = torch.device(device)
    out = torch.empty(sum(table_sizes) + extra_rows, dim, dtype=torch.float32, device=device)
    if device.type == "meta":  # shapes without values: nothing to draw
        return out
    out[sum(table_sizes):].zero_()
    staged = device.type != "cpu" or chunk_rows is not None
    chunk = max(1, int(chunk_rows or INIT_CHUNK_ROWS))
    buf = torch.empty(min(chunk, max(table_sizes, default=0)), dim, dtype=torch.float32) if staged else None
    start = 0
    for n in table_sizes:
        bound = (1.0 / n) ** 0.5
        if buf is None:
            out[start:start + n].uniform_(-bound, bound, generator=gen)
        else:
            for a in range(0, n, chunk):
                part = buf[:min(chunk, n - a)].uniform_(-bound, bound, generator=gen)
                out[start + a:start + a + part.shape[0]].copy_(part)
        start += n
    return out


_COPYING = threading.local()  # this thread's (copy stream, shipped tensors) inside ``copying_on``


@contextlib.contextmanager
def copying_on(rt: Runtime, stream: Any) -> Iterator[list[torch.Tensor]]:
    """Within: this thread's device work, ``ship``'s copies among it, goes to ``stream``; yields what ``ship`` made.

    The step pipeline's worker prepares the next step this way. Each shipped
    tensor was made on ``stream``: the consumer records its own stream on it
    (``Tensor.record_stream``) before using it, so that its memory is not
    reused while that stream still reads it.
    """
    shipped: list[torch.Tensor] = []
    before = getattr(_COPYING, "ctx", None)
    _COPYING.ctx = (stream, shipped)
    try:
        with rt.on(stream):
            yield shipped
    finally:
        _COPYING.ctx = before


def keep_alive(*tensors: torch.Tensor) -> None:
    """Inside ``copying_on``: ``tensors`` were made on its stream, so they are kept as ``ship``'s copies are."""
    ctx = getattr(_COPYING, "ctx", None)
    if ctx is not None:
        ctx[1].extend(t for t in tensors if t.device.type == "cuda")


def ship(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: through pinned memory and without blocking on a GPU."""
    if device.type != "cuda":
        return t.to(device)
    out = (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
    ctx = getattr(_COPYING, "ctx", None)
    if ctx is not None:
        ctx[1].append(out)
    return out


def bag_sums(order: torch.Tensor, starts: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """[U, D]: row u sums ``grads[order[starts[u]:starts[u + 1]]]`` (to the end for the last), in that order.

    torch's embedding-bag sum, on the gradients as its table: on the CPU (its
    vectorised bag kernel, bags in parallel, each bag's rows added one after
    the other into zeros) and on CUDA (``EmbeddingBag_updateOutputKernel_sum_mean``:
    one thread per bag and column adds the bag's rows in order into a zero of
    the accumulate type, which is the element type for float32 and float64)
    alike: no atomics, no tree, so the same bits on both.
    """
    return torch.nn.functional.embedding_bag(order, grads, starts, mode="sum")


def sum_by_index(groups: RowGroups, grads: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """Gradients [L, D] of a batch's lookups summed per distinct row: [U, D] (the second half of ``coalesce``).

    Each row's gradients are added in batch order (``RowGroups``), one after
    the other, from zero: ``bag_sums`` over the gradients themselves, bag u
    gathering ``grads[order[offsets[u]:offsets[u + 1]]]``. The order is the
    same on every device and thread count, so the sums have the same bits on
    the CPU and on a GPU (on the CPU this is also three times as fast as a
    sparse 0/1-matrix product and ten times ``index_add_`` at a batch's size;
    on CUDA ``index_add_`` adds by atomics, in an order that changes run to
    run). The plan is read on the gradients' device (``RowGroups.plan``).

    ``exact``: accumulate in float64 (and return float64). A row's gradient
    is then, after rounding to float32, the same bits however its terms are
    split and ordered, as when ranks sum parts of it (``StoreSpec.exact_sums``).
    Other float types are summed in float32.
    """
    n, width = groups.size, grads.shape[1]
    if grads.shape[0] != groups.order.numel():
        raise ValueError(f"sum_by_index: {grads.shape[0]} gradients for {groups.order.numel()} lookups")
    dtype = torch.float64 if exact else grads.dtype if grads.dtype in (torch.float32, torch.float64) else torch.float32
    if not n:
        return torch.zeros(0, width, dtype=dtype, device=grads.device)
    order, starts = groups.plan(grads.device)
    return bag_sums(order, starts, grads.to(dtype).contiguous())
