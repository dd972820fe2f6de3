"""The peer's installed state, a training rule's parameter: installing or repairing FBGEMM reruns its jobs.

Whether the jobs' interpreter imports FBGEMM's TBE is asked in a child process (so Snakemake never loads it:
importing fbgemm_gpu configures the root logger, and Snakemake's log lines would then come out twice). The
child imports torch and fbgemm_gpu, 2-3 s of CPU, and every Snakemake invocation (a dry run too) asks. Its
answer depends on what is installed, so it is kept in the environment (``sys.prefix`` of a virtual or conda
environment; a system interpreter asks every time) under a key of the builds, the interpreter, the probe's
source and the install directories' modification times: installing, upgrading or removing a package asks again.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata, util
from pathlib import Path

from hotcold.files import atomic_write_json

PROBE = "from hotcold.embedding.fbgemm import available; print(available() or 'usable')"
#: the packages whose installation the probe's answer depends on
PACKAGES = ("torch", "fbgemm_gpu")


def cache_path() -> Path | None:
    """Where the answer is kept: inside a virtual or conda environment, never a system interpreter's prefix."""
    prefix = Path(sys.prefix)
    if sys.prefix == sys.base_prefix and not (prefix / "conda-meta").is_dir():
        return None
    return prefix / ".hotcold" / "peer-probe.json"


def peer_state(src: Path) -> str:
    """The installed builds of fbgemm_gpu (CPU or CUDA) with versions, and whether the jobs' interpreter imports
    its TBE. Whether it runs on the trainer device is the job's check (a ``skipped`` record): this machine may
    not be the one the jobs run on."""
    names = sorted(set(metadata.packages_distributions().get("fbgemm_gpu", [])))
    builds = ", ".join(f"{name}=={metadata.version(name)}" for name in names) or "not installed"
    key = probe_key(builds, src)
    usable = _cached(key)
    if usable is None:
        usable = _probe(src)
        if usable != "unknown":
            _keep(key, usable)
    return f"{builds}: {usable}"


def probe_key(builds: str, src: Path) -> str:
    """What the probe's answer depends on: the builds, the interpreter, the probe's code, and when the
    site-packages directories and the packages' own were last changed (an install, upgrade or removal)."""
    dirs = {Path(p) for p in sys.path if p.endswith("site-packages")}
    for name in PACKAGES:
        spec = util.find_spec(name)
        if spec is not None and spec.origin:
            dirs.add(Path(spec.origin).parent)
    stamps = sorted((str(d), d.stat().st_mtime_ns) for d in dirs if d.is_dir())
    probe_src = Path(src, "hotcold", "embedding", "fbgemm.py")
    code = hashlib.sha256(probe_src.read_bytes()).hexdigest() if probe_src.is_file() else ""
    return json.dumps([builds, sys.executable, code, stamps])


def _cached(key: str) -> str | None:
    path = cache_path()
    try:
        entry = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return entry.get("usable") if isinstance(entry, dict) and entry.get("key") == key else None


def _keep(key: str, usable: str) -> None:
    path = cache_path()
    try:
        if path is not None:
            atomic_write_json(path, {"key": key, "usable": usable})
    except OSError:  # a read-only environment: ask every time
        pass


def _probe(src: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else "unknown"
