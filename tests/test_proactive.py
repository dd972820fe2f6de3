"""Proactive over every window, in one process: exact, early lookups as an independent count, the same early
share at every depth, per-window records that add up, and a negative control that reads rows before their
update and must diverge (the multi-rank cases and their negative control: tests/test_distributed.py)."""
from __future__ import annotations

import numpy as np
import pytest
from distributed_worker import reads_before_update
from test_distributed import CPU, case_cfg, reference
from test_stores import rel_diff

from hotcold.distributed.proactive import WINDOWS, ProactiveStore
from hotcold.data.order import global_batches
from hotcold.train import train


def proactive(ds, depth: int = 1, plan: str = "row", opt: str = "adagrad"):
    return train(case_cfg("proactive", plan, {"depth": depth}, opt), ds, CPU, progress=False)


def expected_early(ds, cfg) -> list[int]:
    """One rank, every row sharded: step j's lookups whose row step j - 1 does not look up (none at step 0)."""
    out, prev = [], None
    for rows in global_batches(ds, cfg):
        valid = rows[rows >= 0]
        out.append(0 if prev is None else int((~np.isin(valid, prev)).sum()))
        prev = valid
    return out


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_early_lookups_are_an_independent_count_at_every_depth(sequence_dataset, depth):
    cfg = case_cfg("proactive", "row", {"depth": depth}, "adagrad")
    got = train(cfg, sequence_dataset, CPU, progress=False)
    assert [c["early_lookups"] for _, c in got.counters] == expected_early(sequence_dataset, cfg)
    assert rel_diff(got.named_parameters(), reference(sequence_dataset, "adagrad").named_parameters()) <= 1e-6


def test_windows_add_up(small_dataset):
    report = proactive(small_dataset, depth=2).store_report
    served = sum(report["served_lookups_per_rank"])
    windows = report["windows"]
    assert set(windows) == set(WINDOWS)
    assert sum(w["lookups"] for w in windows.values()) + report["late_lookups"] == served
    assert report["early_lookup_share"] > 0
    for w in windows.values():
        assert 0 <= w["hidden_ms"] <= w["ms"] and 0 <= w["hidden_share"] <= 1
    assert sum(report[f"hidden_share_{w}"] for w in WINDOWS) == pytest.approx(report["hidden_lookup_share"])
    # one process: no collective is ever in flight, so nothing is hidden and the early rows are looked up
    # at the end of the gradient window (their last chance)
    assert report["hidden_lookup_share"] == 0
    assert windows["grad_a2a"]["lookups"] == report["early_lookup_share"] * served


@pytest.mark.parametrize("plan", ["row", "flexshard"])
def test_negative_control_reading_rows_before_their_update_diverges(small_dataset, monkeypatch, plan):
    """The exactness check can fail: eligibility that forgets the rows updated in between trains another model."""
    want = reference(small_dataset, "adagrad").named_parameters()
    assert rel_diff(proactive(small_dataset, plan=plan).named_parameters(), want) <= 1e-6
    monkeypatch.setattr(ProactiveStore, "eligible", reads_before_update)
    assert rel_diff(proactive(small_dataset, plan=plan).named_parameters(), want) > 1e-3
