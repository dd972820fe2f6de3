"""Exact on every device: gradient sums and Adagrad's row mean add in one fixed order, whatever the processor's own.

A GPU adds ``index_add_``'s terms by atomics, in an order that changes run to
run, and reduces ``sum``/``mean`` in a tree of its own; a store that updates
rows on the host would then drift from the ``device`` reference updating them
on the GPU. ``random_reduction_order`` emulates such a processor on the CPU:
inside it, every ``index_add_`` and every ``sum``/``mean`` over a dimension
called from the embedding or scale-out code adds its terms in a fresh random
order per call.
"""
from __future__ import annotations

import contextlib
import sys

import pytest
import torch

from hotcold import methods
from hotcold.accel import normal_device
from hotcold.devices import resolve_device
from hotcold.embedding import rows as rows_mod
from hotcold.embedding import update as update_mod
from hotcold.embedding.rows import RowGroups, sum_by_index
from hotcold.embedding.update import row_square_means, row_square_sums, update_rows
from hotcold.train import train
from test_stores import run_cfg
from tiers import tiered

#: the modules whose reductions the emulation reorders: the stores' update path
UPDATE_PATH = ("hotcold.embedding", "hotcold.distributed")


def _caller_on_update_path() -> bool:
    return sys._getframe(2).f_globals.get("__name__", "").startswith(UPDATE_PATH)


@contextlib.contextmanager
def random_reduction_order(seed: int = 0):
    """``index_add_`` (dim 0) and ``sum``/``mean`` over one dimension, called from the update path, add their terms
    in a random order per call: what a GPU's atomics (and a reduction tree of its own) do to a host's sums."""
    gen = torch.Generator().manual_seed(seed)
    index_add, tsum, tmean = torch.Tensor.index_add_, torch.Tensor.sum, torch.Tensor.mean

    def shuffled_index_add(self, dim, index, source, *args, **kw):
        if dim != 0 or not _caller_on_update_path():
            return index_add(self, dim, index, source, *args, **kw)
        perm = torch.randperm(index.numel(), generator=gen).to(index.device)
        return index_add(self, dim, index.index_select(0, perm), source.index_select(0, perm), *args, **kw)

    def shuffled(reduce):
        def reduced(self, *args, **kw):
            dim = kw.get("dim", args[0] if args else None)
            if not isinstance(dim, int) or not _caller_on_update_path():
                return reduce(self, *args, **kw)
            perm = torch.randperm(self.shape[dim], generator=gen).to(self.device)
            return reduce(self.index_select(dim, perm), *args, **kw)
        return reduced

    torch.Tensor.index_add_, torch.Tensor.sum, torch.Tensor.mean = (shuffled_index_add, shuffled(tsum),
                                                                    shuffled(tmean))
    try:
        yield
    finally:
        torch.Tensor.index_add_, torch.Tensor.sum, torch.Tensor.mean = index_add, tsum, tmean


def in_order_sums(rows: torch.Tensor, grads: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each distinct row's gradients added one after the other in batch order, from zero (the definition)."""
    uniq = torch.unique(rows)
    at = {int(r): i for i, r in enumerate(uniq)}
    out = torch.zeros(uniq.numel(), grads.shape[1], dtype=dtype)
    for j, r in enumerate(rows.tolist()):
        out[at[r]] = out[at[r]] + grads[j].to(dtype)
    return out


def _skewed_batch(n: int = 3000, dim: int = 13, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookups with a few very hot rows (hundreds of terms each) and many cold ones; gradients of mixed scale."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.cat([torch.randint(0, 5, (n // 2,), generator=gen), torch.randint(0, 4000, (n - n // 2,),
                                                                                      generator=gen)])
    rows = rows[torch.randperm(n, generator=gen)]
    grads = torch.randn(n, dim, generator=gen) * torch.logspace(-9, 3, n).unsqueeze(1)  # beyond float64's 53 bits
    return rows, grads


@pytest.mark.parametrize("exact", [False, True], ids=["float32", "float64"])
def test_sum_adds_in_batch_order(exact, device):
    rows, grads = _skewed_batch()
    dtype = torch.float64 if exact else torch.float32
    want = in_order_sums(rows, grads, dtype)
    got = sum_by_index(RowGroups.of(rows), grads.to(device), exact)
    assert got.dtype == dtype and got.device.type == device.type
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("exact", [False, True], ids=["float32", "float64"])
def test_sum_does_not_depend_on_the_processors_order(exact):
    """Under an emulated GPU order the sums keep the in-order bits (on main, the float64 sum was an index_add_)."""
    rows, grads = _skewed_batch(seed=1)
    want = in_order_sums(rows, grads, torch.float64 if exact else torch.float32)
    with random_reduction_order(seed=3):
        for _ in range(3):
            assert torch.equal(sum_by_index(RowGroups.of(rows), grads, exact), want)


def test_sum_of_nothing():
    groups = RowGroups.of(torch.zeros(0, dtype=torch.int64))
    assert sum_by_index(groups, torch.zeros(0, 4)).shape == (0, 4)
    with pytest.raises(ValueError, match="3 gradients for 0 lookups"):
        sum_by_index(groups, torch.zeros(3, 4))


def _tree(values: list[float]) -> float:
    """The pairwise tree by hand on float32 scalars: left half + right half, an odd tail into the first sum."""
    f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    level = [f(v) for v in values]
    while len(level) > 1:
        half = len(level) // 2
        pairs = [level[i] + level[half + i] for i in range(half)]
        if len(level) % 2:
            pairs[0] = pairs[0] + level[2 * half]
        level = pairs
    return float(level[0]) if level else 0.0


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 13, 16, 64])
def test_row_square_sums_is_the_pairwise_tree(width, device):
    gen = torch.Generator().manual_seed(width)
    grad = torch.randn(7, width, generator=gen) * torch.logspace(-3, 2, width)
    got = row_square_sums(grad.to(device)).cpu()
    want = torch.tensor([_tree([float(x) for x in (r * r)]) for r in grad], dtype=torch.float32)
    assert torch.equal(got, want)
    torch.testing.assert_close(row_square_means(grad.double()), grad.double().pow(2).mean(1))
    assert torch.equal(row_square_means(grad.to(device)).cpu(), row_square_means(grad))  # same bits on the CPU


@pytest.mark.parametrize("width", [3, 16])
def test_adagrad_update_does_not_depend_on_the_processors_order(width):
    """Row-wise Adagrad's mean square in a fixed order: an emulated GPU's reduction gives the host's bits."""
    gen = torch.Generator().manual_seed(0)
    weight, grad = torch.randn(50, width, generator=gen), torch.randn(20, width, generator=gen) * 3
    slots = torch.randperm(50, generator=gen)[:20]
    want_w, want_s = weight.clone(), torch.zeros(50)
    update_rows(want_w, want_s, slots, grad, 0.1, 1e-8, True)
    with random_reduction_order(seed=5):
        for _ in range(4):
            w, s = weight.clone(), torch.zeros(50)
            update_rows(w, s, slots, grad, 0.1, 1e-8, True)
            assert torch.equal(w, want_w) and torch.equal(s, want_s)


_ATOMICS = torch.Generator().manual_seed(7)


def _old_gpu_sum(groups: RowGroups, grads: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """The gradient sum main used on a GPU: ``index_add_`` by each lookup's row, its terms landing in any order
    (atomics; here a random permutation per call)."""
    dtype = torch.float64 if exact else grads.dtype
    summed = torch.zeros(groups.size, grads.shape[1], dtype=dtype, device=grads.device)
    perm = torch.randperm(grads.shape[0], generator=_ATOMICS).to(grads.device)
    summed.index_add_(0, groups.inverse(grads.device).index_select(0, perm), grads.to(dtype).index_select(0, perm))
    return summed


#: the harness's own one-process stores: they must train the ``device`` store's bits (peers have their own check)
HARNESS = [m for m in methods.names(spans_ranks=False, peer=False) if m != "device"]
STEPS = 20


def _named(res) -> list[tuple[str, torch.Tensor]]:
    return [(n, p.detach().cpu()) for n, p in res.named_parameters()]


#: the default tier: every store under one row optimizer (the two alternately); the slow tier: under both
@pytest.mark.parametrize("method,row_optimizer", tiered(
    [(method, opt) for method in HARNESS for opt in ("sgd", "adagrad")],
    {(method, ("adagrad", "sgd")[i % 2]) for i, method in enumerate(HARNESS)}))
def test_every_store_keeps_device_bits_under_a_random_order(small_dataset, method, row_optimizer, device):
    """The store and the ``device`` reference, each under its own random reduction order, end with equal bits."""
    with random_reduction_order(seed=11):
        got = train(run_cfg(method, row_optimizer, steps=STEPS), small_dataset, device, progress=False)
    with random_reduction_order(seed=12):
        ref = train(run_cfg("device", row_optimizer, steps=STEPS), small_dataset, device, progress=False,
                    order=got.order)
    for (name, a), (_, b) in zip(_named(got), _named(ref)):
        assert torch.equal(a, b), f"{method}/{row_optimizer}: {name} differs by {float((a - b).abs().max()):.3g}"


@pytest.mark.parametrize("row_optimizer", ["sgd", "adagrad"])
def test_the_old_gpu_sum_drifts_from_the_reference(small_dataset, monkeypatch, row_optimizer):
    """The negative control: with main's GPU sum (``index_add_`` in the processor's order) the hybrid store and the
    ``device`` reference, summed in different orders, no longer share their bits (the torch composition of the
    step, where the GPU runs it, not the CPU's one kernel)."""
    monkeypatch.setattr(update_mod.fused, "available", lambda *args: False)
    monkeypatch.setattr(update_mod, "sum_by_index", _old_gpu_sum)
    with random_reduction_order(seed=11):
        got = train(run_cfg("hybrid", row_optimizer, steps=STEPS), small_dataset, torch.device("cpu"), progress=False)
    with random_reduction_order(seed=12):
        ref = train(run_cfg("device", row_optimizer, steps=STEPS), small_dataset, torch.device("cpu"), progress=False)
    emb = dict(_named(got))["embedding.weight"], dict(_named(ref))["embedding.weight"]
    assert not torch.equal(*emb)


# -- one name per GPU -------------------------------------------------------------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    """torch sees GPUs, the current one is index 2."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)


def test_cuda_gets_the_current_index(fake_gpu):
    assert normal_device("cuda") == torch.device("cuda:2") == normal_device(torch.device("cuda"))
    assert normal_device("cuda:1") == torch.device("cuda:1")
    assert normal_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda:2") == resolve_device("auto")
    assert resolve_device("cpu") == torch.device("cpu")


def test_without_a_gpu_names_stay(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert normal_device("cuda") == torch.device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_a_batchs_plan_ships_once_per_gpu(fake_gpu, monkeypatch):
    """``cuda`` and ``cuda:2`` are one device: the grouping a store ships before its update is not shipped again."""
    shipped = []
    monkeypatch.setattr(rows_mod, "ship", lambda t, device: shipped.append(torch.device(device)) or t.clone())
    groups = RowGroups.of(torch.tensor([3, 1, 3, 0, 1, 3]))
    for name in ("cuda", "cuda:2", torch.device("cuda")):
        groups.plan(name)
        groups.inverse(name)
    assert shipped == [torch.device("cuda:2")] * 2  # one copy of the plan, one of the inverse
    order, starts = groups.plan("cuda")
    assert order.tolist() == [3, 1, 4, 0, 2, 5] and starts.tolist() == [0, 1, 3]
