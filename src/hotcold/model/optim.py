"""The dense layers' optimizers: SGD and Adagrad, the same arithmetic as ``torch.optim``'s, in a few kernels.

``torch.optim``'s optimizers import ``torch._dynamo`` when built (about a
second per process here, several when ranks share the cores); every training
job builds one, and a run over P ranks P + 1. These two are the same
element-wise operations as ``torch.optim.SGD`` and ``torch.optim.Adagrad``
(no momentum, decay or initial accumulator), applied to every parameter at
once by torch's multi-tensor (``_foreach``) operations: on a GPU one launch
per operation for all the parameters (a DLRM's 14 tensors took 56 kernels a
step with Adagrad one tensor at a time, now 4); on a CPU each operation runs
tensor by tensor, the single-tensor kernels' bits. Tested bit for bit
against ``torch.optim``.
"""
from __future__ import annotations

from typing import Iterable

import torch


class DenseOptimizer:
    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Update every parameter that has a gradient."""
        which = [i for i, p in enumerate(self.params) if p.grad is not None]
        if which:
            self.update(which, [self.params[i] for i in which], [self.params[i].grad for i in which])

    def update(self, which: list[int], params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """One step of ``params`` (those of ``self.params`` at ``which``) with their ``grads``."""
        raise NotImplementedError


class DenseSGD(DenseOptimizer):
    def update(self, which: list[int], params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        torch._foreach_add_(params, grads, alpha=-self.lr)


class DenseAdagrad(DenseOptimizer):
    def __init__(self, params: Iterable[torch.Tensor], lr: float, eps: float) -> None:
        super().__init__(params, lr)
        self.eps = eps
        self.state_sum = [torch.zeros_like(p) for p in self.params]

    def update(self, which: list[int], params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        state = self.state_sum if len(which) == len(self.params) else [self.state_sum[i] for i in which]
        torch._foreach_addcmul_(state, grads, grads, value=1)
        std = torch._foreach_sqrt(state)
        torch._foreach_add_(std, self.eps)
        torch._foreach_addcdiv_(params, grads, std, value=-self.lr)
