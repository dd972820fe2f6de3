"""``balanced``: lookup-balanced row-wise placement, rows placed so every rank serves the same expected lookups.

Every row lives on one rank, in device memory; rows in descending training
lookups go, each, to the rank with the fewest expected lookups so far that
still has room under the plan budget (longest-processing-time-first greedy
with capacities, ``balance``). FlexShard's sharded tier uses the same
balancing. (This plan was called ``recshard`` before; RecShard as published,
whole tables with a device/host row split, is ``recshard.py``.)
"""
from __future__ import annotations

import numpy as np

from hotcold.distributed.plan_types import Plan, PlanInputs, sharded_plan

#: rows placed one by one by the exact greedy before the tail is dealt in snake order
HEAD_ROWS = 8192


def _snake(loads: np.ndarray, room: np.ndarray, load: np.ndarray, used: np.ndarray, owner: np.ndarray) -> None:
    """Deal ``loads`` (descending) round by round over the bins with room, lightest bin first, snake order.

    Bins that start level stay within about one item of each other. Each
    phase deals whole rounds until the first bin fills; then the full bins
    drop out and the rest are re-ordered by load: at most one phase per bin.
    """
    pos, n = 0, loads.size
    while pos < n:
        active = np.flatnonzero(used < room)
        active = active[np.argsort(load[active], kind="stable")]
        q = active.size
        rounds = min(int((room[active] - used[active]).min()), -(-(n - pos) // q))
        m = min(rounds * q, n - pos)
        idx = np.arange(m)
        col = idx % q
        col = np.where((idx // q) % 2 == 0, col, q - 1 - col)
        bins = active[col]
        owner[pos:pos + m] = bins
        load += np.bincount(bins, weights=loads[pos:pos + m], minlength=room.size)
        used += np.bincount(bins, minlength=room.size)
        pos += m


def even_rows(used: np.ndarray, room: np.ndarray, n: int) -> np.ndarray:
    """int [B]: how many of ``n`` more items each bin takes so the bins' item counts end as even as ``room`` allows."""
    def taken(level: int) -> np.ndarray:
        return np.clip(level, used, np.maximum(room, used)) - used
    lo, hi = 0, int(max(room.max(), used.max()))
    while lo < hi:                                 # the lowest level that places all n
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if taken(mid).sum() < n else (lo, mid)
    quota = taken(lo)
    excess = int(quota.sum()) - n                  # bins that reached the level give one back
    at_level = np.flatnonzero((quota > 0) & (used + quota == lo))
    quota[at_level[:excess]] -= 1
    return quota


def water_level(load: np.ndarray, total: float) -> float:
    """The level tau with sum(max(0, tau - load)) = total: where pouring ``total`` over the bins evens them."""
    s = np.sort(load)
    for i in range(s.size, 0, -1):                 # the i lightest bins are under water
        tau = (total + s[:i].sum()) / i
        if tau >= s[i - 1]:
            return float(tau)
    return float(s[0])


def _fill_tail(loads: np.ndarray, room: np.ndarray, load: np.ndarray, used: np.ndarray,
               owner: np.ndarray) -> None:
    """Place the small tail items: balance the load where the head left deficits, and even out the memory.

    Each bin takes an even share of the tail's items (under its room). Bins the
    head already loaded above the water level take their share from the light
    end (never-accessed rows first); the others first catch up with the
    heaviest of them in contiguous blocks from the heavy end, then share the
    rest in snake order.
    """
    n = loads.size
    if n == 0:
        return
    quota = even_rows(used, room, n)
    takers = np.flatnonzero(quota > 0)
    tau = water_level(load[takers], float(loads.sum()))
    over = takers[load[takers] >= tau]
    under = takers[load[takers] < tau]
    split = n - int(quota[over].sum())             # [0, split): the under bins; [split, n): the over bins
    cap = used + quota
    if over.size:
        only_over = np.where(np.isin(np.arange(room.size), over), cap, used)
        _snake(loads[split:], only_over, load, used, owner[split:])
    if not under.size:
        return
    pos = 0
    cum = np.cumsum(loads[:split])
    level = load[under].max()
    for b in under[np.argsort(load[under], kind="stable")]:   # largest deficit first
        base = cum[pos - 1] if pos else 0.0
        end = int(np.searchsorted(cum, base + (level - load[b]), side="right"))
        end = min(end, pos + int(cap[b] - used[b]), split)
        owner[pos:end] = b
        load[b] += loads[pos:end].sum()
        used[b] += end - pos
        pos = end
    _snake(loads[pos:split], cap, load, used, owner[pos:split])


def balance(loads: np.ndarray, room: np.ndarray, initial: np.ndarray | None = None,
            head: int = HEAD_ROWS) -> np.ndarray:
    """Bin [n] of each item (``loads`` sorted descending) so bin loads are even and bin b gets <= ``room[b]`` items.

    ``initial`` [B] is load the bins already carry (FlexShard's replicated
    tiers). Items with zero load only fill memory, evenly: rows never looked up
    carry no load and are spread to fill every rank's memory evenly.

    The greedy is exact for the hottest rows (a heap), where one row can tip the
    balance. The long tail of small counts is placed in a few vectorised
    passes: every rank gets an even share of the tail's rows (memory); ranks the
    head already loaded above the water level take the lightest rows; the
    others catch up with one another in contiguous blocks of the heaviest tail
    rows, then share the rest in snake order (lightest rank first, direction
    reversed every round). Lookups per rank end within about one tail row of the
    greedy's, and a million rows plan in a fraction of a second.
    """
    loads = np.asarray(loads, dtype=np.float64)
    room = np.asarray(room, dtype=np.int64)
    if loads.size > room.clip(min=0).sum():
        raise ValueError(f"{loads.size} items do not fit in bins of room {room.tolist()}")
    owner = np.empty(loads.size, dtype=np.int64)
    load = np.zeros(room.size) if initial is None else np.asarray(initial, dtype=np.float64).copy()
    used = np.zeros(room.size, dtype=np.int64)
    k = min(head, int(np.count_nonzero(loads > 0)))
    from hotcold.distributed.balance_kernel import greedy_head  # numba: imported where a plan is made

    greedy_head(loads[:k], room, load, used, owner[:k])
    _fill_tail(loads[k:], room, load, used, owner[k:])
    return owner


def imbalance(load: np.ndarray) -> float:
    """max / mean of per-rank load (1.0: perfectly even; nan when there is no load)."""
    mean = float(np.mean(load)) if load.size else 0.0
    return float(np.max(load) / mean) if mean > 0 else float("nan")


def table_cdf_rows(inputs: PlanInputs, share: float = 0.9) -> list[int]:
    """Per table: the fewest rows that cover ``share`` of its lookups (one point of its CDF)."""
    out = []
    for lo, hi in zip(inputs.bounds[:-1], inputs.bounds[1:]):
        c = np.sort(np.asarray(inputs.counts[lo:hi], dtype=np.int64))[::-1]
        total = int(c.sum())
        out.append(int(np.searchsorted(np.cumsum(c), share * total) + 1) if total else 0)
    return out


def balanced(inputs: PlanInputs) -> Plan:
    """Every row on one rank, expected lookups balanced over the ranks under the per-rank row budget."""
    p = inputs.topology.world
    counts = np.asarray(inputs.counts, dtype=np.int64)
    order = inputs.hottest_first()
    owner = np.empty(inputs.num_rows, dtype=np.int64)
    owner[order] = balance(counts[order], np.full(p, inputs.budget_rows(), dtype=np.int64))
    served = np.bincount(owner, weights=counts, minlength=p)
    rows = np.bincount(owner, minlength=p)
    return sharded_plan("balanced", inputs, owner,
                        expected_lookups_per_rank=served.tolist(), expected_lookup_imbalance=imbalance(served),
                        rows_per_rank=rows.tolist(), rows_for_90pct_lookups=table_cdf_rows(inputs))
