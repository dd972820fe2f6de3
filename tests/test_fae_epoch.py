"""FAE timed on its epoch: the timed steps hold the epoch's hot:cold batch ratio and its syncs pro rata, and a
budget where every batch is hot (or none is) is marked, not silently a ``device`` (``hybrid``) run."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from hotcold.analysis.summary import SUMMARY_COLUMNS, summary_frame
from hotcold.config import TrainConfig, read_yaml
from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.data.generators.config import GeneratorConfig
from hotcold.data.generators.run import generate
from hotcold.embedding.base import StoreSpec
from hotcold.embedding.fae import FAEProfile, FAEStore
from hotcold.embedding.update import RowOptimizer
from hotcold.policies.fae_schedule import classify_samples, order_kinds, period_kinds, sync_steps
from hotcold.train import default_order, reference, train

from test_fae import fae_cfg, train_rows
from test_stores import rel_diff

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 0.02   # timed hot-batch share vs the epoch's


def epoch_counts(is_hot: np.ndarray, batch_size: int) -> tuple[int, int]:
    """Hot and cold batches an epoch: each kind's inputs cut into full batches."""
    return int(is_hot.sum()) // batch_size, int((~is_hot).sum()) // batch_size


def batch_kinds(ds, order: list[np.ndarray], hot_rows: np.ndarray) -> list[bool]:
    """Whether each batch is hot (every lookup a hot row), from the data; a batch must be all hot or all cold."""
    hot = np.zeros(sum(ds.cardinalities), dtype=bool)
    hot[hot_rows] = True
    start = ds.split("train")[0]
    kinds = []
    for rows in order:
        g = ds.global_ids(rows + start)  # [B, K], -1 at padding
        per_input = (hot[np.maximum(g, 0)] | (g < 0)).all(axis=1)
        assert per_input.all() or not per_input.any(), "a batch mixes hot and cold inputs"
        kinds.append(bool(per_input.all()))
    return kinds


# --- the trained store, on the test fixture's data ----------------------------------------------------------------

@pytest.mark.parametrize("steps", [30, 120])   # shorter than its epoch of 94 batches of 32, and longer
def test_trained_timed_hot_share_is_the_epochs(small_dataset, steps):
    """The timed steps' hot batches (counted by the store) are the epoch's share (from the data) within 2 points.

    Fails on the truncated epoch (cold batches first): 7% hot among the 28 timed steps of 30 and 57% among
    those of 120, against the epoch's 71% (checked on the code before the scaled epoch).
    """
    cfg = fae_cfg(steps=steps)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=32))
    got = train(cfg, small_dataset, CPU, progress=False)
    warmup = cfg.train.warmup_steps
    hot_set = set(got.store.hot_rows.tolist())
    is_hot = np.array([all(r in hot_set for r in sample) for sample in train_rows(small_dataset)])
    n_hot, n_cold = epoch_counts(is_hot, cfg.train.batch_size)
    assert 0.2 < n_hot / (n_hot + n_cold) < 0.8, "the budget must mix hot and cold batches"
    timed = [c["hot_batch"] for step, c in got.counters if step >= warmup]
    assert len(timed) == steps - warmup
    assert abs(np.mean(timed) - n_hot / (n_hot + n_cold)) <= TOLERANCE
    report = got.store_report
    assert (report["epoch_batches"], report["epoch_switches"]) == (n_hot + n_cold, 2)
    assert report["epoch_hot_share"] == pytest.approx(n_hot / (n_hot + n_cold))
    assert report["timed_hot_share"] == pytest.approx(np.mean(timed)) and report["timed_steps"] == len(timed)
    switches = sum(c["switches"] for step, c in got.counters if step >= warmup)
    assert report["timed_switches"] == switches == (1 if steps - warmup < n_hot + n_cold else 3)
    assert report["degenerate"] is None and "scaled epoch" in report["timed_selection"]
    # the invariant: the device store replaying FAE's (scaled) order trains the same model
    ref = reference(cfg, small_dataset, CPU, got.order, progress=False)
    assert rel_diff(got.named_parameters(), ref.named_parameters()) <= 1e-6


# --- the default budgets on the default Kaggle-style data ---------------------------------------------------------

def default_config() -> dict:
    return read_yaml(REPO / "workflows/config/default.yaml")


@pytest.fixture(scope="module")
def kaggle_style(tmp_path_factory):
    """The default workflow's kaggle dataset (workflows/config/default.yaml's generator)."""
    out = tmp_path_factory.mktemp("data") / "kaggle"
    generate(GeneratorConfig.from_dict(default_config()["datasets"]["kaggle"]["generator"]), out, progress=False)
    return Dataset.open(out)


@pytest.mark.parametrize("variant", ["6.2pct", "12.4pct", "24.8pct"])
def test_default_budgets_on_default_kaggle_data(kaggle_style, variant):
    """At FAE's three default budgets with the default steps and warm-up: the store's order holds the epoch's hot
    share within 2 points, every batch pure, and 24.8% (every input hot on this data) reported all-hot."""
    ds, t = kaggle_style, TrainConfig()   # the schema's train defaults: 1,024 a batch, 200 steps, 20 warm-up
    options = default_config()["methods"]["fae"][variant]
    spec = StoreSpec(table_sizes=ds.cardinalities, dim=16, optimizer=RowOptimizer("adagrad", lr=0.05), device=CPU,
                     seed=0, options=options, column_tables=ds.column_tables, warmup_steps=t.warmup_steps)
    cfg = RunConfig.from_dict({"dataset": "kaggle", "method": "fae", "seed": 0, "store": options})
    order = list(FAEStore.schedule(spec, ds, default_order(cfg, ds)))
    prof = FAEProfile.of(spec)
    assert len(order) == t.steps and all(len(b) == t.batch_size for b in order)
    kinds = batch_kinds(ds, order, prof.hot_rows.numpy())
    n_hot, n_cold = epoch_counts(classify_samples(ds, prof.hot_rows.numpy()), t.batch_size)
    timed = kinds[t.warmup_steps:]
    assert abs(np.mean(timed) - n_hot / (n_hot + n_cold)) <= TOLERANCE
    report = prof.order
    assert report["timed_hot_share"] == pytest.approx(np.mean(timed))
    assert report["degenerate"] == ("all-hot" if n_cold == 0 else "all-cold" if n_hot == 0 else None)
    if variant == "24.8pct":
        assert report["degenerate"] == "all-hot", "every input is hot at 24.8% of this data's rows"
    else:
        assert report["degenerate"] is None and report["timed_switches"] == 1  # 180 timed steps < 219 an epoch


# --- paper.yaml, dry: the selection at its steps and an epoch of Criteo Kaggle's size -----------------------------

def paper_run() -> tuple[int, int, int]:
    """paper.yaml's steps and warm-up, and the batches of an epoch of full Criteo Kaggle at its batch size."""
    train_cfg = read_yaml(REPO / "workflows/config/paper.yaml")["train"]
    batch = train_cfg.get("batch_size", TrainConfig().batch_size)
    samples = 45_840_617 * 6 // 7   # six of its seven days train
    return train_cfg["steps"], train_cfg["warmup_steps"], samples // batch


@pytest.mark.parametrize("run_length", ["epoch", 1, 16, 128])
@pytest.mark.parametrize("hot_share", [0.05, 0.3, 0.6, 0.9, 0.948, 0.99])
def test_paper_timed_share_and_switches_are_the_epochs(hot_share, run_length):
    steps, warmup, per_epoch = paper_run()
    assert steps < per_epoch / 10 and 37_000 < per_epoch < 40_000
    n_hot = round(hot_share * per_epoch)
    n_cold = per_epoch - n_hot
    # the first `steps` batches of the authors' epoch (the order before): all cold below 94.8% hot
    truncated = period_kinds(n_hot, n_cold, "epoch", 0, 0)[:steps]
    if hot_share < 0.948:
        assert not truncated[warmup:].any()
    kinds = order_kinds(n_hot, n_cold, steps, warmup, run_length, seed=0)
    timed = kinds[warmup:]
    assert len(kinds) == steps
    assert abs(timed.mean() - n_hot / per_epoch) <= min(TOLERANCE, 0.5 / len(timed))
    assert int(kinds[:warmup].sum()) == round(warmup * n_hot / per_epoch)
    switches = int(sync_steps(kinds)[warmup:].sum())
    epoch = period_kinds(n_hot, n_cold, run_length, 0, 0)
    pro_rata = ((epoch[1:] != epoch[:-1]).sum() + (epoch[-1] != epoch[0])) * len(timed) / per_epoch
    if run_length == "epoch":
        assert switches == 1 and pro_rata < 1   # the one cold->hot switch a window shorter than the epoch needs
    else:
        assert abs(switches - pro_rata) <= 3 * math.sqrt(pro_rata) + 2, (switches, pro_rata)


def test_order_kinds_keep_whole_epochs_and_scale_the_rest():
    """Small exact cases: whole epochs as the authors', the rest scaled, the warm-up reversed."""
    # two whole epochs, then 2 batches scaled: 1.5 hot rounds up to 2
    assert order_kinds(3, 1, 10, 0, "epoch", 0).astype(int).tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    assert order_kinds(3, 1, 11, 0, "epoch", 0).astype(int).tolist() == [0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    # 5 warm-up steps (an epoch and a scaled 1, reversed: they end cold), then 6 timed: an epoch and a scaled 2
    assert order_kinds(3, 1, 11, 5, "epoch", 0).astype(int).tolist() == [1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1]
    assert order_kinds(0, 5, 7, 2, "epoch", 0).tolist() == [False] * 7
    assert order_kinds(5, 0, 7, 2, 3, 0).tolist() == [True] * 7
    kinds = order_kinds(40, 60, 50, 0, 1, 7)   # half an epoch, per-batch interleave
    assert kinds.sum() == 20


# --- the mark ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget, mark", [({"budget_ratio": 1.0}, "all-hot"), ({"budget_ratio": 0.0}, "all-cold")])
def test_a_degenerate_budget_is_marked_in_the_summary(small_dataset, budget, mark):
    """Every input hot (the device store's run) or none (hybrid's): the store report and summary.csv say so."""
    got = train(fae_cfg(budget, steps=12), small_dataset, CPU, progress=False)
    assert got.store_report["degenerate"] == mark
    rec = {"dataset": "small", "method": "fae", "variant": "v", "seed": 0, "status": "ok",
           "summary": {**got.summary, "world": 1, "ranks_per_node": 1},
           "provenance": {"device": "cpu", "cpu": "TestCPU", "threads": 1, "timer": "cpu"},
           "config": {"distributed": {"world": 1, "ranks_per_node": 1}, "store": budget},
           "store": got.store_report, "metrics": got.metrics}
    plain = dict(rec, variant="w", store={**got.store_report, "degenerate": None})
    summary = summary_frame([rec, plain]).set_index("variant")
    assert "degenerate" in SUMMARY_COLUMNS
    assert summary.loc["v", "degenerate"] == mark and pd.isna(summary.loc["w", "degenerate"])
