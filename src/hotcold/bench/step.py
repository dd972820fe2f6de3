"""``hotcold bench step``: one training step per method at the Kaggle DLRM shape, counted and timed.

Each method trains through ``train.Trainer`` (the loop of every run) on a
Criteo-Kaggle-style dataset: DLRM's Kaggle model (26 tables of dimension 16,
MLPs 13-512-256-64-16 and 512-256-1), batch 2,048. For each it reports

- the aten operations of one timed step on the training thread, counted by
  a dispatch mode (``OpCount``: views apart), with the step pipeline off (the
  training thread plans the step itself) and on (a worker planned it);
- the step's milliseconds with the pipeline off and on, run in turn
  (off, on, on, off, ...) over ``repeats``, with what the host spent preparing
  a step and the share of it the pipeline hid from the training thread;
- on CUDA, the step eager and with the dense part as a CUDA graph.

On ``meta`` (``--device meta``) it measures what a GPU step asks of the
host alone: the device side runs on meta tensors (shapes, no values), so
it costs the host only its dispatch, and a read of device values on the
host fails instead of stalling. Per method: the host's preparation of a step
(read, plan, copies: the step pipeline's worker on a GPU), the store's own
phases on the training thread, the operations a step dispatches, and the
host's waits for the device a timed step makes (``hotcold.accel``).

What it prints and how to read it: docs/benchmarks.md.
"""
from __future__ import annotations

import dataclasses
import gc
import threading
import time
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from hotcold import accel
from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.machine import load_average
from hotcold.bench.opcount import HostClock, OpCount

#: the methods and options benchmarked by default: the one-process techniques at their headline settings
VARIANTS = {"device": {}, "hybrid": {}, "fae": {"budget_ratio": 0.124, "sample_fraction": 1.0},
            "lru": {"cache_ratio": 0.015}, "lfu": {"cache_ratio": 0.015},
            "freqcache": {"cache_ratio": 0.015, "warmup_ratio": 0.7}, "scratchpipe": {"window": 2}}
KAGGLE_MODEL = {"embedding_dim": 16, "bottom_mlp": [512, 256, 64, 16], "top_mlp": [512, 256, 1]}


@dataclass
class StepBenchConfig:
    """What ``hotcold bench step`` runs (defaults: a capped Kaggle-style step on the CPU, one thread)."""

    methods: tuple[str, ...] = tuple(VARIANTS)
    batch: int = 2048
    steps: int = 30                 # timed steps per run
    warmup: int = 5                 # untimed steps first (the CUDA graph is captured in the last one)
    repeats: int = 3                # runs of each pipeline setting, in turn
    threads: int = 1
    device: str = "cpu"
    cap: int = 200_000              # rows per table of the generated dataset at most (None-like 0: real sizes)
    dataset: str | None = None      # a `hotcold generate` output instead of generating one
    seed: int = 0
    options: dict[str, dict[str, Any]] = field(default_factory=lambda: dict(VARIANTS))

    def validate(self) -> None:
        for name in ("batch", "steps", "warmup", "repeats", "threads"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ConfigError(f"bench step: --{name} must be an integer >= 1, got {v!r}")
        unknown = [m for m in self.methods if m not in self.options]
        if unknown:
            raise ConfigError(f"bench step: no benchmark setting for {unknown}; choose among {list(self.options)}")
        if self.device not in ("cpu", "cuda", "meta"):
            raise ConfigError(f"bench step: --device must be cpu, cuda or meta, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("bench step: --device cuda, but torch sees no GPU here")

    def run_config(self, method: str, pipeline: str, graphs: str) -> RunConfig:
        return RunConfig.from_dict({
            "dataset": "bench", "method": method, "variant": "bench", "seed": self.seed,
            "store": self.options[method], "model": KAGGLE_MODEL,
            "train": {"batch_size": self.batch, "steps": self.warmup + self.steps, "warmup_steps": self.warmup,
                      "pipeline": pipeline, "cuda_graphs": graphs, "eval_samples": self.batch},
        })


def _dataset(cfg: StepBenchConfig, tmp: Path) -> Dataset:
    """The given dataset, or a Kaggle-style one with one epoch of the run's steps (and a test split)."""
    if cfg.dataset:
        return Dataset.open(Path(cfg.dataset))
    from hotcold.data.generators import GeneratorConfig, generate

    gen = GeneratorConfig(kind="criteo-kaggle-style", rows=int(cfg.batch * (cfg.warmup + cfg.steps + 1) / 0.9) + 1,
                          max_rows_per_table=cfg.cap or None, seed=cfg.seed)
    generate(gen, tmp / "kaggle", progress=False)
    return Dataset.open(tmp / "kaggle")


def _trained(cfg: StepBenchConfig, ds: Dataset, method: str, pipeline: str, graphs: str,
             count_step: int | None = None) -> tuple[dict[str, Any], OpCount | None]:
    """One run of ``warmup + steps`` steps (no evaluation); its summary, and the ops of step ``count_step``."""
    from hotcold.train import Trainer

    device = torch.device(cfg.device)
    run = cfg.run_config(method, pipeline, graphs)
    trainer = Trainer(run, ds, device, progress=False)
    counted = None
    try:
        for i in range(run.train.steps):
            if i == count_step:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                with OpCount() as counted:
                    trainer.step(i)
            else:
                trainer.step(i)
        result = trainer.finish(evaluation=False)
    finally:
        trainer.close()
    s = result.summary
    return {"step_ms": s["step_ms_p50"], "host_ms": s.get("host_step_ms_p50", s["step_ms_p50"]),
            "prepare_ms": s.get("prepare_ms_p50"), "prepare_wait_ms": s.get("prepare_wait_ms_p50"),
            "prepare_hidden": s.get("prepare_hidden"), "dense_step": result.store_report["dense_step"],
            "phase_ms": s["phase_ms_p50"]}, counted


def _in_turn(repeats: int) -> Iterator[str]:
    """off, on, on, off, off, on, ...: each setting first as often as the other."""
    for r in range(repeats):
        yield from (("off", "on") if r % 2 == 0 else ("on", "off"))


def bench_method(cfg: StepBenchConfig, ds: Dataset, method: str) -> dict[str, Any]:
    """One method: its ops per timed step and its step times, pipeline off and on (and graphed on CUDA)."""
    ops: dict[str, OpCount] = {}
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for pipeline in _in_turn(cfg.repeats):
        count = cfg.warmup if pipeline not in ops else None  # the first timed step of the first run of each
        got, counted = _trained(cfg, ds, method, pipeline, "off", count)
        if counted is not None:
            ops[pipeline] = counted
        runs[pipeline].append(got)
    out: dict[str, Any] = {"method": method, "options": cfg.options[method]}
    for pipeline, counted in ops.items():
        out[f"ops_{pipeline}"] = counted.total
        out[f"views_{pipeline}"] = counted.views
        out[f"op_counts_{pipeline}"] = dict(counted.ops.most_common())
    for pipeline, got in runs.items():
        out[f"step_ms_{pipeline}"] = float(np.median([g["step_ms"] for g in got]))
        out[f"host_ms_{pipeline}"] = float(np.median([g["host_ms"] for g in got]))
        out[f"prepare_ms_{pipeline}"] = float(np.median([g["prepare_ms"] for g in got]))
        out[f"prepare_wait_ms_{pipeline}"] = float(np.median([g["prepare_wait_ms"] for g in got]))
        out[f"phase_ms_{pipeline}"] = got[0]["phase_ms"]
    # the share of a step's preparation (the training thread's own, pipeline off) that the training thread no
    # longer waits for (pipeline on); and the share of it the step got shorter by (noisier: a difference of steps)
    out["prepare_hidden"] = 1 - out["prepare_wait_ms_on"] / out["prepare_ms_off"] if out["prepare_ms_off"] > 0 \
        else float("nan")
    saved = out["step_ms_off"] - out["step_ms_on"]
    out["step_saved_share"] = saved / out["prepare_ms_off"] if out["prepare_ms_off"] > 0 else float("nan")
    if cfg.device == "cuda":
        graphed = [_trained(cfg, ds, method, "on", "on", cfg.warmup) for _ in range(cfg.repeats)]
        out["ops_graph"] = graphed[0][1].total
        out["step_ms_graph"] = float(np.median([g["step_ms"] for g, _ in graphed]))
        out["host_ms_graph"] = float(np.median([g["host_ms"] for g, _ in graphed]))
        out["dense_step_graph"] = graphed[0][0]["dense_step"]
    return out


#: the phases a store marks on the training thread (the dense step and the wait for the batch apart)
STORE_PHASES = ("h2d", "emb_fwd", "d2h", "emb_update")


#: the reader threads' name (``loader.ReadAhead``): their time is the batch read's, shown apart from a store's
READER = "hotcold-read"


def _other_threads_cpu_ns() -> dict[int, tuple[str, int]]:
    """Every other live thread (the readers, a store's side threads) by ident: its name less its number, and the
    CPU time it has spent."""
    now: dict[int, tuple[str, int]] = {}
    for t in threading.enumerate():
        if t.ident is None or t.ident == threading.get_ident():
            continue
        try:
            now[t.ident] = (t.name.rsplit("_", 1)[0], time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident)))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clock on this platform
            continue
    return now


def _add_cpu_since(before: dict[int, tuple[str, int]], into: dict[str, int]) -> None:
    """Add to ``into``, by thread name, the CPU time each thread spent since ``before`` (a thread new since then
    from 0; one ended meanwhile is left out: its last part is lost)."""
    for ident, (name, ns) in _other_threads_cpu_ns().items():
        into[name] = into.get(name, 0) + ns - before.get(ident, (name, 0))[1]


def _host_only(cfg: StepBenchConfig, ds: Dataset, method: str) -> dict[str, Any]:
    """One run on ``meta`` with the pipeline off (each step prepared on the training thread, first thing).

    The steps are timed by ``HostClock`` (the training thread's CPU time less
    meta's shape computations and the clock's own cost), then one more step is counted by
    ``OpCount``. Per timed step: the preparation (the ``data`` phase), the
    store's phases, the torch calls that made device tensors, and the host's
    waits for the device by thread and reason.
    """
    from hotcold.timing import PhaseTimer
    from hotcold.train import Trainer

    run = dataclasses.replace(cfg, steps=cfg.steps + 1).run_config(method, "off", "off")
    trainer = Trainer(run, ds, torch.device("meta"), progress=False)
    waits: dict[str, int] = {}
    side: dict[str, int] = {}
    try:
        with HostClock() as host:
            trainer.timer = PhaseTimer("cpu", warmup=cfg.warmup, window=run.timing.window, clock=host.clock)
            for i in range(cfg.warmup + cfg.steps):
                if i == cfg.warmup:
                    calls = host.device_calls
                before, threads = accel.waits(), _other_threads_cpu_ns()
                trainer.step(i)
                if i >= cfg.warmup:
                    _add_cpu_since(threads, side)
                    for (thread, reason), n in accel.waits_since(before).items():
                        key = f"{'training' if thread == 'MainThread' else thread.rsplit('_', 1)[0]}: {reason}"
                        waits[key] = waits.get(key, 0) + n
            calls = host.device_calls - calls
        steps = [phases for _, phases in trainer.timer.steps]
        trainer.timer = PhaseTimer("cpu")
        with OpCount() as counted:
            trainer.step(cfg.warmup + cfg.steps)
    finally:
        trainer.close()

    def median(phases: tuple[str, ...]) -> float:
        return float(np.median([sum(p.get(k, 0.0) for k in phases) for p in steps]))

    return {"prepare_ms": median(("data",)), "store_ms": median(STORE_PHASES),
            "device_calls": calls / cfg.steps, "waits": {k: n / cfg.steps for k, n in sorted(waits.items())},
            "side_ms": {k: ns / 1e6 / cfg.steps for k, ns in sorted(side.items()) if ns},
            "ops": counted.total, "op_counts": dict(counted.ops.most_common())}


def bench_host(cfg: StepBenchConfig, ds: Dataset, method: str) -> dict[str, Any]:
    """One method on ``meta``: medians over ``repeats`` runs of ``_host_only``'s times, the first run's counts."""
    runs = [_host_only(cfg, ds, method) for _ in range(cfg.repeats)]
    first = runs[0]
    return {"method": method, "options": cfg.options[method],
            "prepare_ms": float(np.median([r["prepare_ms"] for r in runs])),
            "store_ms": float(np.median([r["store_ms"] for r in runs])),
            "device_calls": first["device_calls"],
            "side_ms": {k: float(np.median([r["side_ms"].get(k, 0.0) for r in runs])) for k in first["side_ms"]},
            "waits_per_step": first["waits"], "ops": first["ops"], "op_counts": first["op_counts"]}


def run(cfg: StepBenchConfig) -> dict[str, Any]:
    """Every method of ``cfg``: what ``bench_method`` measures, with the machine's load before and after."""
    cfg.validate()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    load_before = load_average()
    try:
        with tempfile.TemporaryDirectory(prefix="hotcold-bench-step-") as tmp:
            ds = _dataset(cfg, Path(tmp))
            bench = bench_host if cfg.device == "meta" else bench_method
            rows = []
            for m in cfg.methods:
                rows.append(bench(cfg, ds, m))
                gc.collect()  # a trainer's tables are freed with its reference cycles: before the next method's
            tables = {"tables": len(ds.cardinalities), "rows": int(sum(ds.cardinalities))}
    finally:
        torch.set_num_threads(threads)
    device = torch.cuda.get_device_name(cfg.device) if cfg.device == "cuda" else cfg.device
    return {"config": {**asdict(cfg), **tables, "torch": torch.__version__, "device_name": device},
            "methods": rows, "load": {"before": load_before, "after": load_average()}}


def render_host(result: dict[str, Any]) -> str:
    """A ``meta`` result as the text the verb prints."""
    cfg = result["config"]
    lines = [f"the host's work of a GPU step (device side on meta): {cfg['tables']} tables, {cfg['rows']} rows, "
             f"DLRM Kaggle MLPs, batch {cfg['batch']}, {cfg['threads']} thread(s); median of {cfg['repeats']} runs "
             f"x {cfg['steps']} timed steps after {cfg['warmup']}",
             f"{'method':<12}{'prepare ms':>11}{'store ms':>9}{'side ms':>8}{'read ms':>8}{'calls':>7}{'ops':>6}"
             f"{'waits':>7}  where"]
    for m in result["methods"]:
        waits, side = m["waits_per_step"], dict(m.get("side_ms", {}))
        read = side.pop(READER, 0.0)
        where = ", ".join([*(f"{k} {n:.2g}" for k, n in waits.items()), *(f"{k} {ms:.2f} ms" for k, ms in side.items())])
        lines.append(f"{m['method']:<12}{m['prepare_ms']:>11.3f}{m['store_ms']:>9.3f}{sum(side.values()):>8.3f}"
                     f"{read:>8.3f}{m['device_calls']:>7.0f}{m['ops']:>6}{sum(waits.values()):>7.2g}  {where or '-'}")
    lines += ["prepare ms: the host's preparation of a step (read, plan, copies; on a GPU the step pipeline's "
              "worker does it while the step before trains); store ms: the store's own phases on the training "
              "thread (h2d, emb_fwd, d2h, emb_update), the dense step apart; both in the training thread's CPU "
              "time less the time meta spends computing shapes (a GPU launches those operations instead); side "
              "ms: the CPU time of the store's own threads (a planner, movers) a step, meta's shape computations "
              "included, by thread under where; read ms: the reader threads' (the batch read, packing)",
              "calls: torch calls a step makes on the device (preparation and dense step included: each a launch "
              "or more on a GPU); ops: aten operations of one step, views apart; waits: the host's "
              "waits for the device a timed step makes, by thread and reason (a read of device values on the host "
              "fails on meta: a run that ends is free of them)"]
    load = result["load"]
    lines.append(f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}")
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """The result as the text the verb prints."""
    cfg = result["config"]
    if cfg["device"] == "meta":
        return render_host(result)
    cuda = cfg["device"] == "cuda"
    lines = [f"training step: {cfg['tables']} tables, {cfg['rows']} rows, DLRM Kaggle MLPs, batch {cfg['batch']}, "
             f"{cfg['threads']} thread(s), {cfg['device_name']}; median of {cfg['repeats']} runs x {cfg['steps']} "
             f"timed steps per pipeline setting, run in turn",
             f"{'method':<12}{'ops off':>8}{'ops on':>7}{'step ms off':>12}{'on':>8}{'prepare ms':>11}"
             f"{'waited':>8}{'hidden':>8}{'saved':>7}" + (f"{'ops graph':>10}{'graph ms':>9}" if cuda else "")]
    for m in result["methods"]:
        line = (f"{m['method']:<12}{m['ops_off']:>8}{m['ops_on']:>7}{m['step_ms_off']:>12.3f}{m['step_ms_on']:>8.3f}"
                f"{m['prepare_ms_off']:>11.3f}{m['prepare_wait_ms_on']:>8.3f}{m['prepare_hidden']:>8.0%}"
                f"{m['step_saved_share']:>7.0%}")
        if cuda:
            line += f"{m['ops_graph']:>10}{m['step_ms_graph']:>9.3f}"
        lines.append(line)
    lines += ["ops: aten operations of one timed step on the training thread, views apart (pipeline off: the "
              "thread plans the step itself; on: a worker did)",
              "prepare ms: the training thread's time preparing a step (read, plan, copies) with the pipeline off; "
              "waited: its wait for the worker's with the pipeline on; hidden: 1 - waited / prepare ms; "
              "saved: (step off - step on) / prepare ms"]
    if cuda:
        lines.append("graph: the dense forward, backward and optimizer replayed as a CUDA graph (pipeline on)")
    load = result["load"]
    lines.append(f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}")
    return "\n".join(lines)
