"""``hotcold gpu-check`` (``make gpu-check``): the CUDA path checked on a GPU machine in one command, one table.

For a machine with torch and a GPU but no Snakemake, no internet and no
``make setup``: runs the CUDA cases of the test suite (``cudatests``),
generates the workflow config's datasets (``plan``: at the config's scale on
a GPU, tiny on a CPU) and trains every one-process run of the config on them
through ``hotcold train``'s own function (``runner.train_run``: CUDA events
on a GPU), then writes one table (``table``) beside the machine's
description (``env``). A run that raises is a ``failed`` row with its
error, and the others go on; runs not started within the time budget are
``skipped``. Without a GPU the same runs on the CPU at the tiny scale.
"""
from __future__ import annotations

import json
import shlex
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from hotcold.gpucheck.costcheck import CostCheck

if TYPE_CHECKING:  # imported where used: the missing-package check runs before anything needs torch
    from hotcold.gpucheck.plan import Plan, PlannedRun, Scale

#: how long a check may take before its runs not yet started are skipped (tests, data and runs together)
BUDGET_S = 540.0
TABLE = "gpu_check"   # gpu_check.csv, gpu_check.md, gpu_check.json under the output


@dataclass
class CheckOptions:
    """What one check does; ``device`` cpu | cuda | auto (cuda when torch sees a GPU)."""

    out: Path
    config: Path
    repo: Path                              # the repository: its tests/ and src/
    device: str = "auto"
    scale: Scale | None = None              # None: ``config`` on a GPU, ``tiny`` on a CPU
    datasets: Sequence[str] | None = None
    methods: Sequence[str] | None = None
    tests: bool = True
    train: bool = True
    tests_timeout_s: float = 300.0
    budget_s: float = BUDGET_S
    threads: int | None = None              # None: the config's ``threads`` (2)
    test_select: Sequence[str] | None = None  # pytest's selection (default ``cudatests.SELECT``)
    calibrate: bool | None = None           # None: on a GPU when runs train (``costcheck``)
    calibrate_repeats: int = 15


@dataclass
class CheckResult:
    device: str
    environment: dict[str, Any]
    tests: dict[str, Any]
    table: Any                               # pandas.DataFrame
    paths: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    costmodel: CostCheck | None = None


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def resolve(device: str) -> tuple[str, str | None]:
    """(cpu | cuda, a note when ``auto`` fell back to the CPU); ``cuda`` without a GPU fails (``devices.resolve_device``)."""
    import torch

    from hotcold.config import ConfigError
    from hotcold.devices import resolve_device

    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"gpu-check: --device must be auto, cpu or cuda, got {device!r}")
    kind = resolve_device(device).type
    if device == "auto" and kind == "cpu":
        return kind, (f"no GPU seen by torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}): "
                      "running the CPU fallback at the tiny scale")
    return kind, None


def load_config(path: Path) -> dict[str, Any]:
    """The config as the workflow reads it: ``default.yaml`` with ``path`` overlaid, nulls and defaults
    as Snakemake has them (``workflow.workflow_config``): what ``make reproduce CONFIG=path`` would train."""
    from hotcold.workflow.settings import workflow_config

    return workflow_config(path)


def generate_datasets(plan: Plan, out: Path, progress: bool = False) -> dict[str, str | None]:
    """Write each dataset the plan trains on (kept when its manifest says it was made by the same spec);
    dataset -> None, or the error that stopped its generation (its runs then fail with it)."""
    from hotcold.data.generators import GeneratorConfig, generate

    errors: dict[str, str | None] = {}
    for name, spec in plan.generators.items():
        target = plan.dataset_dir(out, name)
        started = time.perf_counter()
        try:
            cfg = GeneratorConfig.from_dict(spec)
            if _same_dataset(target, cfg.to_dict()):
                say(f"dataset {name}: kept {target} (same generator spec)")
                errors[name] = None
                continue
            manifest = generate(cfg, target, progress=progress)
            errors[name] = None
            say(f"dataset {name}: generated {manifest['rows']:,} samples, {sum(manifest['cardinalities']):,} rows "
                f"in {len(manifest['cardinalities'])} tables ({time.perf_counter() - started:.1f} s)")
        except Exception as e:  # one dataset's failure fails its runs, not the check
            errors[name] = one_line(e)
            say(f"dataset {name}: FAILED: {errors[name]}")
    return errors


def _same_dataset(target: Path, spec: Mapping[str, Any]) -> bool:
    try:
        made = json.loads((target / "manifest.json").read_text()).get("generator") or {}
    except (OSError, ValueError):
        return False
    return all(made.get(k) == v for k, v in spec.items())


def one_line(e: BaseException) -> str:
    """An error as one line: its type and its message's words."""
    message = " ".join(str(e).split())
    return f"{type(e).__name__}: {message}" if message else type(e).__name__


def brief(record: Mapping[str, Any]) -> str:
    """A run's outcome in one short line: its status, throughput, step time and AUC, or why it has none."""
    if record["status"] != "ok":
        return f"{record['status']}: {record['reason']}"
    s, m = record["summary"], record["metrics"]
    return (f"ok: {s['samples_per_s']:,.0f} samples/s, step p50 {s['step_ms_p50']:.2f} ms, AUC {m['auc']:.4f}"
            + ("" if s.get("stable", True) else " (unstable)"))


def train_runs(plan: Plan, out: Path, device: str, threads: int, deadline: float,
               data_errors: Mapping[str, str | None], budget_s: float,
               on_run: Callable[[int, int, PlannedRun, str, float], None] | None = None
               ) -> tuple[list[Path], list[dict[str, Any]], dict[tuple[str, str, str], float]]:
    """Train every planned run through ``hotcold train``'s function, one at a time, each caught.

    Returns the record paths written, the failures (keys and ``reason``) and each run's seconds.
    """
    import torch

    from hotcold.run_config import RunConfig
    from hotcold.runs.records import write_infeasible
    from hotcold.runs.runner import train_run

    records: list[Path] = []
    failures: list[dict[str, Any]] = []
    wall: dict[tuple[str, str, str], float] = {}
    total = len(plan.runs)
    for i, run in enumerate(plan.runs, 1):
        key = (run.dataset, run.method, run.variant)
        started = time.perf_counter()
        record_path = run.out_dir / "record.json"
        record_path.unlink(missing_ok=True)  # a stale record never stands for this check's run
        line: str
        try:
            if time.perf_counter() > deadline:
                failures.append({"dataset": run.dataset, "method": run.method, "variant": run.variant,
                                 "status": "skipped",
                                 "reason": f"not started: the check's time budget ({budget_s:g} s) was spent"})
                line = "skipped: time budget spent"
            elif data_errors.get(run.dataset):
                raise RuntimeError(f"its dataset was not generated ({data_errors[run.dataset]})")
            else:
                cfg = RunConfig.from_dict(run.run_config)
                if run.infeasible is not None:  # as the workflow's `hotcold infeasible` job writes it
                    write_infeasible(cfg, plan.dataset_dir(out, run.dataset), run.out_dir, device, run.infeasible)
                    line = f"infeasible: {run.infeasible}"
                else:
                    record = train_run(cfg, plan.dataset_dir(out, run.dataset), run.out_dir, threads=threads,
                                       device=device, progress=False)
                    line = brief(record) if record is not None else "no record"
                if record_path.is_file():
                    records.append(record_path)
        except Exception as e:  # one run's failure must not stop the others
            reason = one_line(e)
            failures.append({"dataset": run.dataset, "method": run.method, "variant": run.variant,
                             "reason": reason})
            line = f"FAILED: {reason}"
            say("".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-3)).rstrip())
            if device == "cuda":
                torch.cuda.empty_cache()
        wall[key] = time.perf_counter() - started
        if on_run is not None:
            on_run(i, total, run, line, wall[key])
    return records, failures, wall


def check(opts: CheckOptions) -> CheckResult:
    """Run the check; write ``gpu_check.csv``, ``.md`` and ``.json`` under ``opts.out`` and return them."""
    from hotcold.analysis.run_records import load_record
    from hotcold.files import atomic_write_json, atomic_write_text
    from hotcold.gpucheck import costcheck, cudatests, env, plan as plans, table as tables
    from hotcold.gpucheck.plan import SCALES

    started = time.perf_counter()
    deadline = started + opts.budget_s
    device, note = resolve(opts.device)
    notes = [note] if note else []
    if note:
        say(f"gpu-check: {note}")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    environment = env.environment(device)
    say(f"gpu-check: {env.header(environment)}")
    for module, effect in environment["absent_optional"].items():
        say(f"gpu-check: {module} is not installed: {effect}")
    scale = opts.scale or SCALES["config" if device == "cuda" else "tiny"]
    config = load_config(opts.config)
    threads = opts.threads or int(config.get("threads", 2))

    if opts.tests:
        say(f"gpu-check: running the CUDA test cases (pytest {shlex.join(opts.test_select or cudatests.SELECT)}) ...")
        tests = cudatests.run_tests(opts.repo, out, select=opts.test_select or cudatests.SELECT,
                                    timeout_s=opts.tests_timeout_s)
    else:
        tests = cudatests.TestOutcome("not run")
    say(f"gpu-check: {tests.line()}")
    for node in tests.failures[:20]:
        say(f"gpu-check:   failed: {node}")

    planned = plans.plan(config, out, device, scale, opts.datasets, opts.methods) if opts.train else None
    records, failures, wall = [], [], {}
    model = CostCheck()
    costcheck.clear(out)
    if planned is not None and (opts.calibrate if opts.calibrate is not None else device == "cuda"):
        say(f"gpu-check: calibrating this machine for the cost model ({threads} threads) ...")
        try:
            costcheck.calibrate_here(model, out, device, threads, opts.calibrate_repeats)
        except Exception as e:  # the runs go on without the model check
            model.error = f"the calibration failed: {one_line(e)}"
            say(f"gpu-check: {model.error}")
    if planned is not None:
        notes += [f"left out: {line}" for line in planned.left_out]
        say(f"gpu-check: {len(planned.runs)} runs of {len(planned.generators)} dataset(s) on {device} at scale "
            f"{scale.name} ({threads} threads)")
        data_errors = (generate_datasets(planned, out) if time.perf_counter() < deadline
                       else dict.fromkeys(planned.generators, "the time budget was spent"))

        def progress(i: int, total: int, run: PlannedRun, line: str, seconds: float) -> None:
            say(f"[{i:>{len(str(total))}}/{total}] {run.name}: {line} ({seconds:.1f} s)")

        paths, failures, wall = train_runs(planned, out, device, threads, deadline, data_errors, opts.budget_s,
                                           progress)
        records = [load_record(p) for p in paths]
        if model.profile is not None:
            try:
                model.step_errors = costcheck.validate(paths, model.profile, out / plans.DATA_DIR, out)
            except Exception as e:  # the table is still written
                model.error = f"the validation failed: {one_line(e)}"
        say(f"gpu-check: {model.line()}")
    order = [(r.dataset, r.method, r.variant) for r in planned.runs] if planned else []
    frame = tables.frame(records, failures, wall, order, environment["device"], environment["timer"])
    environment["check_s"] = round(time.perf_counter() - started, 1)
    head = (f"# hotcold gpu-check\n\n{env.header(environment)}\n\n{tests.line()}\n\n"
            + "".join(f"{n}\n\n" for n in notes)
            + (f"{model.line()}\n\n" if planned is not None else "")
            + (f"Runs: scale {scale.name} ({_scale_line(scale)}), {threads} threads, "
               f"{environment['check_s']:.0f} s in all. `exact`: the run's parameters against the `device` "
               "reference (summary.md's column); bytes: host-device traffic per step (parameters and activations); "
               "phases: median ms per step.\n\n" if planned is not None
               else f"Runs: none (--no-train); {environment['check_s']:.0f} s in all.\n\n"))
    text = head + tables.markdown(frame) + "\n"
    paths_out = {"csv": out / f"{TABLE}.csv", "md": out / f"{TABLE}.md", "json": out / f"{TABLE}.json"}
    atomic_write_text(paths_out["csv"], frame.to_csv(index=False))
    atomic_write_text(paths_out["md"], text)
    atomic_write_json(paths_out["json"], {
        "environment": environment, "tests": tests.as_dict(), "device": device, "scale": asdict(scale),
        "threads": threads, "config": str(opts.config), "notes": notes, "table": f"{TABLE}.csv",
        "costmodel": model.as_dict(), "runs": tables.json_rows(frame)})
    return CheckResult(device, environment, tests.as_dict(), frame, paths_out, notes, model)


def _scale_line(scale: Scale) -> str:
    changed = {**scale.generator(), **scale.train()}
    return ", ".join(f"{k} {v}" for k, v in changed.items()) or "the config's datasets and training"
