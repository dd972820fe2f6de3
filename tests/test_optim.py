"""The optimizers: the dense ones are torch.optim's arithmetic, bit for bit; the embedding rows' shared
pieces (grouping a batch's lookups by row, their gradient sums, the row update, fused or not)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from hotcold.embedding import fused, update
from hotcold.embedding.rows import RowGroups, group_rows, sum_by_index
from hotcold.jit import python
from hotcold.embedding.update import RowOptimizer
from hotcold.model.optim import DenseAdagrad, DenseSGD


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_dense_optimizers_match_torch_optim(kind, foreach):
    """The multi-tensor step has the bits of torch.optim's, one tensor at a time or multi-tensor; a parameter
    without a gradient is left alone."""
    gen = torch.Generator().manual_seed(0)
    ours = [torch.randn(7, 3, generator=gen).requires_grad_(), torch.randn(5, generator=gen).requires_grad_(),
            torch.randn(4, generator=gen).requires_grad_()]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    if kind == "sgd":
        a, b = DenseSGD(ours, lr=0.05), torch.optim.SGD(theirs, lr=0.05, foreach=foreach)
    else:
        a, b = DenseAdagrad(ours, lr=0.05, eps=1e-8), torch.optim.Adagrad(theirs, lr=0.05, eps=1e-8, foreach=foreach)
    for step in range(5):
        grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in ours]
        for params, opt in ((ours, a), (theirs, b)):
            opt.zero_grad(set_to_none=True)
            for i, (p, g) in enumerate(zip(params, grads)):
                if not (i == 1 and step % 2):  # the second parameter has no gradient every other step
                    p.grad = g.clone()
            opt.step()
    for x, y in zip(ours, theirs):
        assert torch.equal(x, y)


# -- the embedding rows' shared pieces: grouping, gradient sums, the row update ---------------------------------

@pytest.mark.parametrize("high", [50, 2**40])  # int32 sort keys, and rows past int32
def test_row_groups_match_torch_unique(high):
    rows = torch.randint(0, high, (3000,), generator=torch.Generator().manual_seed(1))
    rows[::7] = rows[0]                                   # one heavy row
    g = RowGroups.of(rows)
    uniq, inverse, counts = torch.unique(rows, return_inverse=True, return_counts=True)
    assert torch.equal(g.rows, uniq) and torch.equal(g.inverse(), inverse) and torch.equal(g.counts, counts)
    assert torch.equal(rows[g.order], torch.repeat_interleave(uniq, counts))          # grouped by row...
    for u in range(0, g.size, max(1, g.size // 20)):                                  # ...in batch order
        mine = g.order[g.offsets[u]:g.offsets[u + 1]]
        assert torch.equal(mine, (rows == uniq[u]).nonzero().squeeze(1))


@pytest.mark.parametrize("high", [1, 50, 2**21, 2**31 - 1])
def test_radix_grouping_is_a_stable_sort(high):
    """``group_rows`` (compiled, and its plain-Python body) groups as torch's stable sort does."""
    rows = torch.randint(0, high, (5000,), generator=torch.Generator().manual_seed(high % 1000))
    rows[::9] = rows[1]  # a heavy row
    ordered, order = torch.sort(rows, stable=True)
    uniq, counts = torch.unique_consecutive(ordered, return_counts=True)
    for kernel in (group_rows, python(group_rows)):
        got_order, got_uniq, got_offsets = kernel(rows.numpy())
        assert np.array_equal(got_order, order.numpy()) and np.array_equal(got_uniq, uniq.numpy())
        assert np.array_equal(np.diff(got_offsets), counts.numpy()) and got_offsets[0] == 0


def test_row_groups_of_no_rows():
    g = RowGroups.of(torch.zeros(0, dtype=torch.int64))
    assert g.size == 0 and g.inverse().numel() == 0
    assert sum_by_index(g, torch.zeros(0, 4)).shape == (0, 4)


def _reference_sums(rows: torch.Tensor, grads: torch.Tensor) -> dict[int, np.ndarray]:
    """Each row's gradients added one by one in batch order, in float64."""
    out: dict[int, np.ndarray] = {}
    for r, g in zip(rows.tolist(), grads.double().numpy()):
        out[r] = out.get(r, 0.0) + g
    return out


@pytest.mark.parametrize("exact", [False, True])
def test_sum_by_index_sums_each_rows_gradients(exact):
    gen = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 300, (4000,), generator=gen)
    grads = torch.randn(4000, 5, generator=gen)
    g = RowGroups.of(rows)
    summed = sum_by_index(g, grads, exact=exact)
    ref = _reference_sums(rows, grads)
    expect = torch.from_numpy(np.stack([ref[r] for r in g.rows.tolist()]))
    assert summed.dtype == (torch.float64 if exact else torch.float32)
    if exact:  # float64 sums in batch order, as the reference adds them
        assert torch.equal(summed, expect)
    else:
        assert torch.allclose(summed.double(), expect, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="gradients for"):
        sum_by_index(g, grads[:-1])


def test_sum_by_index_does_not_depend_on_threads():
    gen = torch.Generator().manual_seed(3)
    rows = (torch.rand(60_000, generator=gen) ** 4 * 5000).long()  # skewed: long groups
    grads = torch.randn(60_000, 16, generator=gen)
    g = RowGroups.of(rows)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sum_by_index(g, grads)
        torch.set_num_threads(2)
        two = [sum_by_index(g, grads) for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(one, t) for t in two)


def _step_case(kind: str, fused: bool, width: int = 8):
    """Three batches of 400 lookups of 123 rows through ``RowOptimizer.step``."""
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(500, width, generator=gen)
    state = torch.rand(500, width, generator=gen) if kind == "elementwise-adagrad" else torch.rand(500, generator=gen)
    opt = RowOptimizer(kind, 0.1, fused=fused)
    batches = []
    for _ in range(3):
        rows = torch.randperm(500, generator=gen)[:123][torch.randint(0, 123, (400,), generator=gen)]
        batches.append((rows, torch.randn(400, width, generator=gen)))
    for rows, grads in batches:
        groups = RowGroups.of(rows)
        opt.step(weight, state, groups.rows, groups, grads)
    return weight, state, opt, batches


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "elementwise-adagrad"])
def test_step_is_the_documented_formula(kind):
    """Each distinct row: g = the sum of its gradients; row-wise Adagrad acc += mean(g^2), w -= lr g / (sqrt(acc) +
    eps); per element acc += g^2 and the same division element by element."""
    weight, state, _, batches = _step_case(kind, fused=False)
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(500, 8, generator=gen).double()
    s = (torch.rand(500, 8, generator=gen) if kind == "elementwise-adagrad" else torch.rand(500, generator=gen)).double()
    for rows, grads in batches:
        sums = _reference_sums(rows, grads)
        slots = torch.tensor(sorted(sums))
        g = torch.from_numpy(np.stack([sums[r] for r in slots.tolist()]))
        if kind == "adagrad":
            s[slots] += (g ** 2).mean(dim=1)
            g = g / (s[slots].sqrt() + 1e-8)[:, None]
        elif kind == "elementwise-adagrad":
            s[slots] += g ** 2
            g = g / (s[slots].sqrt() + 1e-8)
        w[slots] -= 0.1 * g
    assert torch.allclose(weight.double(), w, rtol=0, atol=1e-5)
    assert torch.allclose(state.double(), s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "elementwise-adagrad"])
@pytest.mark.parametrize("width", [16, 7, 1])
def test_fused_step_has_the_torch_compositions_bits(kind, width):
    """The one-kernel step (CPU) and the torch operations it replaces: the same bits, at any thread count."""
    if not fused.available(torch.zeros(1, 1), torch.zeros(1, 1)):
        pytest.skip("numba is not installed: the step runs as torch operations only")
    plain_w, plain_s, opt, _ = _step_case(kind, fused=False, width=width)
    assert not opt.runs_fused(plain_w, plain_w)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            one_w, one_s, opt, _ = _step_case(kind, fused=True, width=width)
            assert opt.runs_fused(one_w, one_w)
            assert torch.equal(one_w, plain_w) and torch.equal(one_s, plain_s)
    finally:
        torch.set_num_threads(threads)


def test_fused_step_splits_rows_over_threads_with_the_same_bits(monkeypatch):
    """Rows in chunks on a pool (many distinct rows, 3 threads) or in one loop: the same bits."""
    if not fused.available(torch.zeros(1, 1), torch.zeros(1, 1)):
        pytest.skip("numba is not installed: the step runs as torch operations only")
    gen = torch.Generator().manual_seed(5)
    rows = torch.randint(0, 40_000, (30_000,), generator=gen)
    grads = torch.randn(30_000, 16, generator=gen)
    g = RowGroups.of(rows)
    assert g.size >= 3 * fused.MIN_ROWS_PER_THREAD  # three chunks
    out = []
    for floor in (fused.MIN_ROWS_PER_THREAD, 10**9):  # chunked, then one loop
        monkeypatch.setattr(fused, "MIN_ROWS_PER_THREAD", floor)
        w, s = torch.ones(40_000, 16), torch.full((40_000,), 0.5)
        fused.fused_step(w, s, g.rows, g.order, g.offsets, grads, 0.1, 1e-8, True, threads=3)
        out.append((w, s))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert not torch.equal(out[0][0], torch.ones(40_000, 16))


@pytest.mark.parametrize("adagrad,elementwise", [(False, False), (True, False), (True, True)])
def test_update_by_add_has_the_bits_of_gather_update_scatter(adagrad, elementwise):
    """The GPU's form of the row update (changes added in place) and the CPU's (gather, update, scatter)."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(300, 16, generator=gen)
    state = torch.rand(300, 16, generator=gen) if elementwise else torch.rand(300, generator=gen)
    slots = torch.randperm(300, generator=gen)[:120]
    out = []
    for by_add in (False, True):
        w, s = weight.clone(), state.clone()
        for _ in range(3):
            update.update_rows(w, s, slots, torch.randn(120, 16, generator=torch.Generator().manual_seed(_)),
                               0.05, 1e-8, adagrad, by_add=by_add, elementwise=elementwise)
        out.append((w, s))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert not torch.equal(out[0][0], weight)


def test_correct_sqrt_is_the_correctly_rounded_root():
    """torch's vectorised CPU sqrt is off by one unit in the last place for some inputs; ``correct_sqrt`` is not:
    it equals numpy's float32 root (IEEE 754) everywhere."""
    x = torch.rand(200_000, generator=torch.Generator().manual_seed(6)) * 10
    assert np.array_equal(update.correct_sqrt(x).numpy(), np.sqrt(x.numpy()))


