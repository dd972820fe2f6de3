"""The lock-step check: a store and the ``device`` reference fed the same lookups and gradients, compared per step."""
from __future__ import annotations

import pytest
import torch

from hotcold import methods
from hotcold.runs import lockstep
from hotcold.embedding.base import StoreSpec
from hotcold.embedding.hybrid import HybridStore
from hotcold.embedding.update import RowOptimizer
from test_stores import MISSING, SPEC_DIM, skip_missing

SIZES = [40, 90, 25]
STEPS, BATCH = 8, 8
#: caches of 30 rows: a batch reads at most 24, and they evict
OPTIONS = {m: {"cache_rows": 30} for m in ("lru", "lfu", "freqcache", "belady")}


def _spec(method: str, optimizer: str, device: torch.device) -> StoreSpec:
    return StoreSpec(table_sizes=list(SIZES), dim=SPEC_DIM.get(method, 4), optimizer=RowOptimizer(optimizer, lr=0.1),
                     device=device, seed=3, options=dict(OPTIONS.get(method, {})))


def _batches():
    return lockstep.random_batches(SIZES, batch_size=BATCH, steps=STEPS, seed=1)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("method", [m for m in methods.names(spans_ranks=False) if m != "device"])
def test_every_store_in_lock_step(method, optimizer, device):
    """The harness's stores match bit for bit every step; a peer stays within the tolerance."""
    skip_missing(method)
    result = lockstep.run(method, _spec(method, optimizer, device), _batches())
    assert len(result.steps) == STEPS and result.method == method
    if methods.get(method).check == methods.CHECK_BITS:
        assert result.bitwise, result.to_record()
    assert result.ok, result.to_record()


class PerturbingStore(HybridStore):
    """The hybrid store with one wrong update: after step ``AT`` one touched row is moved by ``BY``."""

    AT, BY = 3, 1e-4

    def __init__(self, spec: StoreSpec) -> None:
        super().__init__(spec)
        self._step = 0

    def backward(self, grad, timer) -> None:
        lk = self._last
        super().backward(grad, timer)
        if self._step == self.AT:
            self.weight[int(lk.rows[0])] += self.BY
        self._step += 1


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_a_perturbed_row_is_found_at_its_step(optimizer):
    """The negative control: a store that moves one row once is caught at that step, in the rows it touched."""
    result = lockstep.run(PerturbingStore, _spec("hybrid", optimizer, torch.device("cpu")), _batches(), atol=1e-5)
    assert not result.ok and result.first_bad_step == PerturbingStore.AT
    bad = result.steps[PerturbingStore.AT]
    assert bad.lookup == 0.0 and bad.rows == pytest.approx(PerturbingStore.BY, rel=1e-2)
    assert all(s.max == 0.0 for s in result.steps[:PerturbingStore.AT])
    record = result.to_record()
    assert record["check"] == "lockstep" and not record["ok"] and len(record["max_diff_per_step"]) == STEPS


def test_check_kind_of_each_method():
    assert methods.get("hybrid").check == methods.get("sharded").check == methods.CHECK_BITS
    assert methods.get("fbgemm").check == methods.CHECK_LOCKSTEP  # a peer, installed here or not (MISSING)
    assert set(MISSING) <= set(methods.names())


def test_batches_repeat_rows():
    batches = _batches()
    assert len(batches) == STEPS and batches[0].shape == (BATCH, len(SIZES))
    assert all(int(b[:, t].max()) < n for b in batches for t, n in enumerate(SIZES))
    # every batch has rows read more than once (sums of several terms)
    assert all(sum(b[:, t].unique().numel() for t in range(len(SIZES))) < b.numel() for b in batches)
