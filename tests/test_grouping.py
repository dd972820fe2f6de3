"""The grouping on the device (``grouping.group_on_device``) against the host's (``RowGroups.of``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotcold.embedding.grouping import group_on_device
from hotcold.embedding.rows import RowGroups, bag_sums, sum_by_index

TRASH = 1000


def cases():
    rng = np.random.default_rng(0)
    yield "random", rng.integers(0, 300, 500)
    yield "zipf", np.minimum(rng.zipf(1.3, 2000) - 1, TRASH - 1)
    yield "one row", np.full(64, 7)
    yield "all distinct", rng.permutation(TRASH)[:200]
    yield "descending", np.arange(199, -1, -1)
    yield "one lookup", np.array([5])
    yield "padding", np.where(rng.random(300) < 0.3, -1, rng.integers(0, 50, 300))
    yield "all padding", np.full(10, -1)


@pytest.mark.parametrize("name,ids", list(cases()), ids=[c[0] for c in cases()])
def test_device_grouping_is_the_hosts(name, ids):
    rows = torch.from_numpy(np.where(ids >= 0, ids, TRASH).astype(np.int64))        # [L], TRASH at padding
    g = group_on_device(rows, TRASH)
    valid = torch.from_numpy(np.flatnonzero(ids >= 0))                               # positions of real lookups
    host = RowGroups.of(rows[valid]) if valid.numel() else None
    u = host.size if host is not None else 0
    pad = rows.numel() - valid.numel()
    assert int(g.count) == u + (1 if pad else 0)
    if host is not None:
        assert torch.equal(g.uniq[:u], host.rows)
        assert torch.equal(g.starts[:u], host.offsets[:-1])
        assert torch.equal(g.order[:valid.numel()], valid[host.order])              # the host's order, as positions
    assert (g.uniq[u:] == TRASH).all() and (g.rows[g.order[valid.numel():]] == TRASH).all()
    assert (g.starts[int(g.count):] == rows.numel()).all()
    grads = torch.randn(rows.numel(), 5)
    sums = bag_sums(g.order, g.starts, grads)                                        # [L, 5]
    if host is not None:
        assert torch.equal(sums[:u], sum_by_index(host, grads[valid]))              # same order, same bits
    assert not sums[int(g.count):].any()                                             # empty groups sum to zero


def test_device_grouping_runs_without_values():
    """On meta (no values) it runs to the end: nothing in it reads the device back."""
    rows = torch.empty(4096, dtype=torch.int64, device="meta")
    g = group_on_device(rows, TRASH)
    assert g.uniq.shape == g.starts.shape == g.order.shape == (4096,) and g.count.shape == ()
