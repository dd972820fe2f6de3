"""A workflow that lost a run's files or its Snakemake resumes: stale tables rebuilt, stale locks cleared,
orphaned jobs ended, nothing half-written left (issue 21, trials 3 and 4)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from hotcold.workflow.resume import LOCK_DIR, MARKER, orphaned_jobs, resume, snakemake_processes

pytest.importorskip("snakemake", reason="Snakemake runs the workflow; `make` installs it (envs/requirements.txt)")
psutil = pytest.importorskip("psutil", reason="psutil is not installed (Snakemake brings it): the jobs a killed "
                                                 "Snakemake left cannot be found")

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"

# One dataset, two one-process runs (one job each) and one scale-out run; nothing of it is trained here:
# every output is created empty and `--touch` records it as made.
PLAN_CONFIG = """\
seeds: [0]
timing: {interleave: false}
datasets: {terabyte: null, taobao: null}
methods:
  fae: null
  lru: null
  lfu: null
  freqcache: null
  scratchpipe: null
  fbgemm: null
  proactive: null
  flexshard: null
  sharded: {table: null, column: null, balanced: null}
distributed:
  scales: [{world: 2, ranks_per_node: 1}]
  group_runs: false
"""
ONE_PROCESS = "results/runs/kaggle/hybrid/base/seed~0"
SCALE_OUT = "results/runs/kaggle/sharded/row/world~2-rpn~1/seed~0"
# the rules whose jobs read every run's record, directly or through the summary
READ_EVERY_RECORD = {"aggregate", "costmodel_validation", "claims", "figures", "scaleout_figures", "hit_rate_curves", "all"}


def snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def make_dry_run(target: str) -> list[str]:
    """The commands ``make <target>`` would run, one a line (nothing is run)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed: the Makefile targets cannot be run")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under `make test`
    proc = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=REPO, capture_output=True, text=True,
                          check=True, env=env)
    return proc.stdout.replace("\\\n", " ").splitlines()


def planned_jobs(out: str) -> tuple[Counter, set[str]]:
    """From a dry run: how many jobs each rule has, and the files the training jobs write."""
    jobs, written = Counter(), set()
    for block in re.split(r"\n(?=\[[^\n]*\]\n)", out):
        rule = re.search(r"^(?:local)?rule (\S+):", block, re.MULTILINE)
        if rule:
            jobs[rule[1]] += 1
            output = re.search(r"^\s+output: (.*)$", block, re.MULTILINE)
            if rule[1].startswith("train") and output:
                written.update(output[1].split(", "))
    return jobs, written


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A workflow recorded as finished: every output present, Snakemake's metadata written by --touch."""
    work = tmp_path_factory.mktemp("finished")
    (work / "plan.yaml").write_text(PLAN_CONFIG)
    summary = snakemake(work, "--configfile", str(work / "plan.yaml"), "--summary")
    assert summary.returncode == 0, summary.stderr[-3000:]
    outputs = [ln.split("\t")[0] for ln in summary.stdout.splitlines()[1:] if "\t" in ln]
    assert f"{ONE_PROCESS}/record.json" in outputs and f"{SCALE_OUT}/record.json" in outputs
    for name in outputs:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).touch()
    touched = snakemake(work, "--configfile", str(work / "plan.yaml"), "--touch", "--cores", "1")
    assert touched.returncode == 0, touched.stderr[-3000:]
    return work  # finished: each test's dry run plans exactly the jobs its deletion makes stale


def copy_of(finished: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(finished, work, symlinks=True)  # copy2: the mtimes stay
    return work


@pytest.mark.parametrize(("run", "name", "tables"), [
    (ONE_PROCESS, "record.json", READ_EVERY_RECORD),
    pytest.param(ONE_PROCESS, "steps.parquet", READ_EVERY_RECORD, marks=pytest.mark.slow),
    pytest.param(SCALE_OUT, "record.json", READ_EVERY_RECORD | {"scaleout_tables"}, marks=pytest.mark.slow),
], ids=["one-process-record", "one-process-steps", "scale-out-record"])
def test_a_deleted_run_file_reruns_that_run_and_the_tables_reading_it(finished: Path, tmp_path: Path, run: str,
                                                                      name: str, tables: set[str]) -> None:
    """Trial 3: before, the dry run said "Nothing to be done" and the tables kept the deleted run's numbers."""
    work = copy_of(finished, tmp_path)
    (work / run / name).unlink()
    proc = snakemake(work, "--configfile", str(work / "plan.yaml"), "-n")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Nothing to be done" not in out
    jobs, written = planned_jobs(proc.stdout)
    train_rule = "train_scaleout" if "world~" in run else "train"
    assert jobs == Counter({train_rule: 1, **{t: 1 for t in tables}}), jobs
    assert written == {f"{run}/record.json", f"{run}/steps.parquet"}


def test_make_figures_names_a_missing_run_file_in_one_line(finished: Path, tmp_path: Path) -> None:
    """Trial 3: `make figures` (no training rule allowed) failed with Snakemake's MissingInputException."""
    work = copy_of(finished, tmp_path)
    (work / ONE_PROCESS / "record.json").unlink()
    figures = [line for line in make_dry_run("figures") if "/snakemake " in line]
    assert len(figures) == 1 and figures[0].startswith("HOTCOLD_TABLES_ONLY=1 ")
    args = figures[0].split("/snakemake ", 1)[1].split()  # the Makefile's options and targets
    proc = snakemake(work, "--configfile", str(work / "plan.yaml"), "-n", *args, env={"HOTCOLD_TABLES_ONLY": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "MissingInputException" not in out
    assert (f"1 run file(s) missing ({ONE_PROCESS}/record.json): `make reproduce` reruns their runs and rebuilds "
            "the tables") in out, out[-3000:]
    complete = snakemake(finished, "--configfile", str(finished / "plan.yaml"), "-n", *args,
                         env={"HOTCOLD_TABLES_ONLY": "1"})
    assert complete.returncode == 0, complete.stderr[-3000:]


def test_reproduce_and_figures_resume_before_running_snakemake() -> None:
    for target in ("reproduce", "figures"):
        lines = make_dry_run(target)
        resume_at = [i for i, ln in enumerate(lines) if ln.endswith("-m hotcold resume")]
        snakemake_at = [i for i, ln in enumerate(lines) if "/snakemake " in ln]
        assert resume_at and snakemake_at and resume_at[0] < snakemake_at[0], (target, lines)


# ---------------------------------------------------------------- resume: locks, orphans, half-written files

SLEEPER = "import time, sys; print('up', flush=True); time.sleep(float(sys.argv[1]))"


def start(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A process that has started (it printed its first line)."""
    proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline() == "up\n"
    return proc


DETACH = """\
import subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, start_new_session=True)
assert child.stdout.readline() == "up\\n"
print(child.pid, flush=True)
"""


def detached(argv: list[str], cwd: Path, env: dict[str, str]) -> psutil.Process:
    """A started process whose parent has exited, as a job's is once its Snakemake was killed."""
    out = subprocess.run([sys.executable, "-c", DETACH, *argv], cwd=cwd, env={**os.environ, **env},
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return psutil.Process(int(out))


def ended(proc: psutil.Process, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def fake_snakemake(where: Path, cwd: Path) -> subprocess.Popen[str]:
    """A long-running process whose command line is a Snakemake's (``python .../snakemake``)."""
    script = where / "bin" / "snakemake"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(SLEEPER)
    return start([sys.executable, str(script), "60"], cwd)


def job(cwd: Path, snakemake_pid: int | None) -> psutil.Process:
    """A stand-in for a workflow job (``python -m hotcold ...``), its parent gone: marked with its Snakemake,
    if any."""
    env = {MARKER: str(snakemake_pid)} if snakemake_pid is not None else {}
    return detached([sys.executable, "-c", SLEEPER, "60", "-m", "hotcold", "train"], cwd, env)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_locks(workdir: Path, age_s: float = 0.0) -> list[Path]:
    locks = []
    for kind in ("input", "output"):
        lock = workdir / LOCK_DIR / f"0.{kind}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text(str(workdir / "results/tables/summary.csv") + "\n")
        if age_s:
            t = time.time() - age_s
            os.utime(lock, (t, t))
        locks.append(lock)
    return locks


@pytest.fixture
def procs():
    started: list[subprocess.Popen[str] | psutil.Process] = []
    yield started
    for proc in started:
        try:
            proc.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
        if isinstance(proc, subprocess.Popen):
            proc.wait()


def test_a_stale_lock_is_cleared(tmp_path: Path) -> None:
    """Trial 4: no Snakemake runs in the directory, so its lock is a killed one's."""
    locks = write_locks(tmp_path)
    done = resume(tmp_path)
    assert not any(lock.exists() for lock in locks)
    assert done.line() == "resume: cleared a stale lock (2 lock files no running Snakemake holds)"
    assert resume(tmp_path).line() == "resume: nothing to clear (no stale lock, no orphaned job)"


def test_the_lock_of_a_running_snakemake_stays(tmp_path: Path, procs) -> None:
    """A Snakemake running in the directory keeps the lock it wrote; one in another directory does not count."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    procs.append(fake_snakemake(tmp_path, elsewhere))
    locks = write_locks(tmp_path, age_s=0)
    assert resume(tmp_path).locks_cleared == locks  # the only Snakemake runs elsewhere
    procs.append(fake_snakemake(tmp_path, tmp_path))
    time.sleep(0.05)
    locks = write_locks(tmp_path)  # written after it started: its own
    done = resume(tmp_path)
    assert all(lock.exists() for lock in locks) and done.holders == [procs[-1].pid]
    assert done.line() == f"resume: left the lock of the Snakemake running here (pid {procs[-1].pid})"


def test_a_lock_older_than_every_running_snakemake_is_cleared(tmp_path: Path, procs) -> None:
    """Two runs in one directory: the killed one's lock (written before the live one started) goes."""
    procs.append(fake_snakemake(tmp_path, tmp_path))
    old = write_locks(tmp_path, age_s=600)
    new = [tmp_path / LOCK_DIR / "1.input.lock"]
    new[0].write_text("results/runs/x/record.json\n")
    done = resume(tmp_path)
    assert not any(lock.exists() for lock in old) and new[0].exists()
    assert done.locks_cleared == old and done.locks_kept == new


def test_orphaned_jobs_of_a_killed_snakemake_are_ended(tmp_path: Path, procs) -> None:
    """Trial 4: a job whose Snakemake is gone ends; a live Snakemake's job, a job of another directory and
    a hotcold process started by hand keep running."""
    other = tmp_path / "other"
    other.mkdir()
    live = fake_snakemake(tmp_path, tmp_path)
    procs.append(live)
    killed = dead_pid()
    orphan = job(tmp_path, killed)
    kept = [job(tmp_path, live.pid), job(other, killed), job(tmp_path, None)]
    procs.extend([orphan, *kept])
    done = resume(tmp_path, grace_s=5)
    assert ended(orphan)
    assert not any(ended(p, timeout=0.2) for p in kept)
    assert done.orphan_jobs == [[orphan.pid]]
    assert done.line() == f"resume: ended 1 orphaned job of a killed Snakemake (pids {orphan.pid})"


def test_an_orphan_ignoring_sigterm_is_killed(tmp_path: Path, procs) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    orphan = detached([sys.executable, "-c", code], tmp_path, {MARKER: str(dead_pid())})
    procs.append(orphan)
    started = time.monotonic()
    done = resume(tmp_path, grace_s=0.5)
    assert ended(orphan) and done.orphan_jobs == [[orphan.pid]] and time.monotonic() - started < 5


def test_half_written_files_of_dead_writers_are_removed(tmp_path: Path, procs) -> None:
    """The temporary siblings of atomic writes (hotcold.files) left by a job killed mid-write."""
    tables = tmp_path / "results" / "tables"
    tables.mkdir(parents=True)
    dead = tables / f".summary.csv.tmp-{dead_pid()}"
    live = tables / f".speedup.csv.tmp-{os.getpid()}"
    part = tables / "download.part"
    for path in (dead, live, part):
        path.write_text("half")
    done = resume(tmp_path)
    assert not dead.exists() and live.exists() and part.exists()
    assert done.line() == "resume: removed 1 half-written file(s) of killed jobs"


def test_resume_verb_prints_one_line(tmp_path: Path) -> None:
    write_locks(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hotcold", "resume", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["resume: cleared a stale lock (2 lock files no running Snakemake holds)"]


# ---------------------------------------------------------------- kill -9 of a real workflow

# One dataset, two one-process runs; their group job is long enough (6,000 steps each, some seconds) to be still
# running after Snakemake was killed and its rerun refused.
TINY_CONFIG = """\
threads: 1
seeds: [0]
timing: {repeats: 1}
datasets:
  kaggle:
    generator: {kind: criteo-kaggle-style, rows: 2000, max_rows_per_table: 1000, seed: 0}
  terabyte: null
  taobao: null
  multihot: null
methods: {fae: null, lru: null, lfu: null, freqcache: null, scratchpipe: null, fbgemm: null, sharded: null,
          proactive: null, flexshard: null}
train: {batch_size: 128, steps: 6000, warmup_steps: 1, eval_batch_size: 1024, eval_samples: 200}
profile: {batches: 4, window: 2}
simulate: {ratios: [0.2], policies: [lru], windows: [1]}
distributed:
  scales: []
  shard_sim: {plans: [row], scales: ["2x1"], headrooms: [1.0]}
"""


def workflow_jobs(workdir: Path) -> list:
    """The live processes of jobs a Snakemake started in ``workdir``."""
    found = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        try:
            if proc.info["cwd"] and os.path.samefile(proc.info["cwd"], workdir) and MARKER in proc.environ():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    return found


@pytest.mark.slow
def test_a_workflow_killed_with_sigkill_resumes(tmp_path: Path) -> None:
    """Trial 4: Snakemake killed while a training job runs; `hotcold resume` (what `make reproduce` runs first)
    ends the orphaned job and clears the lock, and the rerun completes with both runs in the summary."""
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    argv = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(tmp_path), "--configfile",
            str(tmp_path / "tiny.yaml"), "--cores", "1", "--rerun-incomplete"]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any("-m hotcold train-group" in " ".join(p.info["cmdline"] or ()) for p in workflow_jobs(tmp_path)):
            assert first.poll() is None and time.monotonic() < deadline, "the training job never started"
            time.sleep(0.1)
        assert orphaned_jobs(tmp_path) == []  # a running Snakemake's jobs are its own
        assert [p.pid for p in snakemake_processes(tmp_path)] == [first.pid]
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert list((tmp_path / LOCK_DIR).glob("*.lock"))
        locked = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert locked.returncode != 0 and "LockException" in locked.stdout + locked.stderr  # as before: stuck
        orphans = workflow_jobs(tmp_path)
        assert orphans, "the training job ended before the test could end it: give it more steps"

        done = resume(tmp_path)
        assert done.orphan_jobs and sorted(p for j in done.orphan_jobs for p in j) == sorted(p.pid for p in orphans)
        assert done.locks_cleared and not workflow_jobs(tmp_path)
        assert done.line().startswith("resume: ended 1 orphaned job of a killed Snakemake (pids ")
        rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-4000:]
    finally:
        if first.poll() is None:
            first.kill()
        for proc in workflow_jobs(tmp_path):
            proc.kill()
    summary = pd.read_csv(tmp_path / "results" / "tables" / "summary.csv")
    assert sorted(summary.method) == ["device", "hybrid"] and (summary.status == "ok").all()
    assert not list(tmp_path.rglob(".*.tmp-*"))
