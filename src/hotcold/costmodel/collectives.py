"""Collectives: a scale-out step's all-to-alls and all-reduces in ms, from the bytes each rank sends.

Every rank sends its bytes to ranks on its own node at ``intra_node_bw`` and
to other nodes at ``inter_node_bw`` (both per GPU, one direction), the two
links in parallel; a collective takes as long as its slowest rank:
``max_r max(intra_r / intra_bw, inter_r / inter_bw) + collective_latency``.
From a run's record the per-rank bytes come from the store report's [P, P]
matrices (``collective_ms``); from totals only (``shard-sim`` rows,
counters: ``comm_ms``), each collective's bytes are assumed split evenly
over ranks and between intra- and inter-node links in the proportion of the
totals. Collectives in flight at once share the links (``concurrent_ms``:
their bytes summed per rank, one latency). The collectives are
``distributed.traffic``'s, the names the runs count and time.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from hotcold.config import ConfigError
from hotcold.counters import COLLECTIVES
from hotcold.costmodel.profile import HardwareProfile
from hotcold.costmodel.workload import Workload

def comm_rates(profile: HardwareProfile) -> tuple[float, float, float]:
    """(intra GB/s, inter GB/s, latency ms); a clear error when the profile has no network."""
    for key in ("intra_node_bw", "inter_node_bw", "collective_latency_us"):
        if not profile.has(key):
            raise ConfigError(f"hardware profile {profile.name!r} has no {key}: it cannot model collectives")
    return profile.value("intra_node_bw"), profile.value("inter_node_bw"), profile.value("collective_latency_us") * 1e-3


def slowest_rank_ms(intra_bytes: Any, inter_bytes: Any, profile: HardwareProfile) -> float:
    """A collective's time: its slowest rank's sends (intra and inter links in parallel) plus its latency.

    ``intra_bytes``, ``inter_bytes``: each rank's bytes sent this step (sequences of equal length).
    """
    intra_bw, inter_bw, latency = comm_rates(profile)
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


def _rank_bytes(w: Workload) -> dict[str, tuple[Any, Any]]:
    """Each collective's per-rank (intra-node, inter-node) bytes sent per step of a scale-out run: from the store
    report's [P, P] matrices when present, else the counters' totals split as ``comm_ms`` splits them."""
    collectives = w.report.get("collectives") or {}
    steps = None
    if collectives:
        total = sum(float(v.get("bytes", 0)) for v in collectives.values())
        per_step = sum(w.c(f"{n}_bytes") for n in COLLECTIVES)
        steps = total / per_step if per_step > 0 else None
    p, g = w.world, w.ranks_per_node
    if not steps or not all("matrix" in v for v in collectives.values()):
        if p < 1 or g < 1 or p % g:
            raise ConfigError(f"comm_ms: ranks_per_node {g} must divide world {p}")
        intra, inter = w.c("intra_node_bytes"), w.c("inter_node_bytes")
        share = 0.0 if p // g == 1 else 1.0 if g == 1 else inter / (intra + inter) if intra + inter > 0 else 0.0
        return {name: ([w.c(f"{name}_bytes") / p * (1 - share)] * p, [w.c(f"{name}_bytes") / p * share] * p)
                for name in COLLECTIVES}
    # the report covers every step of the run (warm-up too): scale its bytes to the counters' mean step
    nodes = np.arange(p) // g
    inter_mask = nodes[:, None] != nodes[None, :]
    out: dict[str, tuple[Any, Any]] = {}
    for name in COLLECTIVES:
        entry = collectives.get(name)
        if not entry:
            out[name] = (np.zeros(p), np.zeros(p))
            continue
        m = np.asarray(entry["matrix"], dtype=np.float64) / steps  # [P, P] bytes per step
        np.fill_diagonal(m, 0.0)
        out[name] = ((m * ~inter_mask).sum(axis=1), (m * inter_mask).sum(axis=1))
    return out


def collective_ms(w: Workload, profile: HardwareProfile) -> dict[str, float]:
    """Per-step ms of each collective of a scale-out run: from the store report's [P, P] matrices when
    present (the slowest rank exactly), else from the counters' totals (``comm_ms``)."""
    return {name: slowest_rank_ms(intra, inter, profile) for name, (intra, inter) in _rank_bytes(w).items()}


def concurrent_ms(w: Workload, profile: HardwareProfile, names: tuple[str, ...]) -> float:
    """Per-step ms of the collectives ``names`` in flight at once: they share the links, so each rank sends their
    bytes together (intra and inter links in parallel, as ``slowest_rank_ms``) and the latency is paid once."""
    per_rank = _rank_bytes(w)
    intra = np.sum([np.asarray(per_rank[n][0], dtype=np.float64) for n in names], axis=0)
    inter = np.sum([np.asarray(per_rank[n][1], dtype=np.float64) for n in names], axis=0)
    return slowest_rank_ms(intra, inter, profile)
