"""The cache directory on the device (``DeviceDirectory``) against the host's (``CacheDirectory``), step by step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hotcold.embedding.device_directory import DeviceDirectory
from hotcold.embedding.grouping import group_on_device
from hotcold.policies.directory import CacheDirectory, cache_policy

N = 400


def batches(kind: str, steps: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Lookups (global rows, N at padding) of each step."""
    out = []
    for t in range(steps):
        if kind == "zipf":
            b = np.minimum(rng.zipf(1.2, 60) - 1, N - 1)
        elif kind == "uniform":
            b = rng.integers(0, N, 60)
        elif kind == "scan":  # every step new rows: all miss, the cache turns over
            b = (np.arange(40) + 40 * t) % N
        elif kind == "repeat":  # the same rows: all hit after the first step
            b = np.repeat(np.arange(0, 30), 2)
        else:  # padding and a changing working set
            b = np.where(rng.random(60) < 0.3, N, rng.integers(0, 50 + 10 * t, 60) % N)
        out.append(b.astype(np.int64))
    return out


def next_uses(trace: list[np.ndarray]) -> list[np.ndarray]:
    """belady's next use of each distinct row of each step."""
    uniq = [np.unique(b[b < N]) for b in trace]
    out = []
    for t, u in enumerate(uniq):
        nxt = np.full(u.size, np.iinfo(np.int64).max, dtype=np.int64)
        for i, r in enumerate(u):
            for s in range(t + 1, len(uniq)):
                if r in set(uniq[s].tolist()):
                    nxt[i] = s
                    break
        out.append(nxt)
    return out


@pytest.mark.parametrize("kind", ["zipf", "uniform", "scan", "repeat", "padded"])
@pytest.mark.parametrize("policy", ["lru", "lfu", "freqcache", "freqcache-lfu", "belady"])
@pytest.mark.parametrize("capacity", [60, 150])
def test_device_directory_decides_as_the_host(policy, kind, capacity):
    rng = np.random.default_rng(hash((policy, kind, capacity)) % 2**32)
    trace = batches(kind, 12, rng)
    freq = np.bincount(np.concatenate(trace)[np.concatenate(trace) < N], minlength=N)
    pol, warm = cache_policy(policy, N, capacity, frequencies=freq, warmup_ratio=0.5, next_use=next_uses(trace))
    host = CacheDirectory(N, capacity, pol)
    if warm.size:
        host.warm(warm)
    dev = DeviceDirectory(host, torch.device("cpu"))
    for t, b in enumerate(trace):
        rows = torch.from_numpy(b)
        g = group_on_device(rows, N)
        got = dev.access(g, dev.next_use(rows.numel()))
        real = b[b < N]
        uniq, counts = np.unique(real, return_counts=True)
        want = host.access(uniq, counts)
        u = uniq.size
        assert torch.equal(g.uniq[:u], torch.from_numpy(uniq)), t
        assert np.array_equal(got.slots[:u].numpy(), want.slots), (t, "slots")
        assert np.array_equal(got.miss[:u].numpy(), ~want.hit), (t, "hits")
        e = want.victim_rows.size
        assert np.array_equal(got.victim_slots[:e].numpy(), want.victim_slots), (t, "victim slots")
        assert np.array_equal(got.victim_rows[:e].numpy(), want.victim_rows), (t, "victim rows")
        assert (got.victim_slots[e:] == capacity + 1).all() and (got.victim_rows[e:] == N + 1).all()
        c = want.counters(1)
        counts = got.counts(g, N, capacity).tolist()
        assert counts == [c.lookups, c.unique_rows, c.hits, c.unique_hits, c.evictions, 0], t
    assert np.array_equal(dev.row_slot[:N].numpy(), host.row_slot)
    assert np.array_equal(dev.slot_row[:capacity].numpy(), host.slot_row) and int(dev.used) == host.used


def test_device_directory_runs_without_values():
    """On meta it runs to the end: no decision is read back by the host."""
    host = CacheDirectory(N, 50, cache_policy("lfu", N, 50)[0])
    dev = DeviceDirectory(host, torch.device("meta"))
    got = dev.access(group_on_device(torch.empty(60, dtype=torch.int64, device="meta"), N))
    assert got.slots.shape == (60,) and got.victim_slots.shape == (50,) and got.evictions.shape == ()
