"""The training loop's view of the ranks: which slice of a batch is this rank's, dense data parallelism.

One process is a world of one: every method trains there unchanged. Under
``torchrun`` each rank trains on a contiguous slice of every global batch;
the dense layers are data-parallel, and the embedding stores exchange rows
through the same counted ``Comm``. Dense gradients are all-reduced in the
run's wire type (float32 by default); in exact mode (``distributed.exact``)
in float64, so that a run over P ranks is exact against ``World.replay(P)``,
its reference in one process (``World.sync_dense``).
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any, Callable

import torch
from torch import nn

from hotcold.config import ConfigError
from hotcold.distributed.comm import Comm, init_process_group
from hotcold.distributed.topology import Topology

PER_RUN = ("prefetch_batch",)  # counters that name a batch, not an amount: rank 0's


class World:
    def __init__(self, comm: Comm, slices: int = 1) -> None:
        self.comm = comm
        self.slices = slices        # P of a one-process replay of P ranks, else 1
        self._acc: torch.Tensor | None = None

    @classmethod
    def single(cls) -> "World":
        return cls(Comm(Topology(1)))

    @classmethod
    def replay(cls, ranks: int) -> "World":
        """One process computing each step's gradients as ``ranks`` data-parallel ranks would (the reference)."""
        return cls(Comm(Topology(1)), slices=ranks)

    @classmethod
    def join(cls, ranks_per_node: int, expected: int, device: torch.device, timeout_s: float = 300.0,
             backend: str = "auto") -> "World":
        """Join the torchrun launch this process is a rank of over ``backend`` (``distributed.backend``); a
        collective waits ``timeout_s`` for the others. Its ``comm.device`` is this rank's device (``cuda:<i>``)."""
        from hotcold.devices import local_ranks, resolve_backend

        rank, world, device = init_process_group(device, timeout_s, backend)
        if world != expected:
            raise ConfigError(f"the run config asks for world {expected}, but torchrun started {world} ranks")
        per_node = local_ranks()  # torchrun sets LOCAL_WORLD_SIZE (and WORLD_SIZE)
        if int(os.environ.get("GROUP_WORLD_SIZE", 1)) > 1 and per_node != ranks_per_node:
            raise ConfigError(f"on several real nodes distributed.ranks_per_node must be torchrun's "
                              f"--nproc-per-node ({per_node}), got {ranks_per_node}")
        host = resolve_backend(backend, device.type) == "gloo"  # gloo on a GPU trainer: collectives over CPU copies
        return cls(Comm(Topology(world, ranks_per_node), rank, device, host=host))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.world

    @property
    def is_main(self) -> bool:
        return self.comm.rank == 0

    @property
    def data_parallel(self) -> int:
        """How many slices each global batch's gradient is the mean of."""
        return self.size * self.slices

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.data_parallel:
            raise ConfigError(f"batch_size {batch_size} is not divisible by the world size {self.data_parallel}")

    def parts(self, n: int) -> list[slice | None]:
        """The slices of this process's batch whose losses are differentiated one by one (None: all of it)."""
        if self.slices == 1:
            return [None]
        k = n // self.slices
        return [slice(i * k, (i + 1) * k) for i in range(self.slices)]

    def accumulate(self, model: nn.Module) -> None:
        """In a replay, add one slice's dense gradients to the float64 sum and clear them for the next."""
        if self.slices == 1:
            return
        grads = _flat_grads(model).double()
        self._acc = grads if self._acc is None else self._acc.add_(grads)
        model.zero_grad(set_to_none=True)

    def sync_dense(self, model: nn.Module, emb: torch.Tensor, timer: Any,
                   beside: Callable[[torch.Tensor, Any], None] | None = None) -> None:
        """The global batch's gradient: dense gradients summed over slices and divided by P (one counted
        all-reduce across ranks, in the wire's reduce type); embedding gradients scaled by 1/P. One process: nothing.

        The global batch's gradient is the mean of the P slices' mean-loss
        gradients. In exact mode dense gradients are summed over ranks in float64: a sum of P
        float32 values is then (almost always) exact, so it does not depend on the
        order in which the all-reduce adds them, and rounding back to float32 gives
        the same bits whatever that order. (In float32, P data-parallel ranks differ
        from one process in the last bits, and per-element Adagrad on the dense
        layers amplifies that to about 1e-2 of the parameters within 40 steps.)
        ``World.replay(P)`` computes the same gradient in one process, slice by
        slice: the ``device`` store trained that way is the exact reference of a
        run over P ranks. Embedding gradients are scaled by ``1/P`` here too, so a
        store sums the same values whether its rows came from one process or many. Outside exact mode
        the sum is the wire's float32 (or bfloat16) all-reduce, as in production: close to the replay,
        not equal to it (docs/scale-out.md, "What is sent").

        Over several ranks the all-reduce is issued asynchronously and
        ``beside`` (the store's ``begin_backward``) runs while it is in flight,
        with the embedding gradient already scaled."""
        p = self.data_parallel
        if p == 1:
            return
        timer.mark("dense_fwd_bwd")
        if self.slices > 1:
            total, self._acc = self._acc, None
        else:
            pending = self.comm.all_reduce(_flat_grads(model), None, "dense_allreduce", async_op=True, on_wire=True)
            emb.grad.mul_(1.0 / p)
            if beside is not None:
                beside(emb.grad, timer)
            total = pending.wait()
            timer.mark("dense_allreduce")
        flat = (total.double() / p).float()
        offset = 0
        for param in model.parameters():
            n = param.numel()
            param.grad = flat[offset:offset + n].view_as(param)  # disjoint views of a fresh tensor
            offset += n
        if self.slices > 1:
            emb.grad.mul_(1.0 / p)

    def first_across(self, value: int) -> int:
        """The smallest of every rank's ``value`` (one uncounted all-reduce: control, not the model's traffic)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.comm.collective_device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return int(t.item())

    def combine_counters(self, counters: list[tuple[int, dict[str, int]]]) -> list[tuple[int, dict[str, int]]]:
        """Every step's counters summed over ranks (bytes and lookups of the whole world)."""
        if self.size == 1:
            return counters
        per_rank = self.comm.gather_objects(counters)
        out = []
        for i, (step, first) in enumerate(per_rank[0]):
            total = dict(first)
            for other in per_rank[1:]:
                for k, v in other[i][1].items():
                    if k not in PER_RUN:
                        total[k] = total[k] + v
            out.append((step, total))
        return out

    def close(self) -> None:
        if self.size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _flat_grads(model: nn.Module) -> torch.Tensor:
    """Every dense parameter's gradient in one flat tensor (zeros for a parameter without one)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


#: what a collective's failure says (gloo, NCCL, the store): a peer that did not answer in time, or went away
_COLLECTIVE_FAILURES = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe",
                        "connection refused", "watchdog")


def collective_failure(e: BaseException) -> bool:
    """Whether ``e`` is a collective that failed for want of a peer (not a bug or bad input of this rank)."""
    if isinstance(e, getattr(torch.distributed, "DistBackendError", ())) or \
            isinstance(e, getattr(torch.distributed, "DistNetworkError", ())):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _COLLECTIVE_FAILURES)


def unanswered(rank: int, world: int, grace_s: float = 5.0) -> list[int]:
    """A roll call through torchrun's store: the ranks that do not say they are here within ``grace_s``.

    Called by every rank whose collective failed: the ranks still running
    answer each other (their collectives fail at about the same time, when
    ``distributed.timeout_s`` runs out), a hung, stopped or dead one does
    not. The store is the launcher's (torchrun's), so it answers whatever
    the ranks do. Empty when the store cannot be reached (the names are then unknown).
    """
    try:
        store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                           is_master=False, timeout=datetime.timedelta(seconds=grace_s))
        run = f"hotcold/roll-call/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/" \
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        store.set(f"{run}{rank}", "here")
        deadline = time.monotonic() + grace_s
        while True:
            missing = [r for r in range(world) if not store.check([f"{run}{r}"])]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.1)
    except (RuntimeError, KeyError, ValueError):
        return []
