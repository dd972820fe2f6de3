"""Counting the operations a piece of training dispatches: what a GPU launches one kernel each for.

``OpCount`` is a torch dispatch mode: inside it, every aten operation this
thread dispatches is counted by name, views (no kernel) apart, and so is
each run of the harness's own compiled kernels, which no dispatch sees
(``embedding.fused.watching``). ``hotcold bench step`` counts a training
step with it, ``hotcold calibrate`` the dense step it times.

It also keeps the time spent inside operations whose result is a ``meta``
tensor: on meta a step's device side has no values, but torch computes its
shapes in Python, at up to a millisecond an operation (a GPU would only
launch it). ``host_clock`` is the wall clock less that time: a step timed
by it on meta costs the host what a GPU step costs it, each device
operation charged the dispatch that reached it.
"""
from __future__ import annotations

import collections
import time

from torch.utils._python_dispatch import TorchDispatchMode

from hotcold.embedding import fused


class OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched on this thread inside it, views (no kernel) apart, and the
    harness's own compiled kernels (``fused.watching``: one operation each)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.views = 0
        self.meta_ns = 0  # time inside operations that made a meta tensor
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
        t0 = time.perf_counter_ns()
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if getattr(first, "device", None) is not None and first.device.type == "meta":
            self.meta_ns += time.perf_counter_ns() - t0
        return out

    def host_clock(self) -> int:
        """``perf_counter_ns`` less the time inside operations that made meta tensors (see the module)."""
        return time.perf_counter_ns() - self.meta_ns

    @property
    def total(self) -> int:
        """Operations that are not views."""
        return sum(self.ops.values())
