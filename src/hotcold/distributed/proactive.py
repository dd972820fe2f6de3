"""``proactive``: Proactive Embedding (Cho et al., IEEE CAL 2024) on the sharded store.

Every collective of a step leaves a *window*: while it is in flight, each
owner looks up rows of coming steps. A step has four (``WINDOWS``): the ids
of step ``i + k``, sent ahead asynchronously in step ``i``'s ``prefetch``;
the output all-to-all; the dense all-reduce, issued asynchronously with the
gradient all-to-all beside it (``begin_backward``); and the gradient
all-to-all. In a window of step ``i`` the store may look up, for a step
``j`` in ``i..i+k`` whose ids have arrived, the rows that no step from ``i``
to ``j - 1`` updates and that only this owner writes (the sharded tier, or
column slices); for ``j = i`` (before step ``i``'s forward) that is every
row. Rows only ever become eligible, never stop being so, and a looked-up
vector is a copy: no early row can change before it is used, so training is
exact by construction.

Each window runs while its collective is in flight, nearest step first; at
the end of step ``i``'s gradient window, the rows of step ``i + 1`` that
are eligible and still not looked up are looked up (their last chance to be
early), so a step's early lookups do not depend on timing. Depth ``k``
spreads a step's early lookups over the windows of ``k`` steps: a row
step ``j`` shares with none of steps ``j - k..j - 1`` can be looked up ``k``
steps ahead, in whichever window is open then. What is reported: per window
and in total (``ProactiveStore.report``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from hotcold.counters import PROACTIVE_WINDOWS
from hotcold.distributed.comm import Pending
from hotcold.distributed.plan_types import SHARDED
from hotcold.distributed.sharded import Exchange, RouteInFlight, ShardedStore
from hotcold.options.sharded import ProactiveOptions
from hotcold.embedding.base import Marker, StoreSpec

CHUNK = 4096  # rows per lookup chunk between polls of the collective
#: the windows of a step, in order: the collective each one waits on
WINDOWS = PROACTIVE_WINDOWS


@dataclass
class _Ahead:
    """A coming step's lookups on this rank: its routing, which served rows are looked up, their vectors."""

    route: RouteInFlight
    ex: Exchange | None = None
    looked: torch.Tensor | None = None    # bool [R]: looked up already
    vectors: torch.Tensor | None = None   # [R, width]: the looked-up rows' vectors
    todo: torch.Tensor | None = None      # int64 positions eligible in this step and not looked up
    at: int = 0                           # how far into ``todo`` this step got
    early: int = 0                        # rows looked up in the windows of earlier steps


@dataclass
class _Window:
    lookups: int = 0
    ms: float = 0.0
    hidden_ms: float = 0.0


class ProactiveStore(ShardedStore):
    Options = ProactiveOptions

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.depth = self.lookahead = int(self.options.depth)
        # rows only this owner writes can be looked up while earlier steps are still to update
        self._early_ok = torch.ones_like(self.tier, dtype=torch.bool) if self.sharding.columns > 1 \
            else self.tier == SHARDED
        self._step = 0
        self._ahead: dict[int, _Ahead] = {}
        self._eligible_at: int = -1             # the step the ``todo`` lists were made for
        self._grads: Pending | None = None      # the gradient all-to-all issued in ``begin_backward``
        self.windows = {w: _Window() for w in WINDOWS}
        self.late_ms, self._late_total = 0.0, 0
        self._early_count = self._early_total = 0

    # -- the protocol ---------------------------------------------------------------------------
    def prefetch(self, upcoming: Sequence[torch.Tensor]) -> None:
        """Send the ids of step i + k ahead (booked as this step's input all-to-all) and, while they fly,
        look up this step's rows (every earlier update is done) and the coming steps' eligible rows.

        At the first step, those of steps 1..k: an early lookup for step i + k
        must know every row that steps i..i+k-1 update.
        """
        sent = None
        for ahead, ids in enumerate(upcoming[:self.depth], start=1):
            if self._step + ahead not in self._ahead:
                sent = self.send_route(ids)
                self._ahead[self._step + ahead] = _Ahead(sent)
        self._open_step()
        self._window("input_a2a", sent.ids if sent is not None else None)

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        ahead = self._ahead.pop(self._step, None)
        if ahead is None:  # the first step: nothing was sent ahead
            ex = self.route(ids)
            timer.mark("input_a2a")
            vectors = self.gather_rows(ex.served)
            self._early_count, self._late_total = 0, self._late_total + ex.served.numel()
        else:
            ex = self._resolve(ahead)
            timer.mark("input_a2a")
            vectors, looked = ahead.vectors, ahead.looked
            t0 = time.perf_counter()
            late = (~looked).nonzero().squeeze(1)
            if late.numel():
                vectors.index_copy_(0, late.to(self.device), self.gather_rows(ex.served[late]))
            self.late_ms += (time.perf_counter() - t0) * 1e3
            self._late_total += late.numel()
            self._early_count = ahead.early
        timer.mark("emb_fwd")
        pending = self.comm.all_to_all(vectors, ex.recv_counts, ex.send_counts, "output_a2a", async_op=True,
                                       on_wire=True)
        self._last = ex  # the rows this step updates: known to the windows from now on
        self._window("output_a2a", pending)
        timer.mark("early_lookup")
        out = self.to_batch(self.assemble(ex, pending.wait()), ex.lk)
        timer.mark("output_a2a")
        return out

    def begin_backward(self, grad: torch.Tensor, timer: Marker) -> None:
        """Issue the gradient all-to-all beside the dense all-reduce; look up while the all-reduce flies."""
        assert self._last is not None, "backward without forward"
        self._grads = self.send_grads(self._last, grad, async_op=True)
        self._window("dense_allreduce", "dense_allreduce")
        timer.mark("early_lookup")

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        ex = self._last
        pending, self._grads = self._grads or self.send_grads(ex, grad, async_op=True), None
        self._window("grad_a2a", pending, last=True)
        timer.mark("early_lookup")
        received = pending.wait()
        timer.mark("grad_a2a")
        self.update(ex, received, timer)

    def _book_step(self, ex: Exchange, early: int = 0) -> None:
        super()._book_step(ex, self._early_count)
        self._early_total += self._early_count
        self._step += 1

    # -- the windows ----------------------------------------------------------------------------
    def _resolve(self, ahead: _Ahead) -> Exchange:
        """The step's routing once its ids have arrived (waits for them), with empty lookup state."""
        if ahead.ex is None:
            ahead.ex = ahead.route.wait()
            r = ahead.ex.served.numel()
            ahead.looked = torch.zeros(r, dtype=torch.bool)
            ahead.vectors = torch.empty(r, self.width, dtype=self.weight.dtype, device=self.device)
        return ahead.ex

    def _open_step(self) -> None:
        """At the start of a step: every coming step's rows looked up so far count as early; their lists are stale."""
        for ahead in self._ahead.values():
            if ahead.looked is not None:
                ahead.early = int(ahead.looked.sum())
            ahead.todo, ahead.at = None, 0
        self._eligible_at = self._step

    def eligible(self, target: int) -> torch.Tensor:
        """Positions of step ``target``'s served rows that this step's windows may look up: every row for
        this step's own; else rows only this owner writes that no step from this one to ``target - 1``
        serves here (so none updates). Needs the routes of those steps (waits for them)."""
        ex = self._ahead[target].ex
        if target == self._step:
            return torch.arange(ex.served.numel())
        between = [self._last.served] if self._last is not None else []
        between += [self._resolve(self._ahead[s]).served for s in range(self._step + len(between), target)]
        touched = torch.cat(between).numpy()
        mask = self._early_ok.index_select(0, ex.served) & ~torch.from_numpy(np.isin(ex.served.numpy(), touched))
        return mask.nonzero().squeeze(1)

    def _knows_between(self, target: int) -> bool:
        """Whether the routes of every step from this one to ``target - 1`` were sent (the first step's
        is not known before its forward): only then is it known which rows they update."""
        first = self._step + 1 if self._last is not None else self._step
        return all(s in self._ahead for s in range(first, target))

    def _work(self, target: int, wait: bool) -> _Ahead | None:
        """Step ``target``'s state with its ``todo`` list for this step, or None while its ids are in flight."""
        ahead = self._ahead.get(target)
        if ahead is None or (ahead.ex is None and not wait and not ahead.route.done()):
            return None
        if target > self._step and not self._knows_between(target):
            return None
        self._resolve(ahead)
        if ahead.todo is None:
            take = self.eligible(target)
            ahead.todo, ahead.at = take[~ahead.looked.index_select(0, take)], 0
        return ahead

    def _window(self, name: str, pending: Pending | str | None, last: bool = False) -> None:
        """Look up coming rows, nearest step first, while ``pending`` (a collective, or a name of one in flight)
        is in flight; ``last`` (the step's last window): then the next step's eligible rows, whatever the time."""
        win = self.windows[name]

        def flying() -> bool:
            if pending is None:
                return False
            return name in self.comm.in_flight() if isinstance(pending, str) else not pending.done()

        targets = range(self._step, self._step + self.depth + 1)
        for target in targets:
            while flying():
                ahead = self._work(target, wait=False)
                if ahead is None or ahead.at >= ahead.todo.numel():
                    break
                self._chunk(ahead, win)
            if not flying():
                break
        if last and self._step + 1 in self._ahead:
            ahead = self._work(self._step + 1, wait=True)
            while ahead.at < ahead.todo.numel():
                self._chunk(ahead, win)

    def _chunk(self, ahead: _Ahead, win: _Window) -> None:
        """Look up the next chunk of ``ahead.todo``; its time is hidden when a collective is still in flight after it.

        On gloo the collectives run on gloo's threads; on NCCL on NCCL's stream,
        while the lookups run on the training stream (each chunk is waited for,
        so its host time is its GPU time).
        """
        t0 = time.perf_counter()
        idx = ahead.todo[ahead.at:ahead.at + CHUNK]
        ahead.at += idx.numel()
        ahead.vectors.index_copy_(0, idx.to(self.device), self.gather_rows(ahead.ex.served[idx]))
        ahead.looked[idx] = True
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        win.lookups += int(idx.numel())
        win.ms += dt
        if self.comm.in_flight():
            win.hidden_ms += dt

    # -- the record -----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The totals over ranks: the share of served lookups done early (in an earlier step's windows) and of
        lookup time hidden behind a collective; per window, its lookups, their time and the hidden share."""
        out = super().report()
        mine = ({w: (v.lookups, v.ms, v.hidden_ms) for w, v in self.windows.items()}, self.late_ms, self._early_total,
                self._late_total)
        per_rank = self.comm.gather_objects(mine)
        served = sum(out["served_lookups_per_rank"])
        late = sum(r[1] for r in per_rank)
        early_lookups, late_lookups = sum(r[2] for r in per_rank), sum(r[3] for r in per_rank)
        windows = {}
        for w in WINDOWS:
            n, ms, hidden = (sum(r[0][w][i] for r in per_rank) for i in range(3))
            windows[w] = {"lookups": int(n), "ms": ms, "hidden_ms": hidden, "hidden_share": hidden / ms if ms else 0.0}
        ahead_ms = sum(v["ms"] for v in windows.values())
        total_ms = ahead_ms + late
        hidden_ms = sum(v["hidden_ms"] for v in windows.values())
        return {**out, "depth": self.depth, "early_lookup_share": early_lookups / served if served else 0.0,
                "lookup_ms_early": ahead_ms, "lookup_ms_late": late, "late_lookups": late_lookups,
                "hidden_lookup_share": hidden_ms / total_ms if total_ms > 0 else 0.0,
                "windows": windows,
                **{f"hidden_share_{w}": hidden / total_ms if total_ms > 0 else 0.0
                   for w, hidden in ((w, windows[w]["hidden_ms"]) for w in WINDOWS)},
                **{f"window_lookup_share_{w}": windows[w]["lookups"] / served if served else 0.0 for w in WINDOWS}}
