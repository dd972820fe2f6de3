"""ScratchPipe: same model as ``device``, always hits, fails early when too small, hazards ordered."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from tiers import tiered

from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.embedding.base import NullMarker, StoreSpec
from hotcold.embedding.update import RowOptimizer
from hotcold.embedding.device import DeviceStore
from hotcold.embedding.scratchpipe import ScratchPipeStore
from hotcold.embedding.scratchpipe_pipeline import MovePipeline
from hotcold.train import train, train_loader

CPU = torch.device("cpu")
_REFERENCE: dict[tuple[str, str], object] = {}


def run_cfg(method: str, row_optimizer: str = "adagrad", steps: int = 30, **store) -> RunConfig:
    return RunConfig.from_dict({
        "dataset": "small", "method": method, "seed": 0, "store": store,
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "train": {"steps": steps, "warmup_steps": 2, "batch_size": 128, "eval_batch_size": 512,
                  "eval_samples": 512, "row_optimizer": row_optimizer, "dense_optimizer": row_optimizer},
    })


def rel_diff(a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]) -> float:
    assert [n for n, _ in a] == [n for n, _ in b]
    num = sum(float((x - y).double().pow(2).sum()) for (_, x), (_, y) in zip(a, b))
    den = sum(float(y.double().pow(2).sum()) for _, y in b)
    return (num / den) ** 0.5


def window_sets(cfg: RunConfig, ds) -> list[set[int]]:
    """The global rows of every training batch, as Python sets (independent of the store)."""
    offsets = np.concatenate([[0], np.cumsum(ds.cardinalities)[:-1]])[ds.column_tables]
    out = []
    for b in train_loader(cfg, ds, lookahead=0):
        ids = b.ids.numpy()
        out.append({int(r) for r in (ids + offsets)[ids >= 0]})
    return out


def min_capacity(sets: list[set[int]], window: int) -> int:
    return max(len(set().union(*sets[i:i + window + 1])) for i in range(len(sets)))


def reference(data: str, ds, row_optimizer: str):
    key = (data, row_optimizer)
    if key not in _REFERENCE:
        _REFERENCE[key] = train(run_cfg("device", row_optimizer), ds, CPU, progress=False)
    return _REFERENCE[key]


#: the default tier: each window with each optimizer once, each dataset twice; the slow tier: every combination
@pytest.mark.parametrize("data,row_optimizer,window", tiered(
    [(data, opt, window) for data in ("small_dataset", "sequence_dataset") for opt in ("sgd", "adagrad")
     for window in (1, 3)],
    {("small_dataset", "sgd", 1), ("small_dataset", "adagrad", 3), ("sequence_dataset", "adagrad", 1),
     ("sequence_dataset", "sgd", 3)}))
def test_trains_same_model_as_device_with_heavy_eviction(request, data, row_optimizer, window):
    ds = request.getfixturevalue(data)
    m = min_capacity(window_sets(run_cfg("device"), ds), window)
    got = train(run_cfg("scratchpipe", row_optimizer, window=window, scratchpad_rows=m + 1), ds, CPU, progress=False)
    ref = reference(data, ds, row_optimizer)
    assert rel_diff(got.named_parameters(), ref.named_parameters()) <= 1e-6
    assert got.metrics["auc"] == pytest.approx(ref.metrics["auc"], abs=1e-6)
    for _, c in got.counters:
        assert c["hits"] == c["lookups"] and c["misses"] == 0
    evicted = sum(c["evictions"] for _, c in got.counters)
    fetched = sum(c["param_rows_h2d"] for _, c in got.counters)
    assert evicted > m, "a scratchpad just above the minimum must evict heavily"
    assert fetched - evicted == int((got.store.slot_to_row >= 0).sum()) <= m + 1
    steps = [w.step for w in got.store.pipeline.work]
    assert steps == sorted(steps)


def test_too_small_scratchpad_fails_at_start_and_minimum_passes(small_dataset):
    m = min_capacity(window_sets(run_cfg("device"), small_dataset), 2)
    with pytest.raises(ConfigError, match=f"minimum capacity is {m} rows"):
        train(run_cfg("scratchpipe", scratchpad_rows=m - 1), small_dataset, CPU, progress=False)
    n = sum(small_dataset.cardinalities)
    with pytest.raises(ConfigError, match=f"minimum capacity is {m} rows"):
        train(run_cfg("scratchpipe", scratchpad_ratio=(m - 1) / n), small_dataset, CPU, progress=False)
    got = train(run_cfg("scratchpipe", scratchpad_rows=m), small_dataset, CPU, progress=False)
    assert got.store.min_capacity == m and got.store.capacity == m
    ref = reference("small_dataset", small_dataset, "adagrad")
    assert rel_diff(got.named_parameters(), ref.named_parameters()) <= 1e-6
    by_ratio = train(run_cfg("scratchpipe", scratchpad_ratio=m / n), small_dataset, CPU, progress=False)
    assert by_ratio.store.capacity == m


# -- hand-made sequences, driven step by step as the training loop does -------------------------

# One table of 10 rows, W=1: the minimum capacity is 4 (batches 0..1 and 1..2 and 2..3 need 4 rows).
HAND = [[0, 1], [2, 3], [0, 4], [5, 1], [0, 1]]


def hand_spec(batches: list[torch.Tensor], optimizer: str = "adagrad", **options) -> StoreSpec:
    return StoreSpec(table_sizes=[10], dim=3, optimizer=RowOptimizer(optimizer, lr=0.1), device=CPU, seed=1,
                     options=options, batches=lambda: iter(batches))


def as_batches(rows: list[list[int]]) -> list[torch.Tensor]:
    return [torch.tensor(r, dtype=torch.int64).unsqueeze(1) for r in rows]  # [B, K=1]


def drive(store, batches: list[torch.Tensor], window: int, check=None) -> tuple[list[torch.Tensor], list[dict]]:
    """The training loop's calls with fixed gradients; returns each step's forward output and counters."""
    gen = torch.Generator().manual_seed(0)
    outs, counters = [], []
    for s, ids in enumerate(batches):
        store.prefetch(batches[s + 1:s + 1 + window])
        if check is not None:
            check(s)
        out = store.forward(ids, NullMarker())
        outs.append(out.clone())
        store.backward(torch.randn(out.shape, generator=gen), NullMarker())
        counters.append(store.step_counters())
    return outs, counters


def test_counters_on_hand_made_sequence():
    batches = as_batches(HAND)
    store = ScratchPipeStore(hand_spec(batches, window=1, scratchpad_rows=4))
    assert store.min_capacity == 4 and store.lookahead == 1
    _, c = drive(store, batches, 1)
    store.close()
    # Step 0 fetches batches 0 and 1 (in training order) into free slots; step 1
    # admits batch 2: row 0 resident, row 4 evicts row 1 (the only unheld slot); step 2
    # admits batch 3: rows 5 and 1 evict rows 2 and 3; step 3 admits batch 4: rows 0, 1 resident.
    assert [x["param_rows_h2d"] for x in c] == [4, 1, 2, 0, 0]
    assert [x["prefetch_unique_misses"] for x in c] == [4, 1, 2, 0, 0]
    assert [x["prefetch_unique_hits"] for x in c] == [0, 1, 0, 2, 0]
    assert [x["param_rows_d2h"] for x in c] == [x["evictions"] for x in c] == [0, 1, 2, 0, 0]
    assert [x["param_bytes_h2d"] for x in c] == [r * (3 + 1) * 4 for r in [4, 1, 2, 0, 0]]
    assert [x["param_bytes_d2h"] for x in c] == [r * (3 + 1) * 4 for r in [0, 1, 2, 0, 0]]
    assert all(x["lookups"] == x["hits"] == 2 and x["misses"] == 0 and x["unique_rows"] == x["unique_hits"] == 2
               for x in c)
    assert [x["prefetch_batch"] for x in c] == [1, 2, 3, 4, -1]
    assert [w.step for w in store.pipeline.work] == [0, 0, 1, 2]


@pytest.mark.parametrize("window", [1, 2, 4])
def test_rows_fetched_per_step_match_first_touches(window):
    """With room for everything, step s fetches the rows of batch s+W never needed before."""
    gen = torch.Generator().manual_seed(3)
    sizes = [30, 12]
    batches = [torch.stack([torch.randint(0, n, (5,), generator=gen) for n in sizes], 1) for _ in range(12)]
    spec = StoreSpec(table_sizes=sizes, dim=2, optimizer=RowOptimizer("sgd", lr=0.1), device=CPU,
                     options={"window": window, "scratchpad_rows": 42}, batches=lambda: iter(batches))
    store = ScratchPipeStore(spec)
    _, c = drive(store, batches, window)
    store.close()
    sets = [{int(i) for i in b[:, 0]} | {30 + int(i) for i in b[:, 1]} for b in batches]
    seen: set[int] = set()
    expected = []
    for s in range(len(batches)):
        new = set().union(*sets[:window + 1]) if s == 0 else (sets[s + window] if s + window < len(sets) else set())
        expected.append(len(new - seen))
        seen |= new
    assert [x["param_rows_h2d"] for x in c] == expected
    assert all(x["param_rows_d2h"] == 0 and x["param_bytes_h2d"] == x["param_rows_h2d"] * 2 * 4 for x in c)
    assert [x["unique_rows"] for x in c] == [len(s) for s in sets]


def _slow(fn, seconds: float):
    def wrapped(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)
    return wrapped


def _run_hazard_sequence(store: ScratchPipeStore, window: int) -> None:
    """Row 1 is updated by batch 0, evicted when batch 2 is admitted (step 1) and fetched again
    for batch 3 = 1 + W + 1 (step 2): every forward and the final rows must match ``device``."""
    batches = as_batches(HAND)
    ref = DeviceStore(hand_spec(batches, store.optimizer.kind))
    ref_outs, _ = drive(ref, batches, window)

    def check(s: int) -> None:
        # Every row of an in-flight batch is resident and held (step 0 admits in its forward).
        for b in batches[s:s + window + 1] if s else []:
            slots = store.row_to_slot[b[:, 0].numpy()]
            assert (slots >= 0).all() and (store.directory.hold[slots] > 0).all()

    outs, _ = drive(store, batches, window, check)
    for s, (a, b) in enumerate(zip(outs, ref_outs)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"step {s}")
    torch.testing.assert_close(store.export(), ref.export(), rtol=0, atol=0)


def _slow_write_back_of_row_1(monkeypatch) -> list[tuple[str, float]]:
    """Make the write-back that carries row 1 slow: a fetch of row 1 from the host table reads it stale.

    Returns a log of (stage, time) for the slow scatter's end and every gather's start.
    """
    original_scatter, original_gather = MovePipeline._scatter, MovePipeline._gather
    log: list[tuple[str, float]] = []

    def slow(self, job):
        if 1 not in job.victim_rows.tolist():
            return original_scatter(self, job)
        time.sleep(0.2)
        out = original_scatter(self, job)
        log.append(("scatter of row 1 done", time.perf_counter()))
        return out

    def logged(self, job, missing, sources):
        log.append(("gather", time.perf_counter()))
        return original_gather(self, job, missing, sources)

    monkeypatch.setattr(MovePipeline, "_scatter", slow)
    monkeypatch.setattr(MovePipeline, "_gather", logged)
    return log


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_written_back_row_is_never_fetched_stale(monkeypatch, optimizer):
    _slow_write_back_of_row_1(monkeypatch)
    store = ScratchPipeStore(hand_spec(as_batches(HAND), optimizer, window=1, scratchpad_rows=4))
    _run_hazard_sequence(store, 1)
    store.close()


def test_later_gathers_do_not_wait_for_an_earlier_write_back(monkeypatch):
    """The pipeline is staged: row 1's re-fetch comes from the evicting job's staging while its slow
    write-back is still running, and training still matches ``device``."""
    log = _slow_write_back_of_row_1(monkeypatch)
    store = ScratchPipeStore(hand_spec(as_batches(HAND), window=1, scratchpad_rows=4))
    _run_hazard_sequence(store, 1)
    store.close()
    done = next(t for stage, t in log if stage.startswith("scatter"))
    assert sum(stage == "gather" and t < done for stage, t in log) >= 2, "a later gather overlapped it"


def test_fetched_slot_is_not_read_before_it_lands(monkeypatch):
    monkeypatch.setattr(MovePipeline, "_gather", _slow(MovePipeline._gather, 0.05))
    store = ScratchPipeStore(hand_spec(as_batches(HAND), window=1, scratchpad_rows=4))
    _run_hazard_sequence(store, 1)
    store.close()


def test_unordered_write_back_and_fetch_is_caught(monkeypatch):
    """Negative control: without taking staged write-backs into account, the fetch of row 1
    (step 2) reads the host table before its slow write-back (step 1) lands, batch 3 trains on a
    stale row, and the hazard check sees it."""
    _slow_write_back_of_row_1(monkeypatch)
    monkeypatch.setattr(MovePipeline, "_sources", lambda self, missing: [])
    store = ScratchPipeStore(hand_spec(as_batches(HAND), window=1, scratchpad_rows=4))
    with pytest.raises(AssertionError, match="step 3"):
        _run_hazard_sequence(store, 1)
    store.close()


def test_written_back_value_is_the_trained_one():
    batches = as_batches(HAND)
    ref = DeviceStore(hand_spec(batches))
    store = ScratchPipeStore(hand_spec(batches, window=1, scratchpad_rows=4))
    initial = store.host_weight[1].clone()
    drive(ref, batches[:1], 1)

    def check(s: int) -> None:
        if s == 2:  # row 1 was evicted at step 1; its write-back has landed once step 1's job is joined
            store.pipeline.drain()
            assert store.row_to_slot[1] == -1
            torch.testing.assert_close(store.host_weight[1], ref.weight[1], rtol=0, atol=0)
            assert not torch.equal(store.host_weight[1], initial)

    drive(store, batches[:3], 1, check)
    store.close()


def test_row_in_use_is_never_evicted_at_minimum_capacity():
    """Random batches at exactly the minimum capacity: in-flight rows stay resident, results match."""
    gen = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, 10, (3, 1), generator=gen) for _ in range(30)]
    for window in (1, 2, 3):
        sets = [{int(i) for i in b[:, 0]} for b in batches]
        m = min_capacity(sets, window)
        store = ScratchPipeStore(hand_spec(batches, window=window, scratchpad_rows=m))
        ref = DeviceStore(hand_spec(batches))
        ref_outs, _ = drive(ref, batches, window)

        def check(s: int) -> None:
            for b in batches[s:s + window + 1] if s else []:
                slots = store.row_to_slot[b[:, 0].numpy()]
                assert (slots >= 0).all() and (store.directory.hold[slots] > 0).all()

        outs, c = drive(store, batches, window, check)
        store.close()
        assert sum(x["evictions"] for x in c) > 0
        for a, b in zip(outs, ref_outs):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(store.export(), ref.export(), rtol=0, atol=0)


def test_lookup_changes_no_state_and_close_is_idempotent():
    batches = as_batches(HAND)
    store = ScratchPipeStore(hand_spec(batches, window=1, scratchpad_rows=4))
    drive(store, batches[:3], 1)
    d = store.directory
    maps = (d.row_to_slot.copy(), d.slot_to_row.copy(), d.hold.copy(), d.last_use.copy())
    counters = store.step_counters()
    table = store.export()
    ids = torch.tensor([[0, 1], [9, 5], [-1, 2]])  # [B=3, K=2], a padded entry
    out = store.lookup(ids)
    assert torch.equal(out[0, 0], table[0]) and torch.equal(out[1, 0], table[9]) and (out[2, 0] == 0).all()
    for before, after in zip(maps, (d.row_to_slot, d.slot_to_row, d.hold, d.last_use)):
        assert np.array_equal(before, after)
    assert store.step_counters() == counters and torch.equal(store.export(), table)
    store.close()
    store.close()
    assert store.pipeline._gatherer._shutdown and store.pipeline._scatterer._shutdown


def test_bad_options_fail_clearly():
    batches = as_batches(HAND)
    with pytest.raises(ConfigError, match="not both"):
        ScratchPipeStore(hand_spec(batches, scratchpad_rows=4, scratchpad_ratio=0.5))
    with pytest.raises(ConfigError, match="window"):
        ScratchPipeStore(hand_spec(batches, window=-1))
    with pytest.raises(ConfigError, match="scratchpad_ratio"):
        ScratchPipeStore(hand_spec(batches, scratchpad_ratio=1.5))
    with pytest.raises(ConfigError, match="unknown option"):
        ScratchPipeStore(hand_spec(batches, cache_ratio=0.1))
    default = ScratchPipeStore(hand_spec(batches))
    assert default.window == 2 and default.capacity == default.min_capacity == 6
    default.close()


def test_report_counts_every_stage_of_the_side_work(small_dataset):
    m = min_capacity(window_sets(run_cfg("device"), small_dataset), 1)
    got = train(run_cfg("scratchpipe", window=1, scratchpad_rows=m + 1), small_dataset, CPU, progress=False)
    r = got.store_report
    stages = [r[f"side_ms_{k}"] for k in ("copy_out", "gather", "scatter", "copy_in")]
    assert all(t > 0 for t in stages), "with evictions every stage does work"
    assert r["side_ms"] == pytest.approx(sum(stages))
    assert 0 <= r["hidden_fraction"] <= 1 and r["wait_ms"] > 0 and r["side_timer"] == "cpu"
