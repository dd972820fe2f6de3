"""Hit-rate curves of a simulated trace (``hotcold simulate --curves-out``).

LRU's curve comes exact at every cache size from one pass of stack
distances (``stackdist.lru_curves``), checked against the per-size
simulator's LRU rows of the same sweep and written on a log grid of sizes
plus the swept and asked-for sizes; the policies without a one-pass curve
(``stackdist.GRID_POLICIES``) are simulated at the sized points. Rates named
``timed_*`` count the steps from the trained runs' first timed step on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from hotcold.trace import stackdist
from hotcold.options.base import capacity_from_ratio
from hotcold.trace.sweeps import Sweep


@dataclass
class Curves:
    """The curves' table and one line on how the one-pass LRU curve was computed."""

    frame: pd.DataFrame
    report: str


def hit_rate_curves(sim: Sweep, points: int = 256, ratios: Sequence[float] = (),
                    policies: Sequence[str] | None = None, say: Callable[[str], None] = print) -> Curves:
    """The curves of ``sim``'s trace: LRU at ``points`` log-spaced sizes, the swept sizes and ``ratios`` (shares
    of all rows); ``policies`` (default: all) of the grid policies at the sized points.

    Without numba the one-pass kernel runs as plain Python (exact, slow): ``say`` tells so before it starts.
    """
    trace, swept = sim.trace, sim.swept
    if stackdist.KERNEL != "numba":
        say("numba is not installed: the one-pass LRU curve runs as plain Python (exact, slow); "
            "`pip install numba` (the `fast` extra) compiles it")
    jit = stackdist.warm_up()
    curve, timed = stackdist.lru_curves(trace, sim.from_step)
    checked = stackdist.check_against(curve, swept)
    sized = np.concatenate([[capacity_from_ratio(r, trace.num_rows) for r in ratios],
                            swept["capacity"].to_numpy(dtype=np.int64)]).astype(np.int64)
    caps = np.concatenate([stackdist.log_capacities(trace.num_rows, points), sized,
                           [curve.max_unique, curve.distinct]])
    grid_policies = [p for p in stackdist.GRID_POLICIES if p in (policies or stackdist.GRID_POLICIES)]
    grid = [stackdist.grid_curve(trace, p, sized[sized >= 1], sim.frequencies, from_step=sim.from_step)
            for p in grid_policies]
    frame = stackdist.curves_frame(curve, caps[caps >= 1], pd.concat(grid) if grid else None, sim.dataset, timed)
    report = (f"one-pass LRU curve ({stackdist.KERNEL}, compile {jit:.2f} s excluded): {curve.seconds:.3f} s for "
              f"{curve.lookups} lookups, {curve.lookups / max(curve.seconds, 1e-9) / 1e6:.1f}M lookups/s; equal to "
              f"the per-size simulator at {checked} size(s)")
    return Curves(frame, report)
