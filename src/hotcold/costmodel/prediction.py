"""The prediction: a workload's priced terms summed into modelled per-phase step times on a profile.

``predict`` prices the loop's own work (``batch_terms``) and the technique's
(its pricing function, ``techniques.py``), adjusts for ranks that share a
machine's cores, and sums the terms by phase; a prediction says which term
dominates. Shared cores: ``predict`` and docs/costmodel.md, "Shared cores".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from hotcold.costmodel.pricing import Costs, Terms, batch_terms
from hotcold.costmodel.profile import HardwareProfile
from hotcold.costmodel.techniques import PriceFn
from hotcold.costmodel.workload import ModelShape, Workload


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


def predict(workload: Workload, profile: HardwareProfile, price: PriceFn) -> Prediction:
    """Modelled per-phase times of one step of ``workload`` on ``profile``; ``price``: the technique's pricing.

    Shared cores (a ``cpu`` profile, P ranks of t threads on C = ``host_cores``
    cores, the record's core count when the profile has none): at P t > C the
    ranks take turns. A rank waiting in a gloo collective sleeps, so its compute
    phases run at full speed; before each collective it waits ``(P t / C - 1)``
    times the compute it did since the previous collective (the peers' turns:
    ``<collective>.wait_for_peers``), and loopback transfers, CPU work, take
    ``P t / C`` times longer. A GPU profile gives each rank its own GPU: no sharing.
    A rank's dense step and the batch it ships are its 1/P slice of the global batch.
    """
    w, t = workload, Terms()
    c = Costs(profile, sharers=w.world if profile.kind == "cpu" else w.ranks_per_node)
    batch_terms(t, c, w)
    price(t, c, w)
    if w.pipelined:
        _pipelined(t)
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


#: the terms the step pipeline's worker does for the next step while this one trains (``pipeline.py``: the
#: batch's read and copy, the store's ``plan_step``: global rows and their grouping, a cache's directory and
#: fetches, FAE's routing); FAE's come as ``hot_``/``cold_`` shares
PLANNED = frozenset({"read_batch", "ship_batch", "plan_ids", "unique_ids", "directory", "fetch", "slots", "slot_of",
                     "classify"})


def _pipelined(t: Terms) -> None:
    """A run with the step pipeline: the next step's planning (``PLANNED``) runs beside this step's training,
    so the step takes the longer of the two. What the training thread waits for is ``data.pipeline_wait``;
    the rest of the planning is hidden (``pipeline_<term>``)."""
    def planned(name: str) -> bool:
        return name.split("_", 1)[1] in PLANNED if name.startswith(("hot_", "cold_")) else name in PLANNED

    ahead = [(p, n, ms) for p, n, ms in t.items if planned(n)]
    t.items = [(p, n, ms) for p, n, ms in t.items if not planned(n)]
    prepare, train = sum(ms for *_, ms in ahead), sum(ms for *_, ms in t.items)
    wait = max(0.0, prepare - train)
    t.add("data", "pipeline_wait", wait)
    for phase, name, ms in ahead:
        key = f"pipeline_{phase}.{name}"
        t.hidden[key] = t.hidden.get(key, 0.0) + ms * (1 - wait / prepare)


#: a scale-out step's collectives in the order a rank reaches them (``train.py``, ``distributed/``)
STEP_ORDER = ("input_a2a", "output_a2a", "dense_allreduce", "grad_a2a", "replica_allreduce", "column_allreduce")
#: the compute a rank does before each collective (a phase, or ``phase.term``); the rest of the step
#: (the row update after the last collective, the next batch's read) comes before the first one
_BEFORE = {"output_a2a": ("emb_fwd",), "dense_allreduce": ("output_a2a.reorder", "dense_fwd_bwd"),
           "grad_a2a": ("early_lookup",), "column_allreduce": ("emb_update.unique_ids", "emb_update.grad_sum")}


def _shared_cores(t: Terms, compute: float, slowdown: float) -> None:
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


def predict_record(record: Mapping[str, Any], profile: HardwareProfile, price: PriceFn,
                   shape: ModelShape | None = None) -> Prediction:
    """``predict`` on a run's record (``Workload.from_record``) with its technique's pricing ``price``
    (``hotcold.methods.price``)."""
    return predict(Workload.from_record(record, shape), profile, price)
