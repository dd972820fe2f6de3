"""The dense optimizers are torch.optim's arithmetic, bit for bit."""
from __future__ import annotations

import pytest
import torch

from hotcold.model.optim import DenseAdagrad, DenseSGD


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_dense_optimizers_match_torch_optim(kind):
    gen = torch.Generator().manual_seed(0)
    ours = [torch.randn(7, 3, generator=gen).requires_grad_(), torch.randn(5, generator=gen).requires_grad_()]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    if kind == "sgd":
        a, b = DenseSGD(ours, lr=0.05), torch.optim.SGD(theirs, lr=0.05)
    else:
        a, b = DenseAdagrad(ours, lr=0.05, eps=1e-8), torch.optim.Adagrad(theirs, lr=0.05, eps=1e-8)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in ours]
        for params, opt in ((ours, a), (theirs, b)):
            opt.zero_grad(set_to_none=True)
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for x, y in zip(ours, theirs):
        assert torch.equal(x, y)
