"""``fae``: FAE (Adnan et al., VLDB 2022), hot rows on the device, hot and cold mini-batches.

Profiling, the hot set, the classification of inputs and the batch schedule
are ``hotcold.policies.fae_schedule``'s (shared with the FAE trace model). Every
row lives in host memory; the hot rows (weights and optimizer state) also
live in device memory. A hot batch runs entirely on the device like
``device``; a cold batch takes the CPU-GPU ``hybrid`` path on the host rows.
A cold batch also reads and updates hot rows, so when the kind of batch
switches the whole hot set is copied across (``FAEStore``). Budget and run
length: ``FAEOptions``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import torch

from hotcold.accel import runtime
from hotcold.counters import row_bytes
from hotcold.embedding.base import EmbeddingStore, Marker, StoreSpec
from hotcold.embedding.hybrid import HybridStore
from hotcold.embedding.on_device import DevicePlan, DeviceTable
from hotcold.options.stores import FAEOptions
from hotcold.embedding.rows import Lookup, ship
from hotcold.policies.fae_schedule import HotSetSync, fae_counters, fae_order, plan

if TYPE_CHECKING:
    from hotcold.data.format import Dataset


@dataclass(frozen=True)
class FAEProfile:
    """What FAE's profiling decided: the hot rows and the hot share of the inputs.

    The hot set reaches the store through the spec: ``FAEStore.schedule``
    attaches an ``FAEProfile`` to it. A store built without one (no
    ``schedule`` call, e.g. when replaying a given order) has no hot rows and
    behaves as ``hybrid``.
    """

    hot_rows: torch.Tensor      # int64 [H] global rows, ascending
    hot_fraction: float = 0.0   # hot training inputs / training inputs
    sampled: int = 0            # training inputs profiled
    order: dict[str, Any] = dataclasses.field(default_factory=dict)  # ``FAEOrder.summary`` of the schedule
    kinds: np.ndarray | None = None  # bool [steps]: the schedule's hot batches, in training order

    def attach(self, spec: StoreSpec) -> None:
        spec.prepared["fae"] = self

    @staticmethod
    def of(spec: StoreSpec) -> "FAEProfile | None":
        return spec.prepared.get("fae")


@dataclass
class _FAEPlan:
    """One batch, planned on the host: its lookups, its kind, the hot rows synchronised before it."""

    lookup: Lookup | None                # None: a hot batch planned on the device (``on_device``)
    hot: bool
    synced: int                          # hot rows copied across before this batch (0: none)
    slots: torch.Tensor | None = None    # hot batch: int64 [L] hot slot of each lookup, on the device
    uslots: torch.Tensor | None = None   # hot batch: int64 [U] hot slot of each distinct row, on the device
    on_device: DevicePlan | None = None  # hot batch on a GPU: planned there


class FAEStore(EmbeddingStore):
    """Hot rows (weights + optimizer state) in device memory, every row in host memory.

    When the kind of batch switches the whole hot set is copied across (hot ->
    cold: device to host before the cold batch; cold -> hot: host to device
    before the hot batch) and no copy is ever read stale.

    Counters (``hotcold.counters``). A hot batch hits every lookup; a cold batch
    moves its looked-up vectors and their gradients as ``hybrid`` does. A
    synchronisation is parameter traffic of the H hot rows with their state
    (``param_*_h2d`` before a hot batch, ``param_*_d2h`` before a cold one),
    also reported as ``sync_rows``/``sync_bytes`` with ``switches`` = 1.
    """

    Options = FAEOptions
    plans_ahead = True

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        prof = FAEProfile.of(spec)
        self.profile = prof or FAEProfile(torch.zeros(0, dtype=torch.int64))
        # Cold path and the host copy of every row: the hybrid store on the same rows.
        self.host = HybridStore(dataclasses.replace(spec, options=HybridStore.Options()))
        self.hot_rows = torch.unique(self.profile.hot_rows.to(torch.int64))  # [H] ascending, CPU
        h = self.hot_rows.numel()
        self._slot_of = torch.full((spec.num_rows,), -1, dtype=torch.int32)  # [N] global row -> hot slot
        self._slot_of[self.hot_rows] = torch.arange(h, dtype=torch.int32)
        self.rt = runtime(self.device)
        trash = 1 if self.rt.offloaded else 0  # on a GPU the hot table ends with a trash row (``DeviceTable``)
        weight = torch.zeros(h + trash, self.dim, device=self.device)  # [H(+1), D]
        state = self.optimizer.init_state(h + trash, self.dim, self.device)    # [H(+1)(, D)]
        self.dev_weight, self.dev_state = weight[:h], state[:h]
        self.dev_weight.copy_(self.host.weight.index_select(0, self.hot_rows))
        if self.optimizer.adagrad:
            self.dev_state.copy_(self.host.state.index_select(0, self.hot_rows))
        #: a hot batch on a GPU, planned on the device: its slots are its rows' places among the hot rows
        self.table = DeviceTable(weight, state, self.optimizer, self.column_offsets, spec.num_rows,
                                 ship(self.hot_rows, self.device)) if self.rt.offloaded else None
        self._planned = 0  # batches planned so far (their kinds, in training order: ``FAEProfile.kinds``)
        if self.rt.offloaded:  # pinned staging of synchronisation copies
            self._pin_w = self.rt.empty_host(h, self.dim)
            self._pin_s = self.rt.empty_host(*self.dev_state.shape)
        self.row_bytes = row_bytes(spec.dim, self.optimizer.state_width(spec.dim))
        self._sync = HotSetSync(h)
        self._last: tuple[Lookup, torch.Tensor] | DevicePlan | None = None  # hot batch: its plan
        self._hot_step: bool | None = None  # kind of the batch awaiting ``backward``
        self._synced = 0                    # hot rows synchronised before that batch

    @property
    def hot_fraction(self) -> float:
        return self.profile.hot_fraction

    def report(self) -> dict[str, Any]:
        return {"hot_fraction": self.hot_fraction, "hot_rows": int(self.hot_rows.numel()),
                "hot_ratio": self.hot_rows.numel() / self.spec.num_rows,
                "hot_bytes": int(self.hot_rows.numel()) * 4 * self.dim, "hot_state_bytes":
                int(self.hot_rows.numel()) * 4 * self.optimizer.state_width(self.dim),
                "sampled_inputs": self.profile.sampled, **self.profile.order}

    @classmethod
    def schedule(cls, spec: StoreSpec, ds: "Dataset", default: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Profile, pick the hot rows, classify every training input, and return FAE's batch order.

        The batch size and the number of batches are the default order's
        (``train.steps``); the first ``spec.warmup_steps`` are untimed. The
        order is ``fae_order``'s scaled epoch: the timed steps hold the
        epoch's hot:cold batch ratio, whatever the run's length (the store's
        report states the epoch's and the timed shares and switches). FAE
        always shuffles; ``train.shuffle`` does not apply. With a budget of 0
        rows the order is exactly the loader's and the run is ``hybrid``'s
        (reported ``degenerate: all-cold``).
        """
        opts = cls.Options.parse(spec.options, f"store {cls.__name__}")
        p = plan(ds, spec.seed, opts.sample_fraction, opts.hot_rows(spec.num_rows, spec.dim))
        default = list(default)
        if not default:
            FAEProfile(torch.from_numpy(p.hot_rows), p.hot_fraction, p.sampled).attach(spec)
            return iter(())
        steps = len(default)
        order = fae_order(np.flatnonzero(p.is_hot), np.flatnonzero(~p.is_hot), len(default[0]), steps, spec.seed,
                          opts.run_length, min(spec.warmup_steps, steps))
        FAEProfile(torch.from_numpy(p.hot_rows), p.hot_fraction, p.sampled, order.summary(), order.kinds).attach(spec)
        return iter(order.batches)

    def _hot_to_device(self) -> None:
        """Copy the hot rows (and state) host -> device."""
        adagrad = self.optimizer.adagrad
        if self.rt.offloaded:
            torch.index_select(self.host.weight, 0, self.hot_rows, out=self._pin_w)
            self.dev_weight.copy_(self._pin_w, non_blocking=self.rt.cuda)
            if adagrad:
                torch.index_select(self.host.state, 0, self.hot_rows, out=self._pin_s)
                self.dev_state.copy_(self._pin_s, non_blocking=self.rt.cuda)
        else:
            self.dev_weight.copy_(self.host.weight.index_select(0, self.hot_rows))
            if adagrad:
                self.dev_state.copy_(self.host.state.index_select(0, self.hot_rows))

    def _hot_to_host(self) -> None:
        """Copy the hot rows (and state) device -> host."""
        adagrad = self.optimizer.adagrad
        w, s = self.dev_weight, self.dev_state
        if self.rt.offloaded:
            w = self.rt.copy_to_host(self._pin_w, w)
            if adagrad:
                s = self.rt.copy_to_host(self._pin_s, s)
            self.rt.wait(self.rt.current_stream(), "fae's hot set to the host")  # the host copy needs them now
        self.host.weight.index_copy_(0, self.hot_rows, w)
        if adagrad:
            self.host.state.index_copy_(0, self.hot_rows, s)

    def plan_step(self, ids: torch.Tensor, device_rows: torch.Tensor | None = None) -> _FAEPlan:
        """Hot or cold, and whether the hot set moves before it; a hot batch's slots, shipped to the device.

        On a GPU a batch of the schedule's takes its kind from the schedule
        (FAE's hot batches are of inputs whose rows are all hot) and a hot one
        is planned on the device from ``device_rows`` (``DeviceTable``); a cold
        one is grouped on the host for the host's update.
        """
        step, kinds = self._planned, self.profile.kinds
        self._planned += 1
        if self.table is not None and kinds is not None and step < len(kinds):
            hot = bool(kinds[step])
            synced = self._sync.enter(hot)
            if hot:
                rows = self.table.rows_of(ids) if device_rows is None else device_rows
                return _FAEPlan(None, True, synced, on_device=self.table.plan(rows))
            return _FAEPlan(super().plan_step(ids), False, synced)
        lk = super().plan_step(ids)
        # the [N] map is read once per distinct row (a few thousand reads, not one per lookup); the grouping
        # is the step's anyway: the hot update sums by it, a cold step hands it to the host's update
        uslots = self._slot_of[lk.groups().rows].to(torch.int64)  # [U] slot of each unique row, -1 = cold row
        hot = bool((uslots >= 0).all())
        synced = self._sync.enter(hot)
        if not hot:
            return _FAEPlan(lk, False, synced)
        slots = uslots.index_select(0, lk.groups().inverse())  # [L]
        lk.groups().plan(self.device)  # what the sum reads on the device
        return _FAEPlan(lk, True, synced, ship(slots, self.device), ship(uslots, self.device))

    def forward(self, ids: torch.Tensor, timer: Marker) -> torch.Tensor:
        p = self.planned(ids)
        lk, self._synced, self._hot_step = p.lookup, p.synced, p.hot
        if p.hot:
            if p.synced:
                self._hot_to_device()
            timer.mark("h2d")
            if p.on_device is not None:
                self._last = p.on_device
                out = self.table.lookup(p.on_device)  # [B, K, D]
            else:
                self._last = (lk, p.uslots)
                out = self.to_batch(self.dev_weight.index_select(0, p.slots), lk)  # [B, K, D]
            timer.mark("emb_fwd")
            return out
        if p.synced:
            self._hot_to_host()
            timer.mark("d2h")
        self._last = None
        return self.host.forward_planned(lk, timer)

    def backward(self, grad: torch.Tensor, timer: Marker) -> None:
        assert self._hot_step is not None, "backward without forward"
        hot, self._hot_step = self._hot_step, None
        synced, dim, rb = self._synced, self.dim, self.row_bytes
        if not hot:  # cold batch: the hybrid update on the host rows
            self.host.backward(grad, timer)
            c = self.host.step_counters()
        elif isinstance(self._last, DevicePlan):  # planned on the device: its counts read after the timed steps
            self.table.update(self._last, grad)
            self._counters = self._device_counts.add(self._last.counts(), lambda lookups, unique, _: fae_counters(
                True, lookups, unique, synced, dim, rb))
            self._last = None
            timer.mark("emb_update")
            return
        else:
            assert self._last is not None
            lk, uslots = self._last
            self.optimizer.step(self.dev_weight, self.dev_state, uslots, lk.groups(), self.from_batch(grad, lk))
            c = {"lookups": lk.size, "unique_rows": uslots.numel()}
            self._last = None
            timer.mark("emb_update")
        self._counters = fae_counters(hot, c["lookups"], c["unique_rows"], synced, dim, rb)

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Evaluation: host rows, with the hot ones from the device when that copy is current."""
        if self._sync.fresh != "device":
            return self.host.lookup(ids)
        lk = self.plan(ids)
        slots = self._slot_of[lk.rows].to(torch.int64)  # [L]
        hot = (slots >= 0).nonzero().squeeze(1)          # [Lh] positions of hot lookups
        if hot.numel() == lk.size:
            return self.to_batch(self.dev_weight.index_select(0, slots.to(self.device)), lk)
        values = self.host.weight.index_select(0, lk.rows).to(self.device)  # [L, D]
        values.index_copy_(0, hot.to(self.device),
                           self.dev_weight.index_select(0, slots.index_select(0, hot).to(self.device)))
        return self.to_batch(values, lk)

    def export(self) -> torch.Tensor:
        out = self.host.export()  # [N, D], CPU
        if self._sync.fresh == "device":
            out.index_copy_(0, self.hot_rows, self.dev_weight.to("cpu"))
        return out

    def final_rows(self) -> torch.Tensor:
        """``export``'s rows without a second table: the hot rows written into the host table."""
        out = self.host.final_rows()
        if self._sync.fresh == "device":
            out.index_copy_(0, self.hot_rows, self.dev_weight.to("cpu"))
        return out

    def close(self) -> None:
        self.host.close()
