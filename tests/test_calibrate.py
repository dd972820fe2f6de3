"""``hotcold calibrate``: a small calibration writes a profile the cost model loads, every value measured."""
from __future__ import annotations

import pytest
import torch
import yaml

from hotcold.calibrate.profile import calibrate
from hotcold.calibrate.host import SMALL_TABLE_MIB
from hotcold.calibrate.network import fit_latency_bandwidth
from hotcold.cli import main
from hotcold.config import ConfigError
from hotcold.costmodel import HOST_RATES, load_profile
from hotcold.machine import last_level_cache_bytes

NETWORK = ("collective_latency_us", "intra_node_bw", "inter_node_bw")

SMALL = {"dim": 8, "batch_size": 64, "repeats": 2, "table_mib": 4}


def test_a_cpu_calibration_measures_every_host_rate(tmp_path):
    out = tmp_path / "cpu.yaml"
    assert main(["calibrate", "--out", str(out), "--dim", "8", "--batch-size", "64", "--repeats", "2",
                 "--name", "here"]) == 0
    p = load_profile(out)
    assert p.name == "here" and p.kind == "cpu"
    assert set(HOST_RATES) <= set(p.rates)
    for key, rate in p.rates.items():
        assert rate.value > 0
        assert rate.source.startswith("measured by hotcold calibrate on "), key
    assert "D=8" in p.rates["dense_flops"].source and "batch 64" in p.rates["dense_flops"].source
    # the new rates say what they timed: a table that fits in the cache, the loader, loopback gloo
    assert f"{SMALL_TABLE_MIB} MiB table" in p.rates["host_cached_gather_row_ns"].source
    assert "BatchLoader" in p.rates["host_data_sample_ns"].source
    assert p.value("host_cache_mib") > 0 and p.value("host_cores") >= 1
    if p.value("host_cores") >= 2:  # one-thread processes side by side, one per core
        assert 0 < p.value("host_parallel_efficiency") <= 1 and "at once" in p.rates["host_parallel_efficiency"].source
    for key in NETWORK:
        assert "gloo" in p.rates[key].source
    assert "loopback" in p.rates["inter_node_bw"].source
    assert p.value("intra_node_bw") == p.value("inter_node_bw")


def test_without_network_a_cpu_profile_has_no_collective_rates():
    profile = calibrate(**SMALL, network=False)
    assert not set(NETWORK) & set(profile["rates"]) and "no network rates" in profile["description"]


def test_the_collective_fit_recovers_a_known_line():
    """ms = 0.05 + bytes / 2e6 (50 us, 2 GB/s), exactly and with a point 10% off."""
    points = [(b, 0.05 + b / 2e6) for b in (1024, 65536, 1 << 20, 4 << 20)]
    latency, bw = fit_latency_bandwidth(points)
    assert latency == pytest.approx(50.0) and bw == pytest.approx(2.0)
    noisy = points[:-1] + [(4 << 20, 1.1 * points[-1][1])]
    latency, bw = fit_latency_bandwidth(noisy)
    assert 40 < latency < 60 and 1.7 < bw < 2.0
    # a latency below resolution (a negative intercept) is 0, not negative
    assert fit_latency_bandwidth([(1000, 0.0001), (1_000_000, 0.5)])[0] == 0.0


@pytest.mark.parametrize("points, match", [([(1024, 0.1)], "two sizes"), ([(1024, 0.1), (2048, 0.0)], "positive"),
                                           ([(1024, 0.2), (1 << 20, 0.1)], "do not grow")])
def test_a_collective_fit_without_a_slope_fails_clearly(points, match):
    with pytest.raises(ConfigError, match=match):
        fit_latency_bandwidth(points)


@pytest.mark.parametrize("kw, match", [({"device": "tpu"}, "device must be cpu or cuda"),
                                       ({"dim": 0}, "dim must be a positive integer"),
                                       ({"repeats": 1.5}, "repeats must be a positive integer")])
def test_bad_calibration_options_fail_clearly(kw, match):
    with pytest.raises(ConfigError, match=match):
        calibrate(**{**SMALL, **kw})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the refusal without one cannot be shown here")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ConfigError, match="no GPU"):
        calibrate("cuda", **SMALL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here: the CUDA path runs where one is lent")
def test_a_cuda_calibration_names_the_gpu(tmp_path):
    profile = calibrate("cuda", **SMALL)
    name = torch.cuda.get_device_name()
    assert profile["kind"] == "gpu"
    for key in ("pcie_h2d_bw", "pcie_d2h_bw", "device_memory_bw", "device_gather_efficiency", "device_kernel_us",
                "dense_op_us", "dense_graph_op_us", "dense_flops"):
        assert name in profile["rates"][key]["source"]
    # a small step is bound by launching its ops; a graph launches them at once
    assert profile["rates"]["dense_graph_op_us"]["value"] < profile["rates"]["dense_op_us"]["value"]
    out = tmp_path / "gpu.yaml"
    out.write_text(yaml.safe_dump(profile))
    assert load_profile(out).value("device_memory_bw") > 0


def test_the_last_level_cache_is_the_largest_data_or_unified_one(tmp_path):
    """sysfs cache entries: instruction caches and unreadable sizes are left out; K, M, G and bare bytes read."""
    for i, (kind, size) in enumerate([("Data", "32K"), ("Instruction", "64M"), ("Unified", "1024K"),
                                      ("Unified", "32M"), ("Unified", "12x")]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "type").write_text(kind + "\n")
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20
    (tmp_path / "index5").mkdir()
    (tmp_path / "index5" / "type").write_text("Unified")
    (tmp_path / "index5" / "size").write_text(str(40 << 20))
    assert last_level_cache_bytes(tmp_path) == 40 << 20
    assert last_level_cache_bytes(tmp_path / "missing") is None
