"""Counting the operations a piece of training dispatches: what a GPU launches one kernel each for.

``OpCount`` is a torch dispatch mode: inside it, every aten operation this
thread dispatches is counted by name, views (no kernel) apart, and so is
each run of the harness's own compiled kernels, which no dispatch sees
(``embedding.fused.watching``). ``hotcold bench step`` counts a training
step with it, ``hotcold calibrate`` the dense step it times.

``HostClock`` times what the host itself does in a step whose device side
runs on ``meta`` tensors: meta has no values, so a device operation costs
nothing there but the computation of its result's shape, which torch does
in Python for many operations (up to a millisecond each, where a GPU launch
costs microseconds). It reads the thread's CPU time, not the wall clock:
on a shared machine a thread's wall time also holds the waits for a core
and for the interpreter's lock, which swing by more than the work.
"""
from __future__ import annotations

import collections
import time

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hotcold.embedding import fused


class OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched on this thread inside it, views (no kernel) apart, and the
    harness's own compiled kernels (``fused.watching``: one operation each)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.views = 0
        self._watch = fused.watching(self._kernel)

    def _kernel(self, name: str) -> None:
        self.ops[name] += 1

    def __enter__(self):
        self._watch.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._watch.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            self.views += 1
        else:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operations that are not views."""
        return sum(self.ops.values())


class HostClock(TorchFunctionMode):
    """Inside: this thread's CPU time (``clock``), stopped in every torch call that returns a meta tensor and in
    the mode's own handling of every torch call on this thread; ``device_calls`` counts the former.

    A torch function mode sees each call the code makes (not the operations
    torch runs inside them) for a few microseconds each: ``overhead_ns``,
    measured once per process by timing calls with and without this mode.
    """

    def __init__(self, overhead_ns: int | None = None) -> None:
        super().__init__()
        self.meta_ns = 0
        self.calls = 0
        self.device_calls = 0
        self.overhead_ns = _overhead_ns() if overhead_ns is None else overhead_ns

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        t0 = time.thread_time_ns()
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if isinstance(first, torch.Tensor) and first.device.type == "meta":
            self.meta_ns += time.thread_time_ns() - t0
            self.device_calls += 1
        return out

    def clock(self) -> int:
        """This thread's CPU time less the time in calls that made meta tensors and the mode's own."""
        return time.thread_time_ns() - self.meta_ns - self.calls * self.overhead_ns


_OVERHEAD: list[int] = []


def _overhead_ns(calls: int = 20_000) -> int:
    """What ``HostClock`` adds to a torch call on this machine: the median of 5 rounds of ``calls`` calls with
    and without it (the first time it is asked; then kept)."""
    if not _OVERHEAD:
        x = torch.zeros(1)

        def per_call() -> float:
            t0 = time.thread_time_ns()
            for _ in range(calls):
                x.neg()
            return (time.thread_time_ns() - t0) / calls

        rounds = []
        for _ in range(5):
            plain = per_call()
            with HostClock(overhead_ns=0):
                moded = per_call()
            rounds.append(moded - plain)
        _OVERHEAD.append(max(0, int(sorted(rounds)[2])))
    return _OVERHEAD[0]
