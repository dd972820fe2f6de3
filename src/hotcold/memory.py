"""Whether a run's tables fit this machine, decided before anything is allocated.

A store states what it will allocate for its rows (``EmbeddingStore.memory_need``:
bytes on the host and on the trainer device); ``require_memory`` compares that
with what the machine has and raises ``InfeasibleError`` naming both, so the
run ends as an ``infeasible`` record instead of being killed by the kernel or
by a CUDA out-of-memory error after minutes of set-up.

What the machine has:

- host: the kernel's ``MemAvailable`` (or the cgroup limit's room, where
  lower; ``machine.host_memory``) less a reserve of ``HOST_RESERVE`` of the
  RAM, kept for the run's bounded overhead (the interpreter and torch, the
  dense model, batches, the dataset's mapped pages) and for other processes;
- a CUDA device: the free memory ``torch.cuda.mem_get_info`` reports, less
  ``DEVICE_RESERVE`` of the device's memory (the CUDA context, activations,
  the allocator's slack).

``HOTCOLD_HOST_MEMORY`` and ``HOTCOLD_DEVICE_MEMORY`` replace those with a
budget of their own (bytes, or a number with a K/M/G/T suffix, powers of
1024), with no reserve taken off: to plan for a smaller machine, or to test.
"""
from __future__ import annotations

import os
import re
from typing import Callable

import torch

from hotcold import machine
from hotcold.config import ConfigError, InfeasibleError
from hotcold.embedding.base import MemoryNeed

HOST_ENV = "HOTCOLD_HOST_MEMORY"
DEVICE_ENV = "HOTCOLD_DEVICE_MEMORY"
#: share of the RAM (of the device's memory) kept free beside the tables
HOST_RESERVE = 0.10
DEVICE_RESERVE = 0.10
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str, where: str) -> int:
    """``"12345"``, ``"512M"``, ``"1.5G"``... -> bytes; a bad value fails naming ``where``."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ConfigError(f"{where}: expected bytes such as 8589934592 or 8G, got {text!r}")
    return int(float(m.group(1)) * _SUFFIX[m.group(2).upper()])


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def host_budget() -> tuple[int | None, str]:
    """Bytes of RAM a run may fill with its tables, and how that was found; None where unknown."""
    if os.environ.get(HOST_ENV, "").strip():
        return parse_bytes(os.environ[HOST_ENV], HOST_ENV), f"${HOST_ENV}"
    avail, total, source = machine.host_memory()
    if avail is None:
        return None, source
    reserve = int(HOST_RESERVE * (total or avail))
    return max(0, avail - reserve), f"{source} {gib(avail)} less a {HOST_RESERVE:.0%} reserve of {gib(total or avail)}"


def device_budget(device: torch.device) -> tuple[int | None, str]:
    """Bytes of a CUDA device's memory a run may fill with its tables, and how that was found."""
    if os.environ.get(DEVICE_ENV, "").strip():
        return parse_bytes(os.environ[DEVICE_ENV], DEVICE_ENV), f"${DEVICE_ENV}"
    free, total, source = machine.device_memory(device)
    return (max(0, free - int(DEVICE_RESERVE * total)),
            f"{source} free {gib(free)} less a {DEVICE_RESERVE:.0%} reserve of {gib(total)}")


def shortfall(need: MemoryNeed, device: torch.device, what: str,
              host: Callable[[], tuple[int | None, str]] = host_budget,
              dev: Callable[[torch.device], tuple[int | None, str]] = device_budget) -> str | None:
    """Why ``need`` does not fit this machine (one line naming the bytes needed and available); None if it does."""
    budget, source = host()
    if budget is not None and need.host > budget:
        return (f"{what} needs {need.host} bytes ({gib(need.host)}) of host memory, more than the {budget} "
                f"bytes ({gib(budget)}) available ({source})")
    if device.type == "cuda" and need.device:
        budget, source = dev(device)
        if budget is not None and need.device > budget:
            return (f"{what} needs {need.device} bytes ({gib(need.device)}) of {device} memory, more than the "
                    f"{budget} bytes ({gib(budget)}) available ({source})")
    return None


def require_memory(need: MemoryNeed, device: torch.device, what: str) -> None:
    """Raise ``InfeasibleError`` when ``need`` does not fit this machine (``shortfall``)."""
    reason = shortfall(need, device, what)
    if reason is not None:
        raise InfeasibleError(reason)
