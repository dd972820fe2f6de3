"""Counting the operations a piece of training dispatches: what a GPU launches one kernel each for.

``OpCount`` is a torch dispatch mode: inside it, every aten operation this
thread dispatches is counted by name, views (no kernel) apart, and so is
each run of the harness's own compiled kernels, which no dispatch sees
(``embedding.fused.watching``). ``hotcold bench step`` counts a training
step with it, ``hotcold calibrate`` the dense step it times.
"""
from __future__ import annotations

import collections

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
