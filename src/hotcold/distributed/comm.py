"""The one wrapper every collective of a training run goes through, counting its bytes.

``Comm`` knows its rank, the world and the topology, and books each
collective's bytes (what this rank sends, per destination) in a ``Ledger``.
With one rank it needs no process group: an all-to-all returns its input and
an all-reduce does nothing, so the sharded stores run (and are tested) in a
single process too.

Gloo (CPU) and NCCL (GPU) both take ``all_to_all_single`` with uneven
splits; the sizes are exchanged first, as the list form of all-to-all with
uneven tensors does not work on gloo.

What a float collective sends is the run's ``Wire`` (``use_wire``): a
caller asks for it with ``on_wire=True``, and ``Comm`` rounds the tensor to
the wire's type before sending and counts the bytes of what it sent.

``host``: the collectives run on gloo over CPU tensors while the trainer is
on a GPU (``distributed.backend: gloo``, so that ranks may share one GPU):
each collective copies what it sends to the host and its result back to the
trainer's device (in place for an all-reduce, at ``wait()`` when
asynchronous). The bytes counted are the same: the copies are not the
model's traffic.
"""
from __future__ import annotations

import datetime
import math
import os
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from hotcold.config import ELEMENT_BYTES, Wire
from hotcold.distributed.topology import Topology
from hotcold.distributed.traffic import (ID_BYTES, SPLIT_BYTES, Ledger, a2a_matrix, ring_allgather_matrix,
                                         ring_allreduce_matrix, ring_reducescatter_matrix)

TIMEOUT_S = 300  # a rank that stops answering fails the others after this long
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
assert all(torch.empty(0, dtype=t).element_size() == ELEMENT_BYTES[n] for n, t in TORCH_DTYPES.items())


class Pending:
    """An asynchronous collective: ``wait()`` returns its result; ``name``: the counted collective it is."""

    def __init__(self, work: Any, result: torch.Tensor, name: str | None = None,
                 finish: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self._work, self._result, self.name = work, result, name
        self._finish = finish  # what turns the received tensor into the result (a host transport's copy back)

    def done(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._finish is not None:
            self._result, self._finish = self._finish(self._result), None
        return self._result


class Comm:
    """Counted collectives of one rank (see the module docstring)."""

    def __init__(self, topology: Topology, rank: int = 0, device: torch.device | None = None,
                 host: bool = False) -> None:
        self.topology = topology
        self.rank = rank
        self.world = topology.world
        self.device = device or torch.device("cpu")
        self.host = host and self.device.type != "cpu"  # gloo over CPU copies of a GPU trainer's tensors
        self.collective_device = torch.device("cpu") if self.host else self.device  # where collectives' tensors live
        self.ledger = Ledger(topology)
        self.wire = Wire()
        self._groups: dict[tuple[int, ...], Any] = {}
        self._flying: list[Pending] = []  # asynchronous collectives issued and perhaps not yet done
        if self.world > 1:
            if not dist.is_initialized():
                raise RuntimeError("a Comm over several ranks needs an initialised process group")
            # Every rank creates every replica group, in the same order (torch.distributed requires it).
            for local in range(topology.ranks_per_node):
                members = tuple(topology.cross_node_group(local))
                if 1 < len(members) < self.world:
                    self._groups[members] = dist.new_group(list(members))

    # -- counting -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a fresh ledger (a new run on the same process group)."""
        self.ledger = Ledger(self.topology)

    def use_wire(self, wire: Wire) -> None:
        """What the ``on_wire`` collectives of the next run send (every rank must pass the same)."""
        self.wire = wire

    def vector_dtype(self) -> torch.dtype:
        """The all-to-alls' float type on the wire."""
        return TORCH_DTYPES[self.wire.vector_dtype]

    def reduce_dtype(self) -> torch.dtype:
        """The all-reduces' float type on the wire (float64 in exact mode)."""
        return TORCH_DTYPES[self.wire.reduce_dtype]

    def _book(self, collective: str, matrix: np.ndarray) -> None:
        own = np.zeros_like(matrix)
        own[self.rank] = matrix[self.rank]
        self.ledger.add(collective, own)

    # -- all-to-all ---------------------------------------------------------------------------
    def exchange_counts(self, send_counts: np.ndarray, collective: str | None) -> np.ndarray:
        """Each rank's count for every other rank -> int64 [P] counts this rank receives (None: not counted)."""
        if self.world == 1:
            return np.asarray(send_counts, dtype=np.int64).copy()
        out = torch.empty(self.world, dtype=torch.int64, device=self.collective_device)
        dist.all_to_all_single(out, torch.as_tensor(np.asarray(send_counts), dtype=torch.int64)
                               .to(self.collective_device))
        if collective is not None:
            self._book(collective, a2a_matrix(self.rank, np.full(self.world, SPLIT_BYTES), self.world))
        return out.cpu().numpy()

    def all_to_all(self, data: torch.Tensor, send_counts: np.ndarray, recv_counts: np.ndarray,
                   collective: str | None, async_op: bool = False, on_wire: bool = False) -> Pending:
        """Send ``data`` [sum(send_counts), ...] in per-rank blocks; receive [sum(recv_counts), ...].

        ``collective`` None: not counted (evaluation, export). ``on_wire``: float
        vectors, sent in the wire's vector type (the result stays in that type).
        """
        if on_wire:
            data = data.to(self.vector_dtype())
        item = math.prod(data.shape[1:]) * data.element_size()  # bytes of one row of ``data``
        if collective is not None:
            self._book(collective, a2a_matrix(self.rank, np.asarray(send_counts, dtype=np.int64) * item, self.world))
        if self.world == 1:
            return Pending(None, data)
        send = self._send(data)
        out = torch.empty((int(np.sum(recv_counts)), *data.shape[1:]), dtype=data.dtype, device=send.device)
        work = dist.all_to_all_single(out, send, [int(c) for c in recv_counts],
                                      [int(c) for c in send_counts], async_op=async_op)
        pending = Pending(work if async_op else None, out, collective, self._back(data.device))
        return self._issued(pending if async_op else Pending(None, pending.wait(), collective))

    # -- all-reduce ----------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, group: Sequence[int] | None, collective: str | None,
                   async_op: bool = False, on_wire: bool = False) -> Pending:
        """Sum ``tensor`` in place over ``group`` (None: every rank).

        ``on_wire``: sent and summed in the wire's reduce type (float64 in exact
        mode), a copy when that differs from ``tensor``'s: the result is in that type.
        """
        if on_wire:
            tensor = tensor.to(self.reduce_dtype())
        members = tuple(range(self.world)) if group is None else tuple(sorted(group))
        if collective is not None:
            nbytes = tensor.numel() * tensor.element_size()
            self._book(collective, ring_allreduce_matrix(members, nbytes, self.world))
        if len(members) < 2:
            return Pending(None, tensor)
        pg = None if len(members) == self.world else self._groups[members]
        sent = self._send(tensor)
        work = dist.all_reduce(sent, group=pg, async_op=async_op)
        into = None if sent is tensor else (lambda got: tensor.copy_(got))  # the host copy's sum, back in place
        pending = Pending(work if async_op else None, sent, collective, into)
        return self._issued(pending if async_op else Pending(None, pending.wait(), collective))

    # -- reduce-scatter and all-gather of equal blocks (the row-wise reduce-scatter protocol) ----------------
    def reduce_scatter(self, tensor: torch.Tensor, collective: str | None, on_wire: bool = False) -> torch.Tensor:
        """``tensor`` [P * n, ...] summed over every rank; this rank keeps block ``rank`` [n, ...].

        ``on_wire``: sent and summed in the wire's reduce type (float64 in exact mode): the result is in that
        type. Counted as the ring reduce-scatter (``ring_reducescatter_matrix``); gloo and NCCL both run
        ``reduce_scatter_tensor``.
        """
        if on_wire:
            tensor = tensor.to(self.reduce_dtype())
        if tensor.shape[0] % self.world:
            raise ValueError(f"a reduce-scatter of {tensor.shape[0]} rows does not split over {self.world} ranks")
        n = tensor.shape[0] // self.world
        if collective is not None:
            block = n * math.prod(tensor.shape[1:]) * tensor.element_size()
            self._book(collective, ring_reducescatter_matrix(range(self.world), [block] * self.world, self.world))
        if self.world == 1:
            return tensor
        send = self._send(tensor)
        out = torch.empty((n, *tensor.shape[1:]), dtype=tensor.dtype, device=send.device)
        dist.reduce_scatter_tensor(out, send)
        return out.to(tensor.device)

    def all_gather(self, tensor: torch.Tensor, collective: str | None, on_wire: bool = False) -> torch.Tensor:
        """Every rank's ``tensor`` [n, ...] (the same shape on all), stacked in rank order: [P * n, ...].

        ``on_wire``: sent in the wire's vector type (it moves values, as an all-to-all: float32 in exact mode),
        and comes back in it. Counted as the ring all-gather (``ring_allgather_matrix``).
        """
        if on_wire:
            tensor = tensor.to(self.vector_dtype())
        if collective is not None:
            block = tensor.numel() * tensor.element_size()
            self._book(collective, ring_allgather_matrix(range(self.world), [block] * self.world, self.world))
        if self.world == 1:
            return tensor
        send = self._send(tensor)
        out = torch.empty((self.world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=send.device)
        dist.all_gather_into_tensor(out, send)
        return out.to(tensor.device)

    # -- what is in flight ------------------------------------------------------------------------
    def _issued(self, pending: Pending) -> Pending:
        if not pending.done():
            self._flying.append(pending)
        return pending

    def in_flight(self) -> list[str]:
        """The collectives issued asynchronously and not yet done, oldest first (their names; "" uncounted)."""
        self._flying = [p for p in self._flying if not p.done()]
        return [p.name or "" for p in self._flying]

    # -- all-gather (replica synchronisation, ``replica_sync``) ----------------------------------------
    def all_gather_counts(self, count: int, group: Sequence[int] | None, collective: str | None) -> np.ndarray:
        """int64 [g]: every member's ``count``, in ascending rank order (a ring all-gather of one integer each)."""
        members = tuple(range(self.world)) if group is None else tuple(sorted(group))
        if collective is not None:
            self._book(collective, ring_allgather_matrix(members, [SPLIT_BYTES] * len(members), self.world))
        if len(members) < 2:
            return np.array([count], dtype=np.int64)
        out = [torch.zeros(1, dtype=torch.int64, device=self.collective_device) for _ in members]
        dist.all_gather(out, torch.tensor([count], dtype=torch.int64, device=self.collective_device),
                        group=self._group(members))
        return torch.cat(out).cpu().numpy()

    def all_gather_rows(self, ids: torch.Tensor, values: torch.Tensor, counts: np.ndarray,
                        group: Sequence[int] | None, collective: str | None,
                        on_wire: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every member's (ids [t_i], values [t_i, ...]), in ascending rank order; ``counts`` [g]: every t_i.

        ``on_wire``: the values are sent in the wire's reduce type (they stand in for an all-reduce; float64 in
        exact mode) and come back in that type.

        Counted as the ring all-gather of the blocks (``ring_allgather_matrix``); the transfer pads each block
        to the largest, as torch's all-gather takes equal blocks (the algorithm's bytes, as for the all-reduce).
        """
        if on_wire:
            values = values.to(self.reduce_dtype())
        members = tuple(range(self.world)) if group is None else tuple(sorted(group))
        row = ids.element_size() + math.prod(values.shape[1:]) * values.element_size()
        if collective is not None:
            self._book(collective, ring_allgather_matrix(members, np.asarray(counts, dtype=np.int64) * row,
                                                         self.world))
        if len(members) < 2:
            return [(ids, values)]
        top = int(np.max(counts))
        pg = self._group(members)
        where = self.collective_device if self.host else ids.device
        pad_ids = torch.zeros(top, dtype=ids.dtype, device=where)
        pad_ids[:ids.shape[0]] = ids
        pad_values = torch.zeros((top, *values.shape[1:]), dtype=values.dtype, device=where)
        pad_values[:values.shape[0]] = values
        got_ids = [torch.empty_like(pad_ids) for _ in members]
        got_values = [torch.empty_like(pad_values) for _ in members]
        dist.all_gather(got_ids, pad_ids, group=pg)
        dist.all_gather(got_values, pad_values, group=pg)
        return [(i[:int(c)].to(ids.device), v[:int(c)].to(values.device))
                for i, v, c in zip(got_ids, got_values, counts)]

    # -- the host transport (``host``) ------------------------------------------------------------------
    def _send(self, tensor: torch.Tensor) -> torch.Tensor:
        """What a collective sends: ``tensor`` contiguous, on the host with the host transport."""
        return tensor.to(self.collective_device).contiguous() if self.host else tensor.contiguous()

    def _back(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """How a received tensor returns to ``device`` (None: it is already there)."""
        return (lambda got: got.to(device)) if self.host else None

    def _group(self, members: tuple[int, ...]) -> Any:
        return None if len(members) == self.world else self._groups[members]

    # -- uncounted helpers ------------------------------------------------------------------------
    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (not counted: bookkeeping)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def ids_tensor(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(device)


def launched() -> bool:
    """Whether this process is one rank of a torchrun launch."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_process_group(device: torch.device, timeout_s: float = TIMEOUT_S,
                       backend: str = "auto") -> tuple[int, int, torch.device]:
    """Join the launch's process group over ``backend`` (``distributed.backend``: auto is NCCL on GPUs, gloo on
    CPUs); a collective waits ``timeout_s`` for the others. Returns (rank, world, this rank's device): over NCCL
    a GPU of its own (more ranks on this machine than GPUs: ``ConfigError``), over gloo GPUs shared round robin."""
    from hotcold.devices import check_ranks_fit, gpu_count, local_ranks, rank_gpu, resolve_backend

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = resolve_backend(backend, device.type)
    if device.type == "cuda":
        gpus = gpu_count()
        check_ranks_fit(local_ranks(), "cuda", backend, gpus, "distributed.backend")
        device = torch.device("cuda", rank_gpu(int(os.environ.get("LOCAL_RANK", rank)), gpus, backend))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return rank, world, device


__all__ = ["Comm", "Pending", "ID_BYTES", "ids_tensor", "init_process_group", "launched"]
