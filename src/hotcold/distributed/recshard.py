"""``recshard``: RecShard (Sethi et al., ASPLOS 2022), whole tables on ranks, each split between device and host memory.

RecShard reads each table's access distribution from training data (the CDF of
lookups over its rows, hottest first) and solves an integer program that puts
every table on one GPU and keeps each table's hottest rows in GPU memory (HBM)
and the rest in host memory reached over PCIe (UVM), minimising the most loaded
GPU's expected embedding cost under every GPU's memory capacity.

Here, per table ``t`` and rank ``g``: ``y[t, g]`` (binary, the table is on
``g``), ``x[t, g]`` (integer, its rows in device memory, ``<= n_t y[t, g]``)
and ``h[t, g]`` (its expected device lookups). The CDF is modelled as a
piecewise-linear concave curve through a few breakpoints of the profile
(``breakpoints`` rows where the lookups reach shares ``k / breakpoints`` of the
table's total, its last looked-up row and its last row), so
``h[t, g] <= a_k x[t, g] + b_k y[t, g]`` for every segment ``k`` is exact at
the breakpoints and below the true CDF between them. A rank's expected cost is
``sum_t c_host L_t y[t, g] - (c_host - c_device) h[t, g]`` (``L_t`` the table's
lookups); the program minimises ``z >= cost[g]`` for every ``g`` under
``sum_t x[t, g] <= budget_rows`` (the plan budget, ``PlanInputs.budget_rows``),
and ``scipy.optimize.milp`` (HiGHS) solves it (ordering the identical ranks'
costs to cut symmetric branches was tried: at a node limit it kept HiGHS from
finding good plans on 16 ranks). After the solve each rank's unused device rows take the hottest of
its tables' host rows (never more cost). The plan's host rows (``Plan.off_device``)
live in their owner's host memory: the owner serves them, and a lookup of one
moves its vector to the device and its gradient back, as the ``hybrid`` store.

The prices of a lookup (``lookup_costs``) are the per-lookup terms the cost
model gives the ``device`` and ``hybrid`` stores on a hardware profile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hotcold.config import ConfigError, is_int, is_real
from hotcold.distributed.balanced import imbalance
from hotcold.distributed.plan_types import Plan, PlanInputs, descending, sharded_plan

#: the profile the prices come from when the options name none (the repository's GPU cluster)
DEFAULT_PROFILE = Path(__file__).resolve().parents[3] / "workflows" / "config" / "hardware" / "h100-cluster.yaml"
DEFAULT_BREAKPOINTS = 8
DEFAULT_NODE_LIMIT = 50
DEFAULT_MIP_REL_GAP = 1e-4
OPTIONS = ("hardware_profile", "device_lookup_ns", "host_lookup_ns", "breakpoints", "node_limit", "time_limit_s",
           "mip_rel_gap")


@dataclass(frozen=True)
class LookupCosts:
    """ns of one lookup served from device memory and from host memory (forward and backward)."""

    device_ns: float
    host_ns: float


def lookup_costs(profile: Any, dim: int) -> LookupCosts:
    """The per-lookup terms of ``costmodel.pricing.device_lookup`` and ``host_lookup`` (the ``hybrid`` store).

    Device: plan the id (``host_id_plan_ns`` + ``host_unique_ns``), send it (8 bytes), gather the vector and
    scatter-add its gradient in device memory. Host: plan the id, gather the vector from a host table larger
    than the cache, copy it to the device, copy the gradient back, group it (``host_unique_ns``) and
    scatter-add it on the host. Per-op latencies and per-distinct-row optimizer work are left out (the same
    few ops per step whatever the split; the optimizer's rows are a table's distinct rows either way).
    """
    from hotcold.costmodel.pricing import Costs

    c, vb = Costs(profile), dim * 4
    plan = c.ids(1, "host_id_plan_ns")
    ms_device = (plan + c.ids(1, "host_unique_ns") + c.h2d(8, 0) + c.dev_gather(1, vb) + c.dev_scatter(1, vb))
    ms_host = (plan + c.host_gather(1, vb) + c.h2d(vb, 0) + c.d2h(vb, 0) + c.ids(1, "host_unique_ns")
               + c.host_scatter(1, vb))
    return LookupCosts(ms_device * 1e6, ms_host * 1e6)


def _option_error(name: str, why: str) -> ConfigError:
    return ConfigError(f"plan recshard: {name} {why}")


def costs_of(o: Mapping[str, Any], dim: int) -> LookupCosts:
    """The prices the options ``o`` give: ``device_lookup_ns`` and ``host_lookup_ns``, else ``hardware_profile``'s
    (at ``dim`` floats a row)."""
    given = {k: o.get(k) for k in ("device_lookup_ns", "host_lookup_ns") if o.get(k) is not None}
    for k, v in given.items():
        if not (is_real(v) and math.isfinite(v) and v > 0):
            raise _option_error(k, f"must be a positive number of ns, got {v!r}")
    if len(given) == 1:
        raise _option_error(next(iter({"device_lookup_ns", "host_lookup_ns"} - set(given))),
                            "must be given with " + next(iter(given)))
    if given:
        return LookupCosts(float(given["device_lookup_ns"]), float(given["host_lookup_ns"]))
    path = o.get("hardware_profile")
    if path is not None and not isinstance(path, (str, Path)):
        raise _option_error("hardware_profile", f"must be the path of a profile YAML, got {path!r}")
    path = Path(path) if path is not None else DEFAULT_PROFILE
    if not path.is_file():
        raise _option_error("hardware_profile", f"{path} is not a file (give hardware_profile, or "
                                                "device_lookup_ns and host_lookup_ns)")
    from hotcold.costmodel.profile import load_profile

    profile = load_profile(path)
    if profile.kind != "gpu":
        raise _option_error("hardware_profile", f"{path} is a {profile.kind} profile; RecShard splits device "
                                                "from host memory, which needs a gpu profile")
    return lookup_costs(profile, dim)


@dataclass(frozen=True)
class SolverOptions:
    """The program's size and the solver's limits. The branch-and-bound stops at ``mip_rel_gap`` or after
    ``node_limit`` nodes (the best plan found so far, its gap recorded): a count, so every rank of a run, each
    planning alone, gets the same plan. ``time_limit_s`` (default none) also stops it, at a time that depends
    on the machine: the ranks could then disagree, so it is for planning outside training only."""

    breakpoints: int = DEFAULT_BREAKPOINTS
    node_limit: int = DEFAULT_NODE_LIMIT
    time_limit_s: float | None = None
    mip_rel_gap: float = DEFAULT_MIP_REL_GAP


def solver_options(o: Mapping[str, Any]) -> SolverOptions:
    """``SolverOptions`` from the options ``o``, checked."""
    k = o.get("breakpoints", DEFAULT_BREAKPOINTS)
    if not (is_int(k) and k >= 1):
        raise _option_error("breakpoints", f"must be an integer >= 1, got {k!r}")
    nodes = o.get("node_limit", DEFAULT_NODE_LIMIT)
    if not (is_int(nodes) and nodes >= 1):
        raise _option_error("node_limit", f"must be an integer >= 1, got {nodes!r}")
    t = o.get("time_limit_s")
    if t is not None and not (is_real(t) and math.isfinite(t) and t > 0):
        raise _option_error("time_limit_s", f"must be a positive number of seconds, got {t!r}")
    gap = o.get("mip_rel_gap", DEFAULT_MIP_REL_GAP)
    if not (is_real(gap) and 0 <= gap < 1):
        raise _option_error("mip_rel_gap", f"must be a number in [0, 1), got {gap!r}")
    return SolverOptions(int(k), int(nodes), None if t is None else float(t), float(gap))


def cdf_points(counts: np.ndarray, breakpoints: int) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints (rows kept, lookups covered) of one table's CDF, hottest rows first, from (0, 0) to its end.

    The rows where the covered lookups first reach ``k / breakpoints`` of the total (k = 1..breakpoints), the
    last looked-up row and the table's last row. Rows sorted by descending count make the CDF concave.
    """
    c = np.sort(np.asarray(counts, dtype=np.int64))[::-1]
    cum = np.concatenate([[0], np.cumsum(c)])
    total, n = int(cum[-1]), c.size
    xs = {0, n, int(np.count_nonzero(c))}
    if total:
        targets = np.ceil(np.arange(1, breakpoints + 1) * total / breakpoints)
        xs.update(int(x) for x in np.searchsorted(cum, targets, side="left"))
    x = np.array(sorted(xs), dtype=np.int64)
    return x, cum[x].astype(np.float64)


@dataclass
class Model:
    """The MILP's arrays: ``c`` (objective), ``integrality``, ``bounds``, and the rows of ``A`` in [lb, ub]."""

    tables: int
    ranks: int
    rows: list[np.ndarray]
    lb: list[float]
    ub: list[float]
    c: np.ndarray
    integrality: np.ndarray
    upper: np.ndarray


def build_model(sizes: list[int], points: list[tuple[np.ndarray, np.ndarray]], costs: LookupCosts,
                world: int, budget_rows: int) -> Model:
    """The program over variables ``[y (T*P), x (T*P), f (T*P), z]`` (index ``t * P + g`` in each block).

    ``f`` is ``h / L_t``, the share of the table's lookups served from device memory, and costs are scaled so
    that all lookups cost 1 at the host price: every coefficient but the row counts' is then a share, which
    keeps the solver's tolerances meaningful (unscaled, a 16-rank Kaggle-sized program read as infeasible).
    """
    t_n, p = len(sizes), world
    m = t_n * p
    nv = 3 * m + 1
    lookups = np.array([pts[1][-1] for pts in points])
    share = lookups / max(1.0, float(lookups.sum()))
    y0, x0, h0, z = 0, m, 2 * m, 3 * m
    rows, lb, ub = [], [], []

    def row(entries: dict[int, float], lo: float, hi: float) -> None:
        a = np.zeros(nv)
        for i, v in entries.items():
            a[i] += v
        rows.append(a)
        lb.append(lo)
        ub.append(hi)

    for t in range(t_n):                                   # every table on exactly one rank
        row({y0 + t * p + g: 1.0 for g in range(p)}, 1.0, 1.0)
    for g in range(p):                                     # device rows within the budget
        row({x0 + t * p + g: 1.0 for t in range(t_n)}, -np.inf, float(budget_rows))
    for t, (xs, hs) in enumerate(points):
        for g in range(p):
            i = t * p + g
            row({x0 + i: 1.0, y0 + i: -float(sizes[t])}, -np.inf, 0.0)   # x <= n_t y
            row({h0 + i: 1.0, y0 + i: -1.0}, -np.inf, 0.0)                # f <= y
            total = max(1.0, float(hs[-1]))
            for k in range(xs.size - 1):                                  # f <= (a_k x + b_k y) / L_t
                dx = float(xs[k + 1] - xs[k])
                if dx <= 0:
                    continue
                a = float(hs[k + 1] - hs[k]) / dx
                b = float(hs[k]) - a * float(xs[k])
                row({h0 + i: 1.0, x0 + i: -a / total, y0 + i: -b / total}, -np.inf, 0.0)
    saving = (costs.host_ns - costs.device_ns) / costs.host_ns

    def cost(g: int, sign: float) -> dict[int, float]:
        out: dict[int, float] = {}
        for t in range(t_n):
            out[y0 + t * p + g] = sign * float(share[t])
            out[h0 + t * p + g] = -sign * saving * float(share[t])
        return out

    for g in range(p):                                     # z >= cost[g]
        row({**cost(g, 1.0), z: -1.0}, -np.inf, 0.0)
    c = np.zeros(nv)
    c[z] = 1.0
    integrality = np.concatenate([np.ones(2 * m), np.zeros(m + 1)])
    upper = np.concatenate([np.ones(m), np.repeat(np.asarray(sizes, dtype=np.float64), p),
                            np.ones(m), [np.inf]])
    return Model(t_n, p, rows, lb, ub, c, integrality, upper)


def solve(model: Model, opts: SolverOptions) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(rank of every table [T], its device rows [T], the solver's record) by ``scipy.optimize.milp``."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    a = np.vstack(model.rows)
    res = milp(model.c, integrality=model.integrality, bounds=Bounds(np.zeros(model.c.size), model.upper),
               constraints=LinearConstraint(a, np.array(model.lb), np.array(model.ub)),
               options={"node_limit": opts.node_limit, "mip_rel_gap": opts.mip_rel_gap, "presolve": True,
                        **({} if opts.time_limit_s is None else {"time_limit": opts.time_limit_s})})
    if res.x is None:
        raise RuntimeError(f"recshard: the integer program found no plan ({res.message})")
    m = model.tables * model.ranks
    y = res.x[:m].reshape(model.tables, model.ranks)
    x = res.x[m:2 * m].reshape(model.tables, model.ranks)
    rank = np.argmax(y, axis=1)
    rows = np.rint(x[np.arange(model.tables), rank]).astype(np.int64)
    message = "node limit reached" if res.status == 4 and "16" in str(res.message) else str(res.message)
    record = {"solver_status": int(res.status), "solver_message": message,
              "solver_gap": float(getattr(res, "mip_gap", float("nan")) or 0.0),
              "solver_objective": float(res.fun)}
    return rank, rows, record


def fill_budget(counts: list[np.ndarray], rank: np.ndarray, rows: np.ndarray, world: int,
                budget_rows: int) -> np.ndarray:
    """Device rows per table after each rank's unused budget takes the hottest host rows of its tables."""
    rows = rows.copy()
    for g in range(world):
        tables = np.flatnonzero(rank == g)
        room = budget_rows - int(rows[tables].sum())
        if room <= 0 or tables.size == 0:
            continue
        rest = [np.sort(counts[t])[::-1][rows[t]:] for t in tables]
        owner = np.concatenate([np.full(r.size, i) for i, r in enumerate(rest)])
        take = descending(np.concatenate(rest))[:room]
        rows[tables] += np.bincount(owner[take], minlength=tables.size)
    return rows


def recshard(inputs: PlanInputs) -> Plan:
    """Whole tables on ranks and each table's hottest rows in device memory, the rest in its rank's host memory."""
    costs = costs_of(inputs.options, inputs.dim)
    opts = solver_options(inputs.options)
    p, sizes, bounds = inputs.topology.world, list(inputs.table_sizes), inputs.bounds
    counts = np.asarray(inputs.counts, dtype=np.int64)
    per_table = [counts[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
    budget = inputs.budget_rows()
    points = [cdf_points(c, opts.breakpoints) for c in per_table]
    rank, rows, record = solve(build_model(sizes, points, costs, p, budget), opts)
    rows = fill_budget(per_table, rank, rows, p, budget)
    owner = np.repeat(rank, sizes)
    host = np.zeros(inputs.num_rows, dtype=bool)
    for t, (lo, c) in enumerate(zip(bounds[:-1], per_table)):
        host[lo + descending(c)[rows[t]:]] = True
    device_lookups = np.bincount(owner[~host], weights=counts[~host], minlength=p)
    host_lookups = np.bincount(owner[host], weights=counts[host], minlength=p)
    cost = device_lookups * costs.device_ns + host_lookups * costs.host_ns
    plan = sharded_plan("recshard", inputs, owner, table_ranks=rank.tolist(), device_rows_per_table=rows.tolist(),
                        device_rows_per_rank=np.bincount(owner[~host], minlength=p).tolist(),
                        host_rows_per_rank=np.bincount(owner[host], minlength=p).tolist(),
                        expected_lookups_per_rank=(device_lookups + host_lookups).tolist(),
                        expected_host_lookups_per_rank=host_lookups.tolist(),
                        expected_cost_ns_per_rank=cost.tolist(), expected_cost_imbalance=imbalance(cost),
                        device_lookup_ns=costs.device_ns, host_lookup_ns=costs.host_ns,
                        cdf_breakpoints=opts.breakpoints, **record)
    plan.off_device = host
    return plan


def expected_cost(plan: Plan, counts: np.ndarray, costs: LookupCosts) -> np.ndarray:
    """float [P]: every rank's expected embedding cost (ns over ``counts``' lookups) of any sharded-tier plan:
    its device rows' lookups at the device price, its host rows' at the host price."""
    p = plan.topology.world
    host = plan.off_device if plan.off_device is not None else np.zeros(plan.num_rows, dtype=bool)
    counts = np.asarray(counts, dtype=np.float64)
    owner = plan.slot.astype(np.int64)
    return (np.bincount(owner[~host], weights=counts[~host], minlength=p) * costs.device_ns
            + np.bincount(owner[host], weights=counts[host], minlength=p) * costs.host_ns)


def check_plan_options(where: str, plan: str, options: Mapping[str, Any] | None) -> None:
    """A store's ``plan_options``: a mapping of ``OPTIONS`` (the recshard plan's), given to that plan only."""
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: plan_options must map recshard's options to values, got {options!r}")
    if plan != "recshard" and options:
        raise ConfigError(f"{where}: plan_options are the recshard plan's; plan {plan!r} takes none")
    for key in options:
        if key not in OPTIONS:
            raise ConfigError(f"{where}: plan_options: unknown option {key!r}; known: {list(OPTIONS)}")
    try:
        solver_options(options)
        costs_of(options, 16)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
