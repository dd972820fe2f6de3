"""Per-table plans (``data-parallel``, ``twrw``, ``auto``) against independent computations on small cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hotcold.config import ConfigError, InfeasibleError
from hotcold.distributed.plan_types import ALL, SHARDED, PlanInputs
from hotcold.distributed.plans import build_plan
from hotcold import methods
from hotcold.distributed.topology import Topology

DIM, STATE = 8, 1
ROW_BYTES = (DIM + STATE) * 4


def inputs(sizes, counts, topo, headroom=1.25, per_step=None, **options) -> PlanInputs:
    counts = np.asarray(counts, dtype=np.int64)
    if per_step is not None:
        options["lookups_per_step"] = per_step
    return PlanInputs(list(sizes), counts, topo, DIM, STATE, headroom, options)


def budget_rows(sizes, p, headroom) -> int:
    return int(headroom * sum(math.ceil(n / p) for n in sizes) * ROW_BYTES) // ROW_BYTES


def blocks(n: int, parts: int) -> list[int]:
    """Rows of each contiguous block of ceil(n/parts) rows, written out."""
    b = -(-n // parts)
    return [max(0, min(b, n - i * b)) for i in range(parts)]


def expected_owner(sizes, kinds, places, topo) -> tuple[np.ndarray, np.ndarray]:
    """(tier, slot) of every row, from the per-table choice, one row at a time."""
    tier, slot = [], []
    g, p = topo.ranks_per_node, topo.world
    for n, kind, place in zip(sizes, kinds, places):
        for i in range(n):
            if kind == "data-parallel":
                tier.append(ALL), slot.append(-1)
            elif kind == "row":
                tier.append(SHARDED), slot.append(i // math.ceil(n / p))
            elif kind == "table":
                tier.append(SHARDED), slot.append(place)
            else:
                tier.append(SHARDED), slot.append(place * g + i // math.ceil(n / g))
    return np.array(tier), np.array(slot)


def per_rank_rows(sizes, kinds, places, topo) -> np.ndarray:
    used = np.zeros(topo.world, dtype=np.int64)
    g = topo.ranks_per_node
    for n, kind, place in zip(sizes, kinds, places):
        if kind == "data-parallel":
            used += n
        elif kind == "row":
            used += blocks(n, topo.world)
        elif kind == "table":
            used[place] += n
        else:
            used[place * g:(place + 1) * g] += blocks(n, g)
    return used


SIZES = [3, 40, 7, 300, 1000, 60]


def counts_of(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(0, 50, n) for n in sizes])


def check(plan, sizes, kinds, places, topo, headroom):
    tier, slot = expected_owner(sizes, kinds, places, topo)
    assert plan.tier.tolist() == tier.tolist()
    assert plan.slot.tolist() == slot.tolist()
    used = per_rank_rows(sizes, kinds, places, topo)
    assert plan.rows_held().tolist() == used.tolist()
    assert used.max() <= budget_rows(sizes, topo.world, headroom)


@pytest.mark.parametrize("headroom", [1.0, 1.25, 2.0, 4.0])
def test_data_parallel_replicates_the_smallest_tables_that_fit(headroom):
    topo = Topology(4, 2)
    plan = build_plan("data-parallel", inputs(SIZES, counts_of(SIZES), topo, headroom))
    budget = budget_rows(SIZES, 4, headroom)
    order = sorted(range(len(SIZES)), key=lambda t: SIZES[t])
    chosen: set[int] = set()
    for t in order:   # the largest prefix of the smallest tables whose copies fit beside the row-wise rest
        trial = chosen | {t}
        kinds = ["data-parallel" if i in trial else "row" for i in range(len(SIZES))]
        if per_rank_rows(SIZES, kinds, [-1] * len(SIZES), topo).max() > budget:
            break
        chosen = trial
    kinds = ["data-parallel" if i in chosen else "row" for i in range(len(SIZES))]
    check(plan, SIZES, kinds, [-1] * len(SIZES), topo, headroom)
    assert plan.details["table_plan_types"] == kinds
    if headroom == 4.0:
        assert len(chosen) >= 4   # room for several copies: 3, 7, 40, 60 rows at least


def test_data_parallel_tables_by_name_and_over_the_budget():
    topo = Topology(4, 2)
    plan = build_plan("data-parallel", inputs(SIZES, counts_of(SIZES), topo, 2.0, data_parallel_tables=[3, 0]))
    kinds = ["data-parallel" if i in (0, 3) else "row" for i in range(len(SIZES))]
    check(plan, SIZES, kinds, [-1] * len(SIZES), topo, 2.0)
    with pytest.raises(InfeasibleError, match="data-parallel: tables \\[4\\]"):
        build_plan("data-parallel", inputs(SIZES, counts_of(SIZES), topo, 2.0, data_parallel_tables=[4]))


def twrw_reference(sizes, lookups, topo, budget):
    """Largest rows per rank first, each to the node of fewest lookups with room (ties: lower node)."""
    g, m = topo.ranks_per_node, topo.nodes
    used = np.zeros(topo.world, dtype=np.int64)
    load = [0.0] * m
    places = [None] * len(sizes)
    for t in sorted(range(len(sizes)), key=lambda t: (-math.ceil(sizes[t] / g), -lookups[t], t)):
        room = [k for k in range(m) if max(used[k * g + i] + b for i, b in enumerate(blocks(sizes[t], g))) <= budget]
        k = min(room, key=lambda k: (load[k], k))
        used[k * g:(k + 1) * g] += blocks(sizes[t], g)
        load[k] += lookups[t]
        places[t] = k
    return places


@pytest.mark.parametrize("topo", [Topology(4, 2), Topology(6, 2), Topology(8, 4)], ids=lambda t: t.label())
def test_twrw_puts_each_table_on_one_node_balancing_lookups(topo):
    sizes = [3, 40, 7, 300, 250, 60, 90]
    counts = counts_of(sizes, seed=3)
    plan = build_plan("twrw", inputs(sizes, counts, topo, 2.0))
    bounds = np.cumsum([0] + sizes)
    lookups = [int(counts[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]
    places = twrw_reference(sizes, lookups, topo, budget_rows(sizes, topo.world, 2.0))
    check(plan, sizes, ["twrw"] * len(sizes), places, topo, 2.0)
    for a, b in zip(bounds[:-1], bounds[1:]):   # a table's lookups stay with one node
        assert len(set(plan.slot[a:b] // topo.ranks_per_node)) == 1


def test_twrw_fails_when_a_table_fits_no_node():
    with pytest.raises(InfeasibleError, match="twrw: table 1 .*fits on no node"):
        build_plan("twrw", inputs([10, 1000], np.ones(1010), Topology(8, 2), 1.25))


def priced(sizes, counts, topo, per_step, intra=300e9, inter=25e9, reduce_bytes=4):
    """Seconds per step of each table as row-wise and as data-parallel, from first principles."""
    p, g = topo.world, topo.ranks_per_node
    total = counts.sum()
    bounds = np.cumsum([0] + list(sizes))
    out = []
    for t, n in enumerate(sizes):
        lookups = counts[bounds[t]:bounds[t + 1]].sum() / total * per_step
        lookup = 8 + 2 * DIM * 4                                    # id out, vector back, gradient out
        rw_intra, rw_inter = lookups * lookup * (g - 1) / p, lookups * lookup * (p - g) / p
        ring = 2 * (p - 1) / p * DIM * reduce_bytes * n             # every member's share of the ring
        inter_links = topo.nodes if topo.nodes > 1 else 0
        dp_intra, dp_inter = ring * (p - inter_links), ring * inter_links
        out.append(((rw_intra / intra + rw_inter / inter) / p, (dp_intra / intra + dp_inter / inter) / p))
    return out


@pytest.mark.parametrize("topo", [Topology(4, 2), Topology(8, 4), Topology(4, 1)], ids=lambda t: t.label())
def test_auto_replicates_what_saves_and_is_never_worse_than_row_wise(topo):
    # a Kaggle-like profile: every table looked up once per sample, so small tables are hot per row
    sizes = [3, 40, 7, 300, 1000, 60, 5000]
    rng = np.random.default_rng(1)
    counts = np.concatenate([rng.multinomial(20000, np.full(n, 1 / n)) for n in sizes])
    per_step = 64.0 * len(sizes)
    prices = priced(sizes, counts, topo, per_step)
    plan = build_plan("auto", inputs(sizes, counts, topo, 100.0, per_step))   # room for every table's copies
    want = ["data-parallel" if dp < row * (1 - 1e-9) else "row" for row, dp in prices]
    assert plan.details["table_plan_types"] == want
    assert 0 < want.count("data-parallel") < len(sizes)
    check(plan, sizes, want, [-1] * len(sizes), topo, 100.0)
    got = sum(dp if k == "data-parallel" else row for (row, dp), k in zip(prices, want))
    assert plan.details["modelled_seconds_per_step"] == pytest.approx(got, rel=1e-9)
    assert plan.details["row_wise_seconds_per_step"] == pytest.approx(sum(r for r, _ in prices), rel=1e-9)
    # a tight budget: fewer copies, still within it and never dearer than row-wise, table by table
    tight = build_plan("auto", inputs(sizes, counts, topo, 1.25, per_step))
    kinds = tight.details["table_plan_types"]
    assert set(kinds) <= {"row", "data-parallel"}   # table-wise and TWRW price as row-wise: ties stay row-wise
    assert all(dp <= row for (row, dp), k in zip(prices, kinds) if k == "data-parallel")
    assert tight.rows_held().max() <= budget_rows(sizes, topo.world, 1.25)
    assert kinds.count("data-parallel") <= want.count("data-parallel")
    only_rows = build_plan("auto", inputs(sizes, counts, topo, 100.0, per_step, plan_types=["twrw", "table"]))
    assert only_rows.details["table_plan_types"] == ["row"] * len(sizes)


def test_plans_are_deterministic():
    topo = Topology(8, 4)
    counts = counts_of(SIZES, seed=5)
    for name in ("data-parallel", "twrw", "auto"):
        a = build_plan(name, inputs(SIZES, counts, topo, 2.0, 500.0))
        b = build_plan(name, inputs(SIZES, counts.copy(), topo, 2.0, 500.0))
        assert a.tier.tolist() == b.tier.tolist() and a.slot.tolist() == b.slot.tolist(), name
        assert a.details == b.details, name


@pytest.mark.parametrize("plan,options,option", [
    ("data-parallel", {"data_parallel_tables": [99]}, "data_parallel_tables"),
    ("data-parallel", {"data_parallel_tables": "0"}, "data_parallel_tables"),
    ("data-parallel", {"data_parallel_tables": [1, 1]}, "data_parallel_tables"),
    ("data-parallel", {"plan_types": ["row"]}, "plan_types"),
    ("twrw", {"nodes": 2}, "nodes"),
    ("auto", {"plan_types": ["column"]}, "plan_types"),
    ("auto", {"plan_types": "twrw"}, "plan_types"),
    ("auto", {"inter_node_gbps": 0}, "inter_node_gbps"),
    ("auto", {"intra_node_gbps": "fast"}, "intra_node_gbps"),
])
def test_bad_options_fail_in_one_line_naming_the_option(plan, options, option):
    errors = []
    with pytest.raises(ConfigError) as e:
        build_plan(plan, inputs(SIZES, counts_of(SIZES), Topology(4, 2), 2.0, **options))
    errors.append(str(e.value))
    if option != "data_parallel_tables" or options[option] != [99]:   # the table count is known only to the planner
        with pytest.raises(ConfigError) as e:
            methods.get("sharded").parse_options({"plan": plan, "plan_options": options})  # as a config is read
        errors.append(str(e.value))
    for msg in errors:
        assert option in msg and "\n" not in msg, msg
    with pytest.raises(ConfigError, match="plan_options are the recshard plan's"):
        methods.get("sharded").parse_options({"plan": "row", "plan_options": {"plan_types": ["twrw"]}})


def test_a_mixed_layout_places_every_plan_type_as_written_out():
    """The per-table layout ``auto`` assembles, every type at once (table-wise and TWRW tie with row-wise today)."""
    from hotcold.distributed.table_plans import Layout

    topo = Topology(8, 4)
    layout = Layout.row_wise(inputs(SIZES, counts_of(SIZES), topo, 4.0))
    moves = {0: ("data-parallel", -1), 1: ("table", 5), 3: ("twrw", 1), 5: ("twrw", 0)}
    for t, (kind, place) in moves.items():
        assert layout.room(t, kind, place)
        layout.move(t, kind, place)
    kinds = [moves.get(t, ("row", -1))[0] for t in range(len(SIZES))]
    places = [moves.get(t, ("row", -1))[1] for t in range(len(SIZES))]
    plan = layout.plan("mixed")
    check(plan, SIZES, kinds, places, topo, 4.0)
    assert layout.used.tolist() == per_rank_rows(SIZES, kinds, places, topo).tolist()
    assert not layout.room(4, "table", 0)   # 1000 rows on one rank: over the budget of 4 x 178 rows
