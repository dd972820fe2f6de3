"""Install envs/requirements.lock with several pip processes at once (`make setup`).

The lock pins every package, so nothing is resolved (pip --no-deps) and the packages can be spread over
``--jobs`` pip processes writing disjoint files. A pip process unpacks one wheel at a time; one process for the
whole lock took 48 s on 2 cores, two 31 s. The packages go to the process with the least work so far, largest
first; a package's work is its installed size (the lock's comment) plus a fixed cost per package (pip's own:
torch's 700 MB took 12 s, the other 83 packages 800 MB and 45 s): 26 s in all. A package the environment has
at another version (a new venv's setuptools) is replaced first, by one pip process. Standard library only.

    python envs/install.py LOCK --jobs N -- PIP-COMMAND...
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys

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


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock")
    parser.add_argument("--jobs", type=int, default=2)
    args, pip = parser.parse_args(argv[:split]), argv[split + 1:]
    if not pip:
        parser.error("the pip command goes after --")
    pins = read_lock(args.lock)
    # a package the environment already has at another version (a new environment's setuptools) is replaced
    # first, alone: while one pip process uninstalls it, another would list a half-removed package
    have = {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}

    def replaces(pin: str) -> bool:
        name, version = pin.split("==")
        return have.get(normalize(name), version) != version

    first = [pin for pin, _ in pins if replaces(pin)]
    if first and subprocess.run([*pip, "--no-deps", *first]).returncode != 0:
        sys.exit(f"{args.lock}: pip failed for {' '.join(first)} (above)")
    rest = [(pin, mb) for pin, mb in pins if pin not in first]
    procs = [subprocess.Popen([*pip, "--no-deps", *group]) for group in spread(rest, args.jobs)]
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        sys.exit(f"{args.lock}: pip failed for {len(failed)} of {len(procs)} groups of packages (above)")


if __name__ == "__main__":
    main()
