"""Install into the set-up's environment (`make setup`): the lock, then the package and its peers.

    python envs/install.py lock LOCK --jobs N [--uv PIN --venv V] -- PIP...
    python envs/install.py add --venv V -- PIP-INSTALL-ARGS...

PIP runs pip for the environment (``python -m pip [--python V]``); ``install --quiet --no-compile`` is added.

``lock``: the lock pins every package, so nothing is resolved (``--no-deps``). With ``--uv``, PIP
installs that pin of uv into the environment first (5 s), and uv installs the lock (10 s on 2 cores, against
31 s for two pip processes: pip spent most of its time reading the indexes' pages of each package, 30 s of CPU
for the 85 packages). uv is told the indexes, links, constraints and certificate pip is configured with (``pip
config list``) and, as pip does, takes the best match over all of them; its cache is the environment's
(``V/uv-cache``: same disk, so the files are linked, not copied). Where uv does not install or fails, pip
does, as without ``--uv``: the packages spread over ``--jobs`` pip processes writing disjoint files, largest
first, each to the process with the least work so far; a package's work is its installed size (the lock's
comment) plus a fixed cost per package (pip's own: torch's 700 MB took 12 s, the other 83 packages 800 MB
and 45 s). A package the environment has at another version (a new venv's setuptools) is replaced first, by
one pip process.

``add``: one install into the environment, by its uv where ``lock`` installed one, else by its pip.
Standard library only.
"""
from __future__ import annotations

import argparse
import ast
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LINE = re.compile(r"^(?P<pin>[A-Za-z0-9._-]+==[A-Za-z0-9.!+_-]+)\s*(?:#\s*(?P<mb>[\d.]+) MB installed)?\s*$")
PER_PACKAGE_MB = 20.0  # pip's fixed cost of a package, in MB of unpacking (measured above)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str) -> list[tuple[str, float]]:
    pins = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            match = LINE.match(line.strip())
            if match is None:
                sys.exit(f"{path}:{number}: not 'name==version  # size MB installed': {line.strip()!r}")
            pins.append((match["pin"], float(match["mb"] or 0.0)))
    return pins


def spread(pins: list[tuple[str, float]], jobs: int) -> list[list[str]]:
    """Largest first, each to the group with the least work so far (ties: the first such group)."""
    groups: list[list[str]] = [[] for _ in range(max(1, jobs))]
    work = [0.0] * len(groups)
    for pin, mb in sorted(pins, key=lambda p: -p[1]):
        least = work.index(min(work))
        groups[least].append(pin)
        work[least] += mb + PER_PACKAGE_MB
    return [group for group in groups if group]


#: pip's settings as uv options, kept in the environment by its first install (``uv_settings``)
UV_SETTINGS = "uv-options.json"
INSTALL = ["install", "--quiet", "--no-compile"]   # pip compiles nothing: its compiling is serial (68 s)
SOURCES = {":env:": 3, "install": 2, "global": 1}   # pip's settings: the environment's first, then its files'


def pip_settings(pip: list[str]) -> dict[str, str]:
    """What ``pip config list`` says pip uses (``find-links``, ``extra-index-url``, ...), the environment's
    ``PIP_*`` first, then the install section's, then the global one's."""
    out = subprocess.run([*pip, "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        source, _, name = key.rpartition(".")
        rank = SOURCES.get(source, 0)
        if name and value and rank >= found.get(name, (0, ""))[0]:
            found[name] = (rank, ast.literal_eval(value))
    return {name: value for name, (_, value) in found.items()}


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's ``settings``: the same indexes, links and constraints, and as
    pip, the best match over all indexes (uv's default takes the first index that has the package)."""
    args = ["--index-strategy", "unsafe-best-match"]
    if settings.get("index-url"):
        args += ["--index-url", settings["index-url"]]
    for flag, name in (("--extra-index-url", "extra-index-url"), ("--find-links", "find-links"),
                       ("--constraint", "constraint")):
        for value in settings.get(name, "").split():
            args += [flag, value]
    env = {"SSL_CERT_FILE": settings["cert"]} if settings.get("cert") else {}
    return args, env


def uv_settings(venv: Path, pip: list[str]) -> tuple[list[str], dict[str, str]]:
    """``uv_options`` for ``pip``'s settings, read once per environment: ``pip config list`` took 1.3 s, and
    each ``add`` asked again (``V/uv-options.json``, written by the first install)."""
    saved = venv / UV_SETTINGS
    if saved.exists():
        args, env = json.loads(saved.read_text())
        return args, env
    return save_uv_settings(venv, uv_options(pip_settings(pip)))


def save_uv_settings(venv: Path, options: tuple[list[str], dict[str, str]]) -> tuple[list[str], dict[str, str]]:
    """Keep ``options`` for the environment's later installs (``uv_settings``)."""
    saved = venv / UV_SETTINGS
    tmp = saved.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(options)))
    tmp.replace(saved)
    return options


def uv_install(venv: Path, pip: list[str], install_args: list[str]) -> int:
    """``uv pip install`` of ``install_args`` into ``venv`` with the settings of ``pip``; its exit status."""
    args, env = uv_settings(venv, pip)
    env = {**os.environ, **env}
    env.setdefault("UV_CACHE_DIR", str(venv / "uv-cache"))
    return subprocess.run([str(venv / "bin" / "uv"), "pip", "install", "--quiet", "--python",
                           str(venv / "bin" / "python"), *args, *install_args], env=env).returncode


def install_lock_with_uv(lock: str, pin: str, venv: Path, pip: list[str]) -> bool:
    """The lock by uv (``pin``, installed by ``pip`` first, while pip's settings are read); False where either
    failed (said in one line)."""
    with ThreadPoolExecutor(1) as pool:
        options = pool.submit(lambda: uv_options(pip_settings(pip)))
        installed = subprocess.run([*pip, *INSTALL, "--no-deps", pin]).returncode == 0
        known = options.result()
    if not installed or not (venv / "bin" / "uv").exists():
        print(f"install: {pin} did not install; pip installs {lock}", file=sys.stderr)
        return False
    save_uv_settings(venv, known)  # for this install and the later ones
    if uv_install(venv, pip, ["--no-deps", "-r", lock]) != 0:
        print(f"install: uv failed on {lock} (above); pip installs it", file=sys.stderr)
        return False
    return True


def install_lock_with_pip(lock: str, pins: list[tuple[str, float]], jobs: int, pip: list[str]) -> None:
    # a package the environment already has at another version (a new environment's setuptools) is replaced
    # first, alone: while one pip process uninstalls it, another would list a half-removed package
    have = {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}

    def replaces(pin: str) -> bool:
        name, version = pin.split("==")
        return have.get(normalize(name), version) != version

    first = [pin for pin, _ in pins if replaces(pin)]
    if first and subprocess.run([*pip, *INSTALL, "--no-deps", *first]).returncode != 0:
        sys.exit(f"{lock}: pip failed for {' '.join(first)} (above)")
    rest = [(pin, mb) for pin, mb in pins if pin not in first]
    procs = [subprocess.Popen([*pip, *INSTALL, "--no-deps", *group]) for group in spread(rest, jobs)]
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        sys.exit(f"{lock}: pip failed for {len(failed)} of {len(procs)} groups of packages (above)")


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    lock = verbs.add_parser("lock", help="install the lock: the pip command (python -m pip ...) after --")
    lock.add_argument("lock")
    lock.add_argument("--jobs", type=int, default=2)
    lock.add_argument("--uv", metavar="PIN", help="install this uv first and let it install the lock")
    lock.add_argument("--venv", type=Path, help="the environment the pip command installs into (with --uv)")
    add = verbs.add_parser("add", help="one install into the environment: pip install's arguments after --")
    add.add_argument("--venv", type=Path, required=True)
    args, rest = parser.parse_args(argv[:split]), argv[split + 1:]
    if not rest:
        parser.error("the pip command (lock) or pip install's arguments (add) go after --")
    if args.verb == "add":
        pip = [str(args.venv / "bin" / "python"), "-m", "pip"]
        if (args.venv / "bin" / "uv").exists():
            sys.exit(uv_install(args.venv, pip, rest))
        sys.exit(subprocess.run([*pip, *INSTALL, *rest]).returncode)
    if args.uv and args.venv is None:
        parser.error("--uv needs --venv")
    pins = read_lock(args.lock)
    if args.uv and install_lock_with_uv(args.lock, args.uv, args.venv, rest):
        return
    install_lock_with_pip(args.lock, pins, args.jobs, rest)


if __name__ == "__main__":
    main()
