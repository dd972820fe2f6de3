"""``hotcold bench embedding`` and ``bench step`` at toy sizes: they run, their numbers hang together, and both
sides of the embedding benchmark train one model."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from hotcold.bench import embedding as bench
from hotcold.cli import main
from hotcold.embedding.fbgemm import available

SMALL = ["--cap", "500", "--batch", "32", "--steps", "2", "--repeats", "2", "--check-steps", "3", "--no-fused"]


def test_bench_embedding_verb_writes_its_table(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "embedding", *SMALL, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gather bandwidth" in text and "sgd" in text and "adagrad" in text
    result = json.loads(out.read_text())
    assert [s["optimizer"] for s in result["step"]] == ["sgd", "adagrad"]
    assert result["step"][0]["peer"] == ("fbgemm tbe" if available() is None else "torch EmbeddingBag")
    for s in result["step"]:
        assert s["hotcold_ms"] > 0 and s["peer_ms"] > 0
        assert s["ratio_min"] <= s["ratio"] <= s["ratio_max"]
        assert s["max_abs_diff"] < 1e-5  # the harness and its peer trained the same weights
    for g in result["gather"]:
        assert g["rows"] == 32 * 26 and g["bytes"] == g["rows"] * 16 * 4
        assert g["share"] == pytest.approx(g["gather_gbs"] / g["memcpy_gbs"])
    assert len(result["config"]["table_sizes"]) == 26 and max(result["config"]["table_sizes"]) == 500


def test_bench_csv_and_bad_options(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    assert main(["bench", "embedding", *SMALL, "--optimizers", "sgd", "--check-steps", "0", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("kind,") and sum(line.startswith("step,") for line in lines) == 1
    assert main(["bench", "embedding", *SMALL, "--steps", "0"]) == 2
    assert "steps must be an integer >= 1" in capsys.readouterr().err
    assert main(["bench", "embedding", *SMALL, "--out", str(tmp_path / "x.txt")]) == 2


def test_torch_bag_peer_trains_the_same_model():
    """The fallback peer (no FBGEMM) applies the same SGD and row-wise Adagrad as the harness."""
    cfg = bench.BenchConfig(cap=300, batch=64, check_steps=4, fused=False)
    sizes = cfg.sizes()
    batches = bench.zipf_batches(sizes, cfg.batch, cfg.zipf, 4, 0)
    grads = [torch.randn(cfg.batch, len(sizes), cfg.dim) for _ in batches]
    for kind in ("sgd", "adagrad"):
        diff = bench.weight_agreement(cfg, kind, bench.TorchBagSide, batches, grads, torch.device("cpu"))
        assert diff < 1e-6


def test_zipf_batches_are_skewed_and_in_range():
    sizes = [10, 1000]
    b = bench.zipf_batches(sizes, 4000, 1.2, 2, 0)
    assert len(b) == 2 and b[0].shape == (4000, 2) and b[0].dtype == torch.int64
    assert int(b[0][:, 0].max()) < 10 and int(b[0][:, 1].max()) < 1000 and int(b[0].min()) >= 0
    counts = np.bincount(b[0][:, 1].numpy(), minlength=1000)
    assert counts[0] > counts[10] > counts[500]          # most popular first, by a wide margin
    assert not torch.equal(b[0], b[1])


def test_peer_falls_back_to_embedding_bag_saying_why(tmp_path):
    """FBGEMM takes dims that are multiples of 4 only: at dim 6 the EmbeddingBag peer runs, and the note says why."""
    out = tmp_path / "b.json"
    assert main(["bench", "embedding", *SMALL, "--dim", "6", "--optimizers", "adagrad", "--out", str(out)]) == 0
    step = json.loads(out.read_text())["step"][0]
    assert step["peer"] == "torch EmbeddingBag" and step["peer_note"]
    assert step["max_abs_diff"] < 1e-6


# -- hotcold bench step ------------------------------------------------------------------------------------------

def test_op_count_counts_kernels_not_views():
    from hotcold.bench.opcount import OpCount

    a, b = torch.ones(4, 3), torch.ones(4, 3)
    with OpCount() as ops:
        c = (a + b).view(12)   # one add, one view
        c.mul_(2)              # one in-place multiply
        torch._foreach_add_([a, b], 1.0)  # one multi-tensor op for both
    assert ops.total == 3 and ops.views == 1
    assert dict(ops.ops) == {"aten.add": 1, "aten.mul_": 1, "aten._foreach_add_": 1}


def test_bench_step_counts_and_times_each_method(small_dataset, tmp_path, capsys):
    out = tmp_path / "step.json"
    assert main(["bench", "step", "--dataset", str(small_dataset.path), "--methods", "device", "hybrid",
                 "--batch", "128", "--steps", "3", "--warmup", "2", "--repeats", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "device" in printed and "hybrid" in printed and "load average" in printed
    got = {m["method"]: m for m in json.loads(out.read_text())["methods"]}
    for m in got.values():
        # the training thread plans the step itself with the pipeline off: more operations than with it on
        assert 0 < m["ops_on"] < m["ops_off"]
        assert m["op_counts_off"]["aten.ge"] == 1 and "aten.ge" not in m["op_counts_on"]  # the padding mask
        assert m["op_counts_on"]["hotcold.fused_step"] == 1  # the sparse step: one compiled kernel
        assert m["step_ms_off"] > 0 and m["step_ms_on"] > 0 and m["prepare_ms_off"] > 0
    assert main(["bench", "step", "--dataset", str(small_dataset.path), "--methods", "nosuch"]) == 2
    assert "no benchmark setting for ['nosuch']" in capsys.readouterr().err


def test_bench_step_on_meta_times_the_host_and_counts_its_waits(small_dataset, tmp_path, capsys):
    """On meta a GPU step's device side has no values: every method's steps run there (a read of device values on
    the host would fail), and the host's waits for the device are counted by thread and reason."""
    out = tmp_path / "host.json"
    assert main(["bench", "step", "--device", "meta", "--dataset", str(small_dataset.path), "--methods", "device",
                 "hybrid", "scratchpipe", "--batch", "128", "--steps", "3", "--warmup", "2", "--repeats", "1",
                 "--out", str(out)]) == 0
    assert "the host's work of a GPU step" in capsys.readouterr().out
    got = {m["method"]: m for m in json.loads(out.read_text())["methods"]}
    for m in got.values():  # a difference of two medians: at this size it may come out below zero
        assert math.isfinite(m["prepare_ms"]) and m["ops"] > 0 and m["device_calls"] > 0
    assert got["device"]["waits_per_step"] == {}
    assert got["hybrid"]["waits_per_step"] == {"training: hybrid's gradients": 1}  # the baseline's synchronous update
