"""``hotcold calibrate``: a small calibration writes a profile the cost model loads, every value measured."""
from __future__ import annotations

import pytest
import torch
import yaml

from hotcold.calibrate import calibrate
from hotcold.cli import main
from hotcold.config import ConfigError
from hotcold.costmodel import HOST_RATES, load_profile

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


@pytest.mark.parametrize("kw, match", [({"device": "tpu"}, "device must be cpu or cuda"),
                                       ({"dim": 0}, "dim must be a positive integer"),
                                       ({"repeats": 1.5}, "repeats must be a positive integer")])
def test_bad_calibration_options_fail_clearly(kw, match):
    with pytest.raises(ConfigError, match=match):
        calibrate(**{**SMALL, **kw})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ConfigError, match="no GPU"):
        calibrate("cuda", **SMALL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here: the CUDA path runs where one is lent")
def test_a_cuda_calibration_names_the_gpu(tmp_path):
    profile = calibrate("cuda", **SMALL)
    name = torch.cuda.get_device_name()
    assert profile["kind"] == "gpu"
    for key in ("pcie_h2d_bw", "pcie_d2h_bw", "device_memory_bw", "device_gather_efficiency", "device_kernel_us"):
        assert name in profile["rates"][key]["source"]
    out = tmp_path / "gpu.yaml"
    out.write_text(yaml.safe_dump(profile))
    assert load_profile(out).value("device_memory_bw") > 0
