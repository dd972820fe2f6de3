"""Run records: complete or absent, traceable, with comparable parameter sketches."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from hotcold.cli import main
from hotcold.record_status import record_status, sketch_rel_diff
from hotcold.runs.records import param_checksum, param_fingerprint, steps_frame, write_run

RUN = {"dataset": "small", "method": "hybrid", "variant": "base", "seed": 0,
       "model": {"embedding_dim": 8, "bottom_mlp": [8], "top_mlp": [8, 1]},
       "train": {"steps": 12, "warmup_steps": 2, "batch_size": 64, "eval_batch_size": 256}}


def test_sketch_estimates_relative_difference():
    gen = torch.Generator().manual_seed(0)
    a = [("w", torch.randn(5000, 16, generator=gen)), ("b", torch.randn(7, generator=gen))]
    fa = param_fingerprint(a)
    assert sketch_rel_diff(fa["sketch"], fa["sketch"]) == 0.0
    for scale in (1e-7, 1e-3):
        b = [(n, t + scale * torch.randn(t.shape, generator=gen)) for n, t in a]
        true = (sum(float((x - y).pow(2).sum()) for (_, x), (_, y) in zip(a, b))
                / sum(float(x.pow(2).sum()) for _, x in a)) ** 0.5
        est = sketch_rel_diff(param_fingerprint(b)["sketch"], fa["sketch"])
        assert true / 2 < est < true * 2
    assert fa["norm"] == pytest.approx(sum(float(t.pow(2).sum()) for _, t in a) ** 0.5, rel=1e-6)


def _formula_sketch(named) -> list[float]:
    """The count sketch by its definition, in plain Python: element i of the concatenation adds s(i) x to h(i)."""
    out, i = [0.0] * 256, 0
    for _, t in named:
        for x in t.reshape(-1).tolist():
            out[((i * 1_103_515_245 + 12_345) % 2_147_483_647) % 256] += (
                x * ((((i * 214_013 + 2_531_011) % 2_147_483_647) & 1) * 2 - 1))
            i += 1
    return out


@pytest.mark.parametrize("kernel", ["numba", "python"])
def test_the_sketch_is_its_formula_on_either_path(kernel, monkeypatch):
    """The compiled pass and torch's chunked one (where numba is absent) give the definition's sums: on small
    tensors against the formula itself, and across torch's chunk boundary (2^22 elements) against each other."""
    from hotcold.runs import records

    if kernel == "numba" and records.KERNEL != "numba":
        pytest.skip("numba is not installed: only torch's path runs here")
    monkeypatch.setattr(records, "KERNEL", kernel)
    gen = torch.Generator().manual_seed(1)
    small = [("w", torch.randn(3, 5, generator=gen)), ("b", torch.randn(7, generator=gen))]
    assert param_fingerprint(small)["sketch"] == pytest.approx(_formula_sketch(small), rel=1e-12, abs=1e-12)
    big = [("b", torch.randn(7, generator=gen)), ("w", torch.randn((1 << 22) + 9, generator=gen))]
    got = param_fingerprint(big)
    monkeypatch.setattr(records, "KERNEL", "python")
    want = param_fingerprint(big)
    assert got["sketch"] == pytest.approx(want["sketch"], rel=1e-12) and got["checksum"] == want["checksum"]
    assert got["norm"] == pytest.approx(want["norm"], rel=1e-12)


def test_checksum_is_bit_exact():
    t = torch.ones(4, 4)
    u = t.clone()
    u[2, 2] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    assert param_fingerprint([("t", t)])["checksum"] == param_fingerprint([("t", t.clone())])["checksum"]
    assert param_fingerprint([("t", t)])["checksum"] != param_fingerprint([("t", u)])["checksum"]
    assert param_checksum([("t", u), ("v", t)]) == param_fingerprint([("t", u), ("v", t)])["checksum"]


def test_interrupted_write_leaves_nothing_complete(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "record.json").write_text("{}")  # a stale record from an earlier run

    def die(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", die)
    with pytest.raises(KeyboardInterrupt):
        write_run(out, {"x": 1}, steps_frame([(0, {"data": 1.0})], []))
    assert sorted(p.name for p in out.iterdir()) == []


def test_train_verb_writes_a_traceable_record(tmp_path, small_dataset):
    out = tmp_path / "runs" / "small" / "hybrid" / "base" / "seed~0"
    code = main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(RUN),
                 "--out", str(out), "--threads", "1", "--no-progress"])
    assert code == 0
    rec = json.loads((out / "record.json").read_text())
    assert (rec["dataset"], rec["method"], rec["variant"], rec["seed"]) == ("small", "hybrid", "base", 0)
    assert rec["dataset_manifest_sha256"] == small_dataset.manifest_sha256
    prov = rec["provenance"]
    for key in ("device", "cpu", "torch", "threads", "git_commit", "timer", "python"):
        assert prov[key] not in (None, ""), key
    assert prov["threads"] == 1 and prov["timer"] == "cpu"
    assert rec["config"]["train"]["steps"] == 12
    s = rec["summary"]
    assert s["steps_timed"] == 10 and s["samples_per_s"] > 0
    assert sum(s["phase_ms_mean"].values()) == pytest.approx(s["step_ms_mean"])
    assert 0 <= rec["metrics"]["auc"] <= 1 and rec["metrics"]["logloss"] > 0
    assert len(rec["params"]["sketch"]) == 256 and len(rec["params"]["checksum"]) == 64

    steps = pd.read_parquet(out / "steps.parquet")
    assert list(steps.columns) == ["step", "kind", "name", "value", "repeat"]
    assert set(steps.kind) == {"phase", "counter"} and set(steps.repeat) == {0}
    assert sorted(steps[steps.kind == "phase"].step.unique()) == list(range(2, 12))
    assert sorted(steps[steps.kind == "counter"].step.unique()) == list(range(12))
    lookups = steps[(steps.kind == "counter") & (steps.name == "lookups")].value
    assert (lookups == 64 * len(small_dataset.cardinalities)).all()


@pytest.mark.parametrize("method, store, where", [
    ("lru", {"cache_rows": 1}, "too small"),                    # fails in the first training step
    ("scratchpipe", {"window": 1, "scratchpad_rows": 1}, "cannot hold the look-ahead working set"),  # at build
])
def test_an_infeasible_variant_ends_as_a_complete_record(tmp_path, small_dataset, method, store, where):
    out = tmp_path / "runs" / "small" / method / "tiny" / "seed~0"
    run = {**RUN, "method": method, "variant": "tiny", "store": store}
    code = main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(run),
                 "--out", str(out), "--threads", "1", "--no-progress"])
    assert code == 0
    rec = json.loads((out / "record.json").read_text())
    assert rec["status"] == "infeasible" and where in rec["reason"]
    assert rec["config"]["store"] == store and rec["dataset_manifest_sha256"] == small_dataset.manifest_sha256
    assert rec["provenance"]["timer"] == "cpu" and rec["provenance"]["git_commit"]
    assert not {"summary", "metrics", "params", "store"} & set(rec)
    steps = pd.read_parquet(out / "steps.parquet")
    assert steps.empty and list(steps.columns) == ["step", "kind", "name", "value", "repeat"]


def test_a_trained_record_says_ok(tmp_path, small_dataset):
    out = tmp_path / "run"
    assert main(["train", "--dataset", str(small_dataset.path), "--run-config", json.dumps(RUN),
                 "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    rec = json.loads((out / "record.json").read_text())
    assert rec["status"] == "ok" and "reason" not in rec and record_status(rec) == "ok"
    assert record_status({k: v for k, v in rec.items() if k != "status"}) == "ok"  # older records
