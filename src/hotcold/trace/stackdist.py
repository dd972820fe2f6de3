"""Hit-rate curves over every cache size: LRU in one pass, LFU and freqcache on a grid of sizes.

The harness's LRU, batch by batch, is a stack algorithm: a row is resident at
capacity C iff fewer than C seen rows have a larger key (step of last access,
row id). So one pass that counts each unique access's stack distance (a
Fenwick tree over bit-packed access positions, O(rows) memory) gives hits,
unique hits and evictions at every C at once. LFU is not a stack algorithm,
and freqcache's warm start would need a different one-pass algorithm (not
built), so their curves come from one simulation per size (``grid_curve``). The kernel is compiled with numba when installed
(``KERNEL`` says which runs). The proof, the counting and what the CSV holds
are in docs/design.md ("LRU hit-rate curves in one pass").
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from hotcold.jit import one_compile_at_a_time
from hotcold.trace.cachesim import Trace, simulate

try:
    import numba
except ImportError:  # optional: the same kernel runs as plain Python
    numba = None

#: "numba" when the kernel is compiled, "python" when it runs interpreted
KERNEL = "numba" if numba is not None else "python"
#: 64-bit words per Fenwick block (512 positions)
BLOCK_WORDS = 8
_BLOCK_SHIFT = 9  # log2(64 * BLOCK_WORDS)
#: the policies whose curves come from per-size simulation
GRID_POLICIES = ("lfu", "freqcache", "freqcache-lfu")

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)
_M1, _M2, _M4 = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333), np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


def _jit(fn):
    """Compiled as ``hotcold.jit.jit`` does, cached beside the module: compiling the curve's kernels took 6.6 s of
    each process that drew a curve (a simulate job of the smallest dataset took 7 s)."""
    return one_compile_at_a_time(numba.njit(nogil=True, cache=True)(fn)) if numba is not None else fn


if numba is not None:
    @_jit
    def _popcount(x):
        """Set bits of a uint64 (SWAR bit counting)."""
        x = x - ((x >> _ONE) & _M1)
        x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
        x = (x + (x >> np.uint64(4))) & _M4
        return np.int64((x * _H01) >> np.uint64(56))
else:
    def _popcount(x):
        return int(x).bit_count()


@_jit
def _tree_add(tree, block, delta):
    """Fenwick tree over blocks (1-based inside ``tree``): add ``delta`` to ``block``."""
    i = block + 1
    n = tree.shape[0]
    while i < n:
        tree[i] += delta
        i += i & -i


@_jit
def _marked_upto(tree, words, p):
    """Marked positions in [0, p]."""
    block = p >> _BLOCK_SHIFT
    total = 0
    i = block
    while i > 0:
        total += tree[i]
        i -= i & -i
    w = p >> 6
    for k in range(block * BLOCK_WORDS, w):
        total += _popcount(words[k])
    return total + _popcount(words[w] & (_ALL >> np.uint64(63 - (p & 63))))


@_jit
def _rebuild(tree, words, live):
    """Positions [0, live) marked, the rest clear; the tree rebuilt in O(blocks)."""
    words[:] = 0
    full = live >> 6
    words[:full] = _ALL
    if live & 63:
        words[full] = _ALL >> np.uint64(64 - (live & 63))
    tree[:] = 0
    nblocks = tree.shape[0] - 1
    per_block = 64 * BLOCK_WORDS
    for b in range(nblocks):
        tree[b + 1] = min(max(live - b * per_block, 0), per_block)
    for i in range(1, nblocks + 1):  # linear Fenwick build: push each node into its parent
        j = i + (i & -i)
        if j <= nblocks:
            tree[j] += tree[i]


@_jit
def _compact(last_pos, pos_row, tree, words, next_pos):
    """Renumber the live positions 0, 1, .. in order; returns how many are live."""
    live = np.int64(0)   # not a literal 0: see hotcold.jit
    for p in range(next_pos):
        if (words[p >> 6] >> np.uint64(p & 63)) & _ONE:
            r = pos_row[p]
            pos_row[live] = r
            last_pos[r] = live
            live += 1
    _rebuild(tree, words, live)
    return live


@_jit
def _feed(rows, counts, offsets, last_pos, pos_row, tree, words, hist, state, scratch):
    """Stack distances of the batches ``rows[offsets[i]:offsets[i+1]]`` (ascending unique rows).

    ``state`` = [next free position, rows seen, cold lookups, cold unique
    accesses]; ``hist[d]`` adds [lookups, accesses] at stack distance d;
    ``scratch`` [largest batch] holds a batch's previous positions. Each
    batch runs in loops without a chain between their iterations (gather,
    count, histogram, move), so their cache misses overlap.
    """
    next_pos, seen = state[0], state[1]
    capacity = pos_row.shape[0]
    for b in range(offsets.shape[0] - 1):
        lo, hi = offsets[b], offsets[b + 1]
        n = hi - lo
        if next_pos + n > capacity:
            next_pos = _compact(last_pos, pos_row, tree, words, next_pos)
        for i in range(n):  # previous positions (-1: first access)
            scratch[i] = last_pos[rows[lo + i]]
        for i in range(n):  # distances, from the state before this step; -1: cold
            p = scratch[i]
            scratch[n + i] = seen - _marked_upto(tree, words, p) if p >= 0 else -1
        for i in range(n):
            d = scratch[n + i]
            if d < 0:
                state[2] += counts[lo + i]
                state[3] += 1
            else:
                hist[d, 0] += counts[lo + i]
                hist[d, 1] += 1
        for i in range(n):  # the batch's rows move to the newest positions
            p = scratch[i]
            if p < 0:
                seen += 1
            else:
                words[p >> 6] &= ~(_ONE << np.uint64(p & 63))
                _tree_add(tree, p >> _BLOCK_SHIFT, -1)
            q = next_pos + i
            last_pos[rows[lo + i]] = q
            pos_row[q] = rows[lo + i]
        _mark_range(tree, words, next_pos, next_pos + n)
        next_pos += n
    state[0], state[1] = next_pos, seen


@_jit
def _mark_range(tree, words, lo, hi):
    """Mark the (clear) positions [lo, hi) and count them into the tree, block by block."""
    for q in range(lo, hi):
        words[q >> 6] |= _ONE << np.uint64(q & 63)
    per_block = 64 * BLOCK_WORDS
    q = lo
    while q < hi:
        end = min((q // per_block + 1) * per_block, hi)
        _tree_add(tree, q >> _BLOCK_SHIFT, end - q)
        q = end


class StackDistances:
    """One pass of LRU stack distances over a stream of batches; memory O(N + largest batch).

    ``feed`` takes batches in training order; ``curve`` turns the histograms
    into the hit counts at every capacity.
    """

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        # a batch has at most N unique rows and at most N positions are live: 2N positions always suffice
        self._alloc(2 * max(num_rows, 1))
        self.hist = np.zeros((max(num_rows, 1), 2), dtype=np.int64)  # [N, 2] lookups, accesses at distance d
        self.scratch = np.zeros(0, dtype=np.int64)
        self.state = np.zeros(4, dtype=np.int64)  # next position, seen, cold lookups, cold accesses
        self.steps = self.lookups = self.unique_rows = self.max_unique = 0

    def _alloc(self, positions: int) -> None:
        per_block = 64 * BLOCK_WORDS
        positions = -(-positions // per_block) * per_block
        dtype = np.int32 if max(positions, self.num_rows) < 2**31 else np.int64
        self.last_pos = np.full(max(self.num_rows, 1), -1, dtype=dtype)  # [N] position of each row's last access
        self.pos_row = np.zeros(positions, dtype=dtype)                   # [L] row of each position
        self.words = np.zeros(positions // 64, dtype=np.uint64)           # [L/64] marked positions
        self.tree = np.zeros(positions // per_block + 1, dtype=np.int64)  # Fenwick tree over blocks

    def feed(self, rows: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> None:
        """Batches in order: ``rows[t]`` the unique rows of batch t (ascending int), ``counts[t]`` their lookups."""
        if not len(rows):
            return
        sizes = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
        flat = np.concatenate(rows).astype(self.last_pos.dtype, copy=False)
        flat_counts = np.concatenate(counts).astype(np.int64, copy=False)
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_rows):
            raise ValueError(f"trace rows must lie in [0, {self.num_rows})")
        offsets = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if self.scratch.size < 2 * sizes.max():
            self.scratch = np.zeros(2 * int(sizes.max()), dtype=np.int64)
        _feed(flat, flat_counts, offsets, self.last_pos, self.pos_row, self.tree, self.words, self.hist, self.state,
              self.scratch)
        self.steps += len(rows)
        self.lookups += int(flat_counts.sum())
        self.unique_rows += int(flat.size)
        self.max_unique = max(self.max_unique, int(sizes.max()))

    def curve(self) -> "LRUCurve":
        seen = int(self.state[1])
        hits = np.zeros(seen + 1, dtype=np.int64)
        np.cumsum(self.hist[:seen, 0], out=hits[1:])
        unique_hits = np.zeros(seen + 1, dtype=np.int64)
        np.cumsum(self.hist[:seen, 1], out=unique_hits[1:])
        return LRUCurve(self.num_rows, seen, self.max_unique, self.steps, self.lookups, self.unique_rows,
                        hits, unique_hits)


@dataclass
class LRUCurve:
    """The LRU counters of a trace at every capacity C (totals over its steps)."""

    num_rows: int
    distinct: int            # rows the trace touches: every C >= distinct gives the same counters
    max_unique: int          # the largest batch's unique rows: the smallest feasible C
    steps: int
    lookups: int
    unique_rows: int         # unique accesses: the sum over batches of their unique rows
    hits: np.ndarray         # int64 [distinct + 1]: hits at C = 0 .. distinct
    unique_hits: np.ndarray  # int64 [distinct + 1]: unique hits at C = 0 .. distinct
    seconds: float = 0.0     # time of the pass (feed + histogram), JIT compile excluded
    start_distinct: int = 0  # rows seen before the counted steps (``since``): the cache's fill when they begin

    def since(self, earlier: "LRUCurve") -> "LRUCurve":
        """The counters of the steps after ``earlier`` (the same pass, stopped sooner), the state carried over.

        An access's distance depends only on the steps before it, so the
        later steps' histogram is this one's minus the earlier one's: e.g. the
        trained runs' timed steps, warm-up excluded.
        """
        pad = self.distinct + 1 - earlier.hits.size
        return LRUCurve(self.num_rows, self.distinct, self.max_unique, self.steps - earlier.steps,
                        self.lookups - earlier.lookups, self.unique_rows - earlier.unique_rows,
                        self.hits - np.pad(earlier.hits, (0, pad), mode="edge"),
                        self.unique_hits - np.pad(earlier.unique_hits, (0, pad), mode="edge"),
                        self.seconds, earlier.distinct)

    def at(self, capacities: Sequence[int] | np.ndarray) -> pd.DataFrame:
        """Counters at ``capacities`` (slots): one row each, ``feasible=False`` below ``max_unique``."""
        cap = np.asarray(capacities, dtype=np.int64)
        idx = np.minimum(cap, self.distinct)
        hits, uh = self.hits[idx], self.unique_hits[idx]
        feasible = cap >= self.max_unique
        um = self.unique_rows - uh
        return pd.DataFrame({
            "capacity": cap, "cache_ratio": cap / self.num_rows, "feasible": feasible,
            "steps": self.steps, "capacity_needed": self.max_unique,
            "lookups": self.lookups, "hits": hits, "misses": self.lookups - hits,
            "unique_rows": self.unique_rows, "unique_hits": uh, "unique_misses": um,
            "evictions": um - (np.minimum(cap, self.distinct) - np.minimum(cap, self.start_distinct)),
            "hit_rate": hits / max(self.lookups, 1), "unique_hit_rate": uh / max(self.unique_rows, 1),
        })

    def change_points(self) -> np.ndarray:
        """Capacities C >= 1 whose hit count differs from C - 1's: int64 [K], the curve's steps."""
        return np.flatnonzero(np.diff(self.hits) != 0).astype(np.int64) + 1


def lru_curve(trace: Trace, chunk: int = 4096) -> LRUCurve:
    """The exact LRU curve of ``trace`` in one pass, ``chunk`` batches at a time."""
    return lru_curves(trace, 0, chunk)[0]


def lru_curves(trace: Trace, from_step: int, chunk: int = 4096) -> tuple[LRUCurve, LRUCurve]:
    """One pass: the curve over every step, and over steps ``from_step`` on (the timed steps of a run)."""
    t0 = time.perf_counter()
    sd = StackDistances(trace.num_rows)
    from_step = min(max(from_step, 0), len(trace))
    earlier = None
    for lo, hi in ((0, from_step), (from_step, len(trace))):
        for i in range(lo, hi, chunk):
            sd.feed(trace.rows[i:min(i + chunk, hi)], trace.counts[i:min(i + chunk, hi)])
        if earlier is None:
            earlier = sd.curve()
    out = sd.curve()
    out.seconds = time.perf_counter() - t0
    return out, out.since(earlier)


def warm_up() -> float:
    """Compile the kernel now (numba) on a tiny trace; returns the seconds it took."""
    t0 = time.perf_counter()
    lru_curve(Trace.from_batches([np.array([0, 1]), np.array([1, 2])], 3))
    return time.perf_counter() - t0


def log_capacities(num_rows: int, points: int = 256) -> np.ndarray:
    """About ``points`` capacities from 1 to ``num_rows``, evenly spaced in log: int64, ascending, distinct."""
    grid = np.geomspace(1, max(num_rows, 1), max(points, 2))
    return np.unique(np.round(grid).astype(np.int64))


def grid_curve(trace: Trace, policy: str, capacities: Sequence[int], frequencies: np.ndarray | None = None,
               warmup_ratio: float = 0.7, from_step: int = 0) -> pd.DataFrame:
    """A non-stack policy (``GRID_POLICIES``) simulated at each of ``capacities``: one row per size.

    Columns as ``LRUCurve.at`` (totals over every step), plus ``timed_hit_rate``
    and ``timed_unique_hit_rate`` over steps ``from_step`` on.
    """
    if frequencies is None:
        frequencies = trace.frequencies()
    rows = []
    for c in sorted({int(c) for c in capacities}):
        row = {"policy": policy, "capacity": c, "cache_ratio": c / trace.num_rows, "feasible": c >= trace.max_unique,
               "steps": len(trace), "capacity_needed": trace.max_unique}
        if row["feasible"]:
            steps = simulate(trace, policy, c, frequencies, warmup_ratio).steps
            row.update(_rates(steps, ""))
            row.update(_rates(steps[steps["step"] >= from_step], "timed_"))
        rows.append(row)
    return pd.DataFrame(rows)


def _rates(steps: pd.DataFrame, prefix: str) -> dict[str, float | int]:
    tot = {c: int(steps[c].sum()) for c in ("lookups", "hits", "unique_rows", "unique_hits", "evictions")}
    rates = {"hit_rate": tot["hits"] / max(tot["lookups"], 1),
             "unique_hit_rate": tot["unique_hits"] / max(tot["unique_rows"], 1)}
    return {f"{prefix}{k}": v for k, v in rates.items()} if prefix else {**tot, **rates}


CURVE_COLUMNS = ("dataset", "policy", "source", "capacity", "cache_ratio", "feasible", "hit_rate",
                 "unique_hit_rate", "timed_hit_rate", "timed_unique_hit_rate", "hits", "lookups", "unique_hits",
                 "unique_rows", "evictions", "capacity_needed")


def curves_frame(curve: LRUCurve, lru_capacities: Sequence[int], grid: pd.DataFrame | None = None,
                 dataset: str = "", timed: LRUCurve | None = None) -> pd.DataFrame:
    """The curves CSV: LRU from the one pass at ``lru_capacities``, plus ``grid`` (rows of other policies).

    ``source`` says how a row was computed: ``one-pass`` or ``per-size``;
    ``timed_*`` rates cover the steps of ``timed`` (``LRUCurve.since``).
    """
    caps = np.unique(np.asarray(lru_capacities, dtype=np.int64))
    lru = curve.at(caps)
    if timed is not None:
        t = timed.at(caps)
        lru["timed_hit_rate"], lru["timed_unique_hit_rate"] = t["hit_rate"], t["unique_hit_rate"]
    lru.insert(0, "source", "one-pass")
    lru.insert(0, "policy", "lru")
    frames = [lru]
    if grid is not None and len(grid):
        g = grid.copy()
        g["source"] = "per-size"
        frames.append(g)
    out = pd.concat(frames, ignore_index=True)
    out["dataset"] = dataset
    return out[[c for c in CURVE_COLUMNS if c in out.columns]]


def check_against(curve: LRUCurve, swept: pd.DataFrame) -> int:
    """Compare the curve with per-size LRU rows of a sweep; raises on any difference, returns sizes checked."""
    rows = swept[(swept["policy"] == "lru") & swept["feasible"].astype(bool)]
    if rows.empty:
        return 0
    mine = curve.at(rows["capacity"].to_numpy())
    for col in ("hits", "unique_hits", "evictions"):
        theirs = rows[col].to_numpy(dtype=np.int64)
        if not np.array_equal(mine[col].to_numpy(), theirs):
            raise AssertionError(f"one-pass LRU curve differs from the per-size simulator in {col}: "
                                 f"{mine[col].tolist()} vs {theirs.tolist()} at {rows['capacity'].tolist()}")
    return len(rows)
