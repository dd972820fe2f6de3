"""Deterministic batches and the look-ahead window."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotcold.data.loader import BatchLoader
from hotcold.data.order import batch_rows


def test_batches_are_deterministic_per_seed_and_cover_epochs():
    a = [b.tolist() for b in batch_rows(100, 30, 7, seed=1, shuffle="global")]
    assert a == [b.tolist() for b in batch_rows(100, 30, 7, seed=1, shuffle="global")]
    assert a != [b.tolist() for b in batch_rows(100, 30, 7, seed=2, shuffle="global")]
    epoch0 = sorted(i for b in a[:3] for i in b)
    assert len(set(epoch0)) == 90  # no repeats inside an epoch; 10 rows dropped
    assert a[3] != a[0]  # the next epoch has its own order
    plain = [b.tolist() for b in batch_rows(100, 30, 4, seed=1, shuffle="none")]
    assert plain[0] == list(range(30)) and plain[3] == list(range(30))


def test_split_smaller_than_a_batch_fails():
    with pytest.raises(ValueError, match="fewer than one batch"):
        next(batch_rows(10, 32, 1, 0, "global"))


@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_lookahead_window_shows_the_next_batches(small_dataset, lookahead):
    plain = list(BatchLoader(small_dataset, "train", 64, 6, seed=0))
    ahead = list(BatchLoader(small_dataset, "train", 64, 6, seed=0, lookahead=lookahead))
    assert [b.step for b in ahead] == list(range(6))
    for i, b in enumerate(ahead):
        assert torch.equal(b.ids, plain[i].ids)
        expected = [p.ids for p in plain[i + 1:i + 1 + lookahead]]
        assert len(b.upcoming) == len(expected)
        assert all(torch.equal(x, y) for x, y in zip(b.upcoming, expected))


def test_batch_contents_come_from_the_train_split(small_dataset):
    start, stop = small_dataset.split("train")
    b = next(iter(BatchLoader(small_dataset, "train", 32, 1, seed=0)))
    rows = next(batch_rows(stop - start, 32, 1, 0, "global")) + start
    assert np.array_equal(b.ids.numpy(), small_dataset.sparse[rows].astype(np.int64))
    assert b.ids.dtype == torch.int64 and b.dense.shape == (32, small_dataset.num_dense)


def test_released_pages_read_the_same_values(small_dataset):
    from hotcold.data.loader import release_pages

    rows = np.arange(0, 1000, 7)
    before = (np.array(small_dataset.dense[rows]), small_dataset.batch_ids(rows))
    assert release_pages(small_dataset) >= 3  # dense, sparse, labels
    assert np.array_equal(small_dataset.dense[rows], before[0])
    assert np.array_equal(small_dataset.batch_ids(rows), before[1])


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_reads_its_contiguous_slice_of_every_global_batch(small_dataset, ranks):
    """Each rank reads only its slice; the slices, in rank order, are the global batch (and its look-ahead)."""
    whole = list(BatchLoader(small_dataset, "train", 64, 5, seed=0, lookahead=1))
    parts = [list(BatchLoader(small_dataset, "train", 64, 5, seed=0, lookahead=1, part=(r, ranks)))
             for r in range(ranks)]
    for step, batch in enumerate(whole):
        got = [p[step] for p in parts]
        assert all(g.ids.shape[0] == 64 // ranks for g in got)
        for field in ("dense", "ids", "labels"):
            assert torch.equal(torch.cat([getattr(g, field) for g in got]), getattr(batch, field))
        for k, ahead in enumerate(batch.upcoming):
            assert torch.equal(torch.cat([g.upcoming[k] for g in got]), ahead)


class _Pending:
    """An event of a copy that is not done until ``done`` is set."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


@pytest.mark.parametrize("data", ["small_dataset", "sequence_dataset"])
@pytest.mark.parametrize("readers", [0, 2])
def test_packed_batches_hold_the_batches(request, data, readers):
    """Read ahead by threads and packed for one copy (ids as int32 global rows), a batch is the plain loader's."""
    from hotcold.accel import runtime
    from hotcold.data.columns import to_global
    from hotcold.data.packed import PackedBuffers, views

    ds = request.getfixturevalue(data)
    pool = PackedBuffers(runtime("cpu"))
    plain = list(BatchLoader(ds, "train", 64, 6, seed=0, lookahead=1))
    packed = list(BatchLoader(ds, "train", 64, 6, seed=0, lookahead=1, readers=readers, buffers=pool))
    for a, b in zip(plain, packed, strict=True):
        dense, rows, labels = views(b.packed, *a.dense.shape, a.ids.shape[1])
        assert torch.equal(dense, a.dense) and torch.equal(labels, a.labels) and torch.equal(b.ids, a.ids)
        want = to_global(a.ids.numpy(), ds.column_offsets)
        want[want < 0] = sum(ds.cardinalities)  # padding: the number of rows
        assert rows.dtype == torch.int32 and np.array_equal(rows.numpy(), want)
        assert all(torch.equal(x, y) for x, y in zip(a.upcoming, b.upcoming, strict=True))
        pool.give_back(b.packed, None)


def test_a_packed_buffer_is_reused_only_after_its_copy():
    from hotcold.accel import runtime
    from hotcold.data.packed import PackedBuffers

    pool = PackedBuffers(runtime("cpu"), most=2)
    a, b = pool.take(10), pool.take(10)
    copying = _Pending()
    pool.give_back(a, copying)
    pool.give_back(b, None)
    assert pool.take(10).data_ptr() == b.data_ptr()  # the one whose copy is done
    c = pool.take(10)  # none free and two made: waits for a's copy
    assert copying.done and c.data_ptr() == a.data_ptr()
