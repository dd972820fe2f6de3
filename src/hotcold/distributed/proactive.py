"""``proactive``: Proactive Embedding (Cho et al., IEEE CAL 2024) on the sharded store.

The ids of step ``i + k`` are distributed ``k`` steps early (their input
all-to-all runs in step ``i``'s ``prefetch``). While step ``i``'s gradient
all-to-all is in flight, each owner looks up the rows step ``i + k`` asks of
it that no step from ``i`` to ``i + k - 1`` updates (rows only this owner
writes: the sharded tier, or column slices), and keeps those vectors.
After step ``i + k - 1``'s update only the remaining rows are looked up.
No early row can change before it is used, so training is exact by
construction. What is reported: ``ProactiveStore._look_ahead``.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from hotcold.distributed.plan_types import SHARDED
from hotcold.distributed.sharded import Exchange, ProactiveOptions, ShardedStore
from hotcold.embedding.base import Marker, StoreSpec

CHUNK = 4096  # rows per early-lookup chunk between polls of the collective


class ProactiveStore(ShardedStore):
    Options = ProactiveOptions

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self.depth = self.lookahead = int(self.options.depth)
        # rows only this owner writes can be looked up early
        self._early_ok = torch.ones_like(self.tier, dtype=torch.bool) if self.sharding.columns > 1 \
            else self.tier == SHARDED
        self._step = 0
        self._routes: dict[int, Exchange] = {}
        self._early: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # step -> (early mask [R], vectors [R, w])
        self.early_ms = self.late_ms = self.hidden_ms = 0.0
        self._early_count = self._early_total = 0

    def prefetch(self, upcoming: Sequence[torch.Tensor]) -> None:
        """Distribute the ids of step i + k now (booked as this step's input all-to-all).

        At the first step, those of steps 1..k: an early lookup for step i + k
        must know every row that steps i..i+k-1 update.
        """
        for ahead, ids in enumerate(upcoming[:self.depth], start=1):
            if self._step + ahead not in self._routes:
                self._routes[self._step + ahead] = self.route(ids)

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        ex = self._routes.pop(self._step, None)
        if ex is None:  # the first k steps: nothing was distributed early
            ex = self.route(ids)
        timer.mark("input_a2a")
        t0 = time.perf_counter()
        early = self._early.pop(self._step, None)
        if early is None:
            vectors = self.gather_rows(ex.served)
            self._early_count = 0
        else:
            mask, vectors = early
            late = (~mask).nonzero().squeeze(1)
            vectors.index_copy_(0, late.to(self.device), self.gather_rows(ex.served[late]))
            self._early_count = int(mask.sum())
        self.late_ms += (time.perf_counter() - t0) * 1e3
        timer.mark("emb_fwd")
        return self._finish_forward(ex, vectors, timer)

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._last is not None, "backward without forward"
        ex = self._last
        pending = self.send_grads(ex, grad, async_op=True)
        self._look_ahead(pending)
        timer.mark("early_lookup")
        received = pending.wait()
        timer.mark("grad_a2a")
        self.update(ex, received, timer)

    def _book_step(self, ex: Exchange, early: int = 0) -> None:
        super()._book_step(ex, self._early_count)
        self._early_total += self._early_count
        self._step += 1

    def _look_ahead(self, pending: Any) -> None:
        """Look up step i+k's rows that steps i..i+k-1 leave alone, while ``pending`` is in flight.

        Reported: the share of served lookups done early, and the share of lookup
        time hidden behind communication: the early lookups run in chunks, and a
        chunk counts as hidden when the collective was still in flight after it.
        On gloo the all-to-all runs on gloo's own thread; on NCCL on NCCL's stream,
        while the early lookups run on the training stream (each chunk is waited
        for, so its host time is its GPU time).
        """
        target = self._step + self.depth
        ex = self._routes.get(target)
        if ex is None:
            return
        touched = torch.cat([self._last.served, *(self._routes[s].served for s in range(self._step + 1, target))])
        served = ex.served
        mask = self._early_ok.index_select(0, served) & ~torch.from_numpy(np.isin(served.numpy(), touched.numpy()))
        vectors = torch.empty(served.numel(), self.width, dtype=self.weight.dtype, device=self.device)
        take = mask.nonzero().squeeze(1)
        cuda = self.device.type == "cuda"
        for a in range(0, take.numel(), CHUNK):
            t0 = time.perf_counter()
            idx = take[a:a + CHUNK]
            vectors.index_copy_(0, idx.to(self.device), self.gather_rows(served[idx]))
            if cuda:  # NCCL runs the collective on its own stream; wait for this chunk so its time is real
                torch.cuda.current_stream(self.device).synchronize()
            dt = (time.perf_counter() - t0) * 1e3
            self.early_ms += dt
            if not pending.done():
                self.hidden_ms += dt
        self._early[target] = (mask, vectors)

    def report(self) -> dict[str, Any]:
        out = super().report()
        per_rank = self.comm.gather_objects((self.early_ms, self.late_ms, self.hidden_ms, self._early_total))
        early, late, hidden, early_lookups = (sum(t[i] for t in per_rank) for i in range(4))
        served = sum(out["served_lookups_per_rank"])
        return {**out, "depth": self.depth, "early_lookup_share": early_lookups / served if served else 0.0,
                "lookup_ms_early": early, "lookup_ms_late": late,
                "hidden_lookup_share": hidden / (early + late) if early + late > 0 else 0.0}
