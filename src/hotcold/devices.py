"""Devices, chosen where the job runs: the trainer's (``resolve_device``, once per job), and each rank's with
its collectives' backend and threads.

The trainer device is named one way (``accel.normal_device``): ``cuda`` is made ``cuda:<index>``.

``distributed.backend`` picks the collectives' backend: ``nccl`` (GPU
tensors, one GPU per rank: NCCL refuses two ranks on one GPU), ``gloo``
(CPU tensors: on a CUDA trainer ``Comm`` moves what it sends to the host and
back, so several ranks may share one GPU, at a cost no GPU cluster pays) or
``auto`` (NCCL on a CUDA trainer, gloo on the CPU). A run whose ranks on one
machine outnumber its GPUs over NCCL fails before it starts, with one line
naming the world, the GPU count and the options to change
(``check_ranks_fit``): at the workflow's dry run (``Matrix.check``), at
``hotcold train --nproc`` and in each rank.

Everything here takes the GPU count as an argument, so it is tested on a CPU.

Torch is imported only by the functions that name a device: the workflow plans with the rest.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from hotcold.config import BACKENDS, ConfigError

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` is the GPU when there is one (``cuda:<index>``); asking for ``cuda`` without one fails clearly."""
    import torch

    from hotcold.accel import normal_device

    if name == "auto":
        return normal_device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("timing.device is 'cuda' but torch sees no GPU (use 'auto' or 'cpu')")
    return normal_device(name)  # cuda: cuda:<current index>, one name per GPU


def gpu_count() -> int:
    """The GPUs this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend: str, device_type: str) -> str:
    """``nccl`` or ``gloo``: ``auto`` is NCCL on a CUDA trainer, gloo on the CPU; NCCL on a CPU trainer is an error."""
    if backend not in BACKENDS:
        raise ConfigError(f"distributed.backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise ConfigError(f"distributed.backend nccl needs timing.device cuda (the trainer is on {device_type}); "
                          f"use gloo or auto")
    return backend


def ranks_fit_problem(ranks: int, device_type: str, backend: str, gpus: int) -> str | None:
    """Why ``ranks`` ranks on one machine with ``gpus`` GPUs cannot train there (None: they can).

    Over NCCL every rank needs a GPU of its own; gloo (or a CPU trainer) shares whatever there is.
    """
    if ranks <= 1 or resolve_backend(backend, device_type) != "nccl" or ranks <= gpus:
        return None
    fewer = (f"lower distributed.scales world to {gpus} or fewer" if gpus > 1
             else "train no scale-out scale here (distributed.scales: [])")
    return (f"world {ranks} needs {ranks} GPUs over NCCL (one per rank), but this machine has {gpus}: "
            f"{fewer}, set distributed.backend: gloo (collectives over CPU tensors, ranks share a GPU), "
            f"or timing.device: cpu")


def check_ranks_fit(ranks: int, device_type: str, backend: str, gpus: int, where: str) -> None:
    """``ConfigError("<where>: ...")`` when ``ranks_fit_problem`` finds one."""
    problem = ranks_fit_problem(ranks, device_type, backend, gpus)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")


def local_ranks(env: Mapping[str, str] | None = None) -> int:
    """The ranks of this launch on this machine (torchrun's ``LOCAL_WORLD_SIZE``; else the whole world; 1 alone)."""
    env = os.environ if env is None else env
    return int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1)))


def rank_gpu(local_rank: int, gpus: int, backend: str) -> int:
    """The GPU index of the rank ``local_rank`` of this machine: its own over NCCL (``check_ranks_fit`` holds),
    shared round robin over gloo."""
    if gpus < 1:
        raise ConfigError("timing.device cuda: this machine has no GPU")
    if backend == "nccl" and local_rank >= gpus:
        raise ConfigError(f"local rank {local_rank} has no GPU of its own over NCCL ({gpus} GPU(s))")
    return local_rank % gpus


def threads_per_rank(threads: int, env: Mapping[str, str] | None = None) -> int:
    """Each rank's share of the job's ``threads``: divided by the ranks on this machine (not the whole world)."""
    return max(1, threads // max(1, local_ranks(env)))


__all__ = ["BACKENDS", "check_ranks_fit", "gpu_count", "local_ranks", "rank_gpu", "ranks_fit_problem",
           "resolve_backend", "threads_per_rank"]
