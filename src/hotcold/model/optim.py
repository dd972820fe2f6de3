"""The dense layers' optimizers: SGD and Adagrad, the same arithmetic as ``torch.optim``'s.

``torch.optim``'s optimizers import ``torch._dynamo`` when built (about a
second per process here, several when ranks share the cores); every training
job builds one, and a run over P ranks P + 1. These two are the same
element-wise operations as the single-tensor paths of ``torch.optim.SGD`` and
``torch.optim.Adagrad`` (no momentum, decay or initial accumulator), tested
bit for bit against them.
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
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self.update(i, p, p.grad)

    def update(self, i: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        raise NotImplementedError


class DenseSGD(DenseOptimizer):
    def update(self, i: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        param.add_(grad, alpha=-self.lr)


class DenseAdagrad(DenseOptimizer):
    def __init__(self, params: Iterable[torch.Tensor], lr: float, eps: float) -> None:
        super().__init__(params, lr)
        self.eps = eps
        self.state_sum = [torch.zeros_like(p) for p in self.params]

    def update(self, i: int, param: torch.Tensor, grad: torch.Tensor) -> None:
        state = self.state_sum[i]
        state.addcmul_(grad, grad, value=1)
        param.addcdiv_(grad, state.sqrt().add_(self.eps), value=-self.lr)
