"""The cost model where a GPU step is bound by launching ops and by the host: launch rates, CUDA graphs, the step
pipeline, and the model against the committed GPU runs (docs/evidence/). Hand computations on small cases."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hotcold import methods
from hotcold.costmodel import ModelShape, Workload, load_profile, predict
from hotcold.costmodel.prediction import PLANNED
from hotcold.costmodel.pricing import Costs
from hotcold.counters import FLOAT_BYTES

from test_costmodel import CPU_RATES, GPU_EXTRA, _profile

REPO = Path(__file__).resolve().parents[1]
SHAPE = ModelShape(num_dense=13, num_tables=26, dim=16, bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1),
                   rows=1_000_000)
LAUNCH = {"dense_op_us": 30.0, "dense_graph_op_us": 3.0, "dense_flops": 20_000.0}


def _device(batch: int, **kw) -> Workload:
    return Workload("device", batch, {"lookups": 26.0 * batch, "unique_rows": 5.0 * batch}, SHAPE, "adagrad", **kw)


def _dense_ms(w: Workload, profile) -> float:
    return predict(w, profile, methods.price("device")).phases_ms["dense_fwd_bwd"]


@pytest.mark.parametrize("batch", [256, 2048, 1 << 18])
def test_an_eager_gpu_dense_step_takes_the_longer_of_launching_and_running_its_ops(batch):
    w, p = _device(batch), _profile("gpu", **LAUNCH)
    ops, flops = SHAPE.dense_ops(), SHAPE.flops_per_sample() * batch
    launch, run = ops * 30e-3, ops * 3e-3 + flops / 20_000e6
    assert _dense_ms(w, p) == pytest.approx(max(launch, run))
    assert (launch > run) == (batch < 1 << 18)  # small batches are launch-bound, the largest is not


def test_a_graphed_dense_step_runs_its_kernels_and_copies_its_inputs_in():
    batch = 2048
    w, p = _device(batch, dense_graphed=True), _profile("gpu", **LAUNCH)
    inputs = batch * (13 + 26 * 16 + 2) * FLOAT_BYTES
    expected = (5 * 30e-3 + 2 * inputs / (GPU_EXTRA["device_memory_bw"] * 1e6) + SHAPE.dense_ops() * 3e-3
                + SHAPE.flops_per_sample() * batch / 20_000e6)
    assert _dense_ms(w, p) == pytest.approx(expected)
    assert _dense_ms(w, p) < _dense_ms(dataclasses.replace(w, dense_graphed=False), p)


def test_a_profile_without_launch_rates_prices_the_dense_step_as_dispatch_then_arithmetic():
    w, p = _device(2048), _profile("gpu", dense_flops=20_000.0)
    op_us = max(CPU_RATES["host_op_us"], GPU_EXTRA["device_kernel_us"])
    expected = SHAPE.dense_ops() * op_us * 1e-3 + SHAPE.flops_per_sample() * 2048 / 20_000e6
    assert _dense_ms(w, p) == pytest.approx(expected)
    assert _dense_ms(dataclasses.replace(w, dense_graphed=True), p) == pytest.approx(expected)


def test_an_op_on_a_gpu_costs_the_calibrated_eager_op_and_a_shipped_tensor_three():
    with_rate, without = Costs(_profile("gpu", **LAUNCH)), Costs(_profile("gpu"))
    assert with_rate.ops(10) == pytest.approx(10 * 30e-3)
    assert without.ops(10) == pytest.approx(10 * GPU_EXTRA["device_kernel_us"] * 1e-3)
    assert with_rate.ship(1000, 2) == pytest.approx(with_rate.h2d(1000, 2) + 6 * 30e-3)
    assert Costs(_profile("cpu")).ship(1000, 2) == 0


@pytest.mark.parametrize("method", ["device", "hybrid", "fae", "lru", "scratchpipe"])
@pytest.mark.parametrize("batch", [64, 4096])
def test_a_pipelined_step_takes_the_longer_of_training_and_planning_the_next(method, batch):
    """The planned terms leave the step; the training thread waits for what they exceed the rest by."""
    p = _profile("gpu", **LAUNCH)
    w = Workload(method, batch, {"lookups": 26.0 * batch, "unique_rows": 5.0 * batch, "hot_batch": 0.5,
                                 "param_rows_h2d": 0.1 * batch, "param_rows_d2h": 0.1 * batch, "evictions": 1.0},
                 SHAPE, "adagrad", report={"capacity": 20_000, "hot_rows": 20_000, "window": 2})
    price = methods.price(method)
    off, on = predict(w, p, price), predict(dataclasses.replace(w, pipelined=True), p, price)

    def planned(key: str) -> bool:
        name = key.split(".", 1)[1]
        return (name.split("_", 1)[1] if name.startswith(("hot_", "cold_")) else name) in PLANNED

    prepare = sum(ms for k, ms in off.terms_ms.items() if planned(k))
    train = off.step_ms - prepare
    assert prepare > 0
    assert on.step_ms == pytest.approx(max(train, prepare))
    assert on.terms_ms["data.pipeline_wait"] == pytest.approx(max(0.0, prepare - train))
    pipeline_hidden = sum(ms for k, ms in on.hidden_ms.items() if k.startswith("pipeline_"))
    assert pipeline_hidden == pytest.approx(prepare - on.terms_ms["data.pipeline_wait"])


def _step_errors(profile: str, *sets: str) -> dict[str, float]:
    """Each committed run's modelled step error, as ``hotcold costmodel-validation`` computes it."""
    from hotcold.analysis.costmodel_validation import validation_frame

    prof = load_profile(REPO / "workflows" / "config" / "hardware" / f"{profile}.yaml")
    out = {}
    for s in sets:
        records = [json.loads(f.read_text()) for f in sorted((REPO / "docs" / "evidence" / s).rglob("record.json"))]
        frame = validation_frame(records, prof)
        out.update({f"{r.method}/{r.variant} ({s})": r.rel_error for r in frame[frame.phase == "step"].itertuples()})
    return out


#: what the model leaves out, known and measured: ScratchPipe's movers share the host with its training thread
#: (docs/costmodel.md, "Validation on a GPU")
KNOWN_MISSES = {"scratchpipe": 0.35}


def test_the_model_meets_the_runs_of_the_machine_its_profile_was_calibrated_on():
    """The H200's calibration and runs of one call (docs/evidence/2026-11-27-h200): the default-scale runs,
    pipeline and graphs off, and 0c0d3eb's full-size runs: every step within 25%, but the known misses."""
    errors = _step_errors("h200-calibrated-2026-11-27", "2026-11-27-h200/records/default-scale-off",
                          "2026-11-27-h200/records/full-size-0c0d3eb-call1")
    assert len(errors) == 14
    for run, err in errors.items():
        assert abs(err) <= KNOWN_MISSES.get(run.split("/")[0], 0.25), (run, err)
