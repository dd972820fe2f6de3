"""The training loop's view of the ranks: which slice of a batch is this rank's, dense data parallelism.

One process is a world of one: every method trains there unchanged. Under
``torchrun`` each rank trains on a contiguous slice of every global batch;
the dense layers are data-parallel (gradients summed over ranks and divided
by P, so every rank holds the gradient of the global batch's mean loss), and
the embedding stores exchange rows through the same counted ``Comm``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hotcold.config import ConfigError
from hotcold.data.loader import Batch
from hotcold.distributed.comm import Comm, init_process_group
from hotcold.distributed.topology import Topology

PER_RUN = ("prefetch_batch",)  # counters that name a batch, not an amount: rank 0's


class World:
    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    @classmethod
    def single(cls) -> "World":
        return cls(Comm(Topology(1)))

    @classmethod
    def join(cls, ranks_per_node: int, expected: int, device: torch.device) -> "World":
        """Join the torchrun launch this process is a rank of."""
        rank, world = init_process_group(device)
        if world != expected:
            raise ConfigError(f"the run config asks for world {expected}, but torchrun started {world} ranks")
        return cls(Comm(Topology(world, ranks_per_node), rank, device))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.world

    @property
    def is_main(self) -> bool:
        return self.comm.rank == 0

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.size:
            raise ConfigError(f"batch_size {batch_size} is not divisible by the world size {self.size}")

    def _slice(self, t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0] // self.size
        return t[self.rank * n:(self.rank + 1) * n]

    def local(self, batch: Batch) -> Batch:
        """This rank's contiguous slice of a global batch (and of the batches it shows ahead)."""
        if self.size == 1:
            return batch
        return dataclasses.replace(batch, dense=self._slice(batch.dense), ids=self._slice(batch.ids),
                                   labels=self._slice(batch.labels),
                                   upcoming=[self._slice(u) for u in batch.upcoming])

    def sync_dense(self, model: nn.Module, timer: Any) -> None:
        """Average the dense gradients over ranks (one counted all-reduce); one process: nothing."""
        if self.size == 1:
            return
        timer.mark("dense_fwd_bwd")
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.comm.all_reduce(flat, None, "dense_allreduce").wait()
        flat /= self.size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        timer.mark("dense_allreduce")

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
