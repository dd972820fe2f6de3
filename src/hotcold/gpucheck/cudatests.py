"""The CUDA cases of the test suite, run once with pytest in a child process, counted from its JUnit report.

The CUDA cases are the ``device``-parametrised tests' ``[cuda]`` cases
(``tests/conftest.py`` ``DEVICES``) and the tests named for CUDA or GPUs
(``tests/test_gpu_ranks.py``: ranks sharing one GPU), slow tier included,
less this check's own tests: ``pytest -m "" -k "(cuda or gpu) and not
gpu_check"``. Without a GPU the CUDA cases skip, and the counts say so. The child runs in its own process session, so a run past its time
limit is ended with everything it started.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

#: pytest's selection of the CUDA cases: every tier, the tests whose id names cuda or a gpu, not this check's
SELECT = ("-m", "", "-k", "(cuda or gpu) and not gpu_check")
KILL_GRACE_S = 10.0


@dataclass
class TestOutcome:
    """How the CUDA cases went: counts from the JUnit report, or why there is none."""

    status: str                  # "ran", "timed out", "no report" or "not run"
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    exit_code: int | None = None
    failures: list[str] = field(default_factory=list)   # module::name of the failed and erroring cases
    skip_reasons: dict[str, int] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    log: str | None = None

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped

    def line(self) -> str:
        """One line: the counts, or why there are none."""
        if self.status == "not run":
            return "CUDA test cases: not run (--no-tests)"
        counts = (f"{self.passed} passed, {self.failed} failed, {self.errors} errors, {self.skipped} skipped "
                  f"of {self.total}")
        if self.status != "ran":
            return f"CUDA test cases: {self.status} after {self.seconds:.0f} s (pytest exit {self.exit_code}); {counts}"
        return f"CUDA test cases: {counts} in {self.seconds:.0f} s"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def parse_junit(path: Path) -> dict[str, Any]:
    """Counts of a pytest JUnit XML report: passed, failed, errors, skipped, the failed node ids, skip reasons."""
    root = ET.parse(path).getroot()
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": [],
                              "skip_reasons": {}}
    for case in root.iter("testcase"):
        node = "::".join(p for p in (case.get("classname"), case.get("name")) if p)  # a module's import error: its name
        kinds = {child.tag for child in case}
        if "error" in kinds:
            counts["errors"] += 1
            counts["failures"].append(node)
        elif "failure" in kinds:
            counts["failed"] += 1
            counts["failures"].append(node)
        elif "skipped" in kinds:
            counts["skipped"] += 1
            reason = " ".join((case.find("skipped").get("message") or "").split())[:160]
            counts["skip_reasons"][reason] = counts["skip_reasons"].get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return counts


def run_tests(root: Path, out_dir: Path, select: Sequence[str] = SELECT, paths: Sequence[str] = ("tests",),
              timeout_s: float = 300.0, python: str = sys.executable) -> TestOutcome:
    """Run pytest on ``paths`` (relative to ``root``, the repository) with ``select``; the counts.

    The report and the log go to ``out_dir`` (``cuda_tests.xml``, ``cuda_tests.log``).
    ``src`` under ``root`` leads the child's ``PYTHONPATH``, so it tests this tree.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report, log = out_dir / "cuda_tests.xml", out_dir / "cuda_tests.log"
    report.unlink(missing_ok=True)
    # a test module that cannot be imported here (a package the machine lacks) is an error of its own, counted,
    # and does not stop the others
    command = [python, "-m", "pytest", *paths, *select, "-p", "no:cacheprovider", "-rfE",
               "--continue-on-collection-errors", f"--junitxml={report}"]
    src = Path(root) / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)}
    started = time.perf_counter()
    status = "ran"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            status = "timed out"
            _end(proc)
            rc = proc.returncode
    outcome = TestOutcome(status, seconds=time.perf_counter() - started, exit_code=rc, command=command,
                          log=str(log))
    if report.is_file():
        try:
            for key, value in parse_junit(report).items():
                setattr(outcome, key, value)
        except ET.ParseError:
            outcome.status = "no report" if status == "ran" else status
    elif status == "ran":
        outcome.status = "no report"
    return outcome


def _end(proc: subprocess.Popen) -> None:
    """End the child's process group: SIGTERM, then SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
