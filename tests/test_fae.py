"""FAE: hot-row profiling, the hot/cold schedule, synchronisation, and the same model as ``device``."""
from __future__ import annotations

from collections import Counter
from itertools import groupby

import numpy as np
import pytest
import torch

from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.embedding.base import NullMarker, StoreSpec
from hotcold.embedding.update import RowOptimizer
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.fae import FAEProfile, FAEStore
from hotcold.options.stores import FAEOptions
from hotcold.policies.fae_schedule import classify_samples, hottest_rows, profile_counts
from hotcold.train import default_order, train

from test_stores import rel_diff
from tiers import tiered

CPU = torch.device("cpu")


def run_cfg(method: str, row_optimizer: str = "adagrad", steps: int = 50, seed: int = 0,
            store: dict | None = None) -> RunConfig:
    return RunConfig.from_dict({
        "dataset": "small", "method": method, "seed": seed, "store": store or {},
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "train": {"steps": steps, "warmup_steps": 2, "batch_size": 128, "eval_batch_size": 512,
                  "row_optimizer": row_optimizer, "dense_optimizer": row_optimizer},
    })


def fae_cfg(store: dict | None = None, row_optimizer: str = "adagrad", steps: int = 50, seed: int = 0) -> RunConfig:
    return run_cfg("fae", row_optimizer, steps, seed, store)


def data_spec(ds, store: dict | None = None, optimizer: str = "adagrad", seed: int = 0) -> StoreSpec:
    return StoreSpec(table_sizes=ds.cardinalities, dim=8, optimizer=RowOptimizer(optimizer, lr=0.05),
                     device=CPU, seed=seed, options=store or {}, column_tables=ds.column_tables)


def train_rows(ds) -> list[list[int]]:
    """Global rows of every training input's non-padding lookups, by a direct loop."""
    start, stop = ds.split("train")
    offsets = np.concatenate([[0], np.cumsum(ds.cardinalities)[:-1]])
    ids = ds.batch_ids(np.arange(start, stop))
    return [[int(offsets[t] + i) for t, i in zip(ds.column_tables, row) if i >= 0] for row in ids]


#: the default tier: each dataset under one row optimizer; the slow tier: under both
@pytest.mark.parametrize("data,row_optimizer", tiered(
    [(data, opt) for data in ("small_dataset", "sequence_dataset") for opt in ("sgd", "adagrad")],
    {("small_dataset", "adagrad"), ("sequence_dataset", "sgd")}))
def test_trains_same_model_as_device_on_its_schedule(request, data, row_optimizer):
    ds = request.getfixturevalue(data)
    got = train(fae_cfg({"run_length": 1}, row_optimizer=row_optimizer), ds, CPU, progress=False)
    ref = train(run_cfg("device", row_optimizer), ds, CPU, progress=False, order=got.order)
    kinds = [c["hot_batch"] for _, c in got.counters]
    switches = sum(a != b for a, b in zip(kinds, kinds[1:]))
    assert 0 < sum(kinds) < len(kinds) and switches >= 4, "the run must mix hot and cold batches"
    assert rel_diff(got.named_parameters(), ref.named_parameters()) <= 1e-6


@pytest.mark.parametrize("data", ["small_dataset", "sequence_dataset"])
def test_profile_and_hot_inputs_match_direct_computation(request, data):
    ds = request.getfixturevalue(data)
    spec = data_spec(ds, {"budget_ratio": 0.2})
    rows = train_rows(ds)
    counts, sampled = profile_counts(ds, spec.seed, 1.0)
    assert sampled == len(rows)
    direct = Counter(r for sample in rows for r in sample)
    assert {r: int(c) for r, c in enumerate(counts) if c} == dict(direct)
    capacity = FAEOptions.parse(spec.options, "fae").hot_rows(spec.num_rows, spec.dim)
    ranked = sorted(range(spec.num_rows), key=lambda r: (-direct[r], r))[:capacity]
    hot = hottest_rows(counts, capacity)
    assert hot.tolist() == sorted(ranked)
    hot_set = set(hot.tolist())
    expect = np.array([all(r in hot_set for r in sample) for sample in rows])
    assert 0 < expect.mean() < 1
    np.testing.assert_array_equal(classify_samples(ds, hot), expect)

    FAEStore.schedule(spec, ds, iter([np.arange(4)]))  # the 5% sample: fixed by the seed
    prof = FAEProfile.of(spec)
    assert prof.sampled == round(0.05 * len(rows))
    again, other = data_spec(ds, {"budget_ratio": 0.2}), data_spec(ds, {"budget_ratio": 0.2}, seed=1)
    FAEStore.schedule(again, ds, iter([np.arange(4)]))
    FAEStore.schedule(other, ds, iter([np.arange(4)]))
    assert torch.equal(FAEProfile.of(again).hot_rows, prof.hot_rows)
    assert not torch.equal(FAEProfile.of(other).hot_rows, prof.hot_rows)
    hot_set = set(prof.hot_rows.tolist())
    share = np.mean([all(r in hot_set for r in sample) for sample in rows])
    assert prof.hot_fraction == pytest.approx(share)
    assert len(prof.hot_rows) == capacity


@pytest.mark.parametrize("run_length", [1, 3])
def test_schedule_epochs_kinds_and_proportion(small_dataset, run_length):
    ds = small_dataset
    cfg = fae_cfg(steps=120)
    spec = data_spec(ds, {"run_length": run_length})
    order = list(FAEStore.schedule(spec, ds, default_order(cfg, ds)))
    assert len(order) == 120 and all(len(b) == 128 for b in order)
    prof = FAEProfile.of(spec)
    hot_set = set(prof.hot_rows.tolist())
    is_hot = [all(r in hot_set for r in sample) for sample in train_rows(ds)]
    n_hot, n_cold = sum(is_hot) // 128, (len(is_hot) - sum(is_hot)) // 128
    per_epoch = n_hot + n_cold
    assert n_hot > 0 and n_cold > 0 and 120 > 2 * per_epoch
    epochs = [order[a:a + per_epoch] for a in range(0, 120, per_epoch)]
    patterns = []
    for epoch in epochs:
        seen = np.concatenate(epoch)
        assert len(np.unique(seen)) == len(seen), "a training input twice in one epoch"
        kinds = [bool(all(is_hot[i] for i in b)) for b in epoch]
        assert all(kinds[k] or not any(is_hot[i] for i in b) for k, b in enumerate(epoch)), "mixed batch"
        patterns.append(kinds)
        groups = [len(list(g)) for _, g in groupby(kinds)]  # maximal runs of one kind
        assert sum(g < run_length for g in groups) <= 2, "only each kind's last run may be short"
        assert len(groups) <= 2 * -(-min(n_hot, n_cold) // run_length) + 1
    assert sum(patterns[0]) == n_hot and sum(patterns[1]) == n_hot
    assert patterns[0] != patterns[1], "the interleave is reshuffled every epoch"
    assert n_hot / per_epoch == pytest.approx(prof.hot_fraction, abs=1.5 / per_epoch)


class Recorder:
    def __init__(self) -> None:
        self.marks: list[str] = []

    def mark(self, phase: str) -> None:
        self.marks.append(phase)


def test_sync_counters_on_a_hand_made_sequence():
    sizes, dim = [5, 9, 4], 3
    spec = StoreSpec(table_sizes=sizes, dim=dim, optimizer=RowOptimizer("adagrad", lr=0.1), device=CPU, seed=1)
    FAEProfile(torch.tensor([0, 1, 5, 14])).attach(spec)  # ids 0, 1 of table 0; id 0 of tables 1 and 2
    store, ref = FAEStore(spec), DeviceStore(spec)
    hot = torch.tensor([[0, 0, 0], [1, 0, 0]])    # only hot rows
    cold = torch.tensor([[0, 0, 0], [2, 3, 0]])   # touches hot rows too
    row_bytes, vec = (dim + 1) * 4, 6 * dim * 4
    expected = [  # kind, param rows h2d, d2h, activation bytes h2d, d2h
        (hot, 1, 0, 0, 0, 0),                      # both copies start equal: no sync
        (hot, 1, 0, 0, 0, 0),
        (cold, 0, 0, 4, vec, vec),                 # hot -> cold: 4 hot rows device -> host
        (cold, 0, 0, 0, vec, vec),
        (hot, 1, 4, 0, 0, 0),                      # cold -> hot: 4 hot rows host -> device
        (cold, 0, 0, 4, vec, vec),
        (hot, 1, 4, 0, 0, 0),
    ]
    gen = torch.Generator().manual_seed(0)
    for step, (ids, kind, h2d, d2h, b_h2d, b_d2h) in enumerate(expected):
        timer = Recorder()
        out = store.forward(ids, timer)
        torch.testing.assert_close(out, ref.forward(ids, NullMarker()), rtol=0, atol=0)
        grad = torch.randn(2, 3, dim, generator=gen)
        store.backward(grad, timer)
        ref.backward(grad, NullMarker())
        c = store.step_counters()
        assert (c["hot_batch"], c["param_rows_h2d"], c["param_rows_d2h"], c["vector_bytes_h2d"],
                c["grad_bytes_d2h"]) == (kind, h2d, d2h, b_h2d, b_d2h), f"step {step}"
        assert c["param_bytes_h2d"] == h2d * row_bytes and c["param_bytes_d2h"] == d2h * row_bytes
        assert (c["sync_rows"], c["sync_bytes"], c["switches"]) == (h2d + d2h, (h2d + d2h) * row_bytes,
                                                                    int(h2d + d2h > 0))
        assert (c["lookups"], c["hits"], c["misses"]) == (6, 6 * kind, 6 * (1 - kind))
        assert c["unique_rows"] == len(set((ids + torch.tensor([0, 5, 14])).reshape(-1).tolist()))
        if h2d and kind:
            assert timer.marks[0] == "h2d"
        if d2h:
            assert timer.marks[:2] == ["d2h", "emb_fwd"]
        before = store.export()
        probe = torch.tensor([[1, 0, 0], [4, 8, 3]])
        torch.testing.assert_close(store.lookup(probe), ref.lookup(probe), rtol=0, atol=0)
        assert torch.equal(store.export(), before) and store.step_counters() == c, "lookup changed state"
        torch.testing.assert_close(before, ref.export(), rtol=0, atol=0)
    assert store.hot_rows.tolist() == [0, 1, 5, 14]


@pytest.mark.parametrize("options, match", [
    ({"sample_fraction": 0}, "sample_fraction"),
    ({"sample_fraction": 1.5}, "sample_fraction"),
    ({"sample_fraction": True}, "sample_fraction"),
    ({"budget_ratio": -0.1}, "budget_ratio"),
    ({"budget_ratio": 1.2}, "budget_ratio"),
    ({"budget_ratio": "half"}, "budget_ratio"),
    ({"budget_bytes": -1}, "budget_bytes"),
    ({"budget_bytes": 1.5}, "budget_bytes"),
    ({"budget_bytes": 1024, "budget_ratio": 0.1}, "not both"),
    ({"run_length": 0}, "run_length"),
    ({"run_length": 2.0}, "run_length"),
    ({"run_length": "day"}, "run_length"),
    ({"run_length": True}, "run_length"),
    ({"cache_ratio": 0.1}, "unknown option"),
])
def test_bad_options_fail_clearly(small_dataset, options, match):
    with pytest.raises(ConfigError, match=match):
        FAEStore(data_spec(small_dataset, options))
    with pytest.raises(ConfigError, match=match):
        FAEStore.schedule(data_spec(small_dataset, options), small_dataset, iter([np.arange(4)]))


def test_budget_bytes_count_weights_as_faes_profiler(small_dataset):
    """bytes / (4 x dim) rows, whatever the optimizer state (it is moved, not budgeted)."""
    sgd, ada = data_spec(small_dataset, {"budget_bytes": 10 * 32 + 31}, "sgd"), \
        data_spec(small_dataset, {"budget_bytes": 10 * 32 + 31})
    hot_rows = [FAEOptions.parse(s.options, "fae").hot_rows(s.num_rows, s.dim) for s in (sgd, ada)]
    assert hot_rows[0] == hot_rows[1] == 10  # D = 8: 32 B of weights a row


def test_zero_budget_is_hybrid(small_dataset):
    got = train(fae_cfg({"budget_ratio": 0.0}), small_dataset, CPU, progress=False)
    ref = train(run_cfg("hybrid"), small_dataset, CPU, progress=False)
    assert got.store.hot_fraction == 0 and got.store.hot_rows.numel() == 0
    assert [b.tolist() for b in got.order] == [b.tolist() for b in ref.order]
    assert [c for _, c in got.counters] == [c for _, c in ref.counters]
    assert all(c["hot_batch"] == 0 for _, c in got.counters)
    assert rel_diff(got.named_parameters(), ref.named_parameters()) == 0


@pytest.mark.parametrize("budget", [{"budget_ratio": 1.0}, {"budget_bytes": 1 << 30, "sample_fraction": 1.0}])
def test_full_budget_is_all_hot(small_dataset, budget):
    got = train(fae_cfg(budget), small_dataset, CPU, progress=False)
    ref = train(run_cfg("device"), small_dataset, CPU, progress=False)
    assert got.store.hot_fraction == 1
    assert [b.tolist() for b in got.order] == [b.tolist() for b in ref.order]
    for _, c in got.counters:
        assert c["hot_batch"] == 1 and c["hits"] == c["lookups"]
        assert c["param_bytes_h2d"] == c["param_bytes_d2h"] == c["vector_bytes_h2d"] == c["switches"] == 0
    assert rel_diff(got.named_parameters(), ref.named_parameters()) <= 1e-6


def test_auc_close_to_hybrid(small_dataset):
    """FAE only reorders the inputs; its AUC matches hybrid's within the seed-to-seed spread.

    On this 1024-sample test split two seeds of ``hybrid`` differ by up to
    about 0.01 in AUC, so the means over three seeds must agree within 0.015.
    """
    fae = [train(fae_cfg(steps=60, seed=s), small_dataset, CPU, progress=False).metrics["auc"] for s in range(3)]
    hyb = [train(run_cfg("hybrid", steps=60, seed=s), small_dataset, CPU, progress=False).metrics["auc"]
           for s in range(3)]
    assert min(fae) > 0.75
    assert abs(np.mean(fae) - np.mean(hyb)) <= 0.015


def test_default_schedule_is_the_authors_cold_then_hot_epochs(small_dataset):
    """run_length "epoch": each period's cold batches, then its hot ones (the warm-up steps a scaled epoch of
    their own, in reverse, then the timed steps' whole epochs and a scaled one); two syncs a period at most."""
    got = train(fae_cfg(steps=120, row_optimizer="adagrad"), small_dataset, CPU, progress=False)
    counters = [c for _, c in got.counters]
    kinds = [c["hot_batch"] for c in counters]
    h = got.store.hot_rows.numel()
    start, stop = small_dataset.split("train")
    hot_inputs = round(got.store.hot_fraction * (stop - start))
    per_epoch = hot_inputs // 128 + (stop - start - hot_inputs) // 128
    assert got.store_report["epoch_batches"] == per_epoch and 120 - 2 > per_epoch
    bounds = [0, 2, *range(2 + per_epoch, 120, per_epoch), 120]  # warm-up, whole epochs, the scaled rest
    assert kinds[:2] == sorted(kinds[:2], reverse=True), "the warm-up in reverse: it ends cold"
    for a, b in zip(bounds[1:], bounds[2:]):
        period = kinds[a:b]
        assert period == sorted(period), "cold batches first, then hot ones"
        if b - a == per_epoch:
            assert sum(period) == hot_inputs // 128, "a whole epoch"
    switches = sum(c["switches"] for c in counters)
    assert 0 < switches <= 2 * (len(bounds) - 1)
    assert switches == sum(a != b for a, b in zip(kinds, kinds[1:]))
    assert sum(c["sync_bytes"] for c in counters) == switches * h * (8 + 1) * 4
