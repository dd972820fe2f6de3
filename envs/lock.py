"""Print the lock of the environment running it: every installed distribution pinned, largest first.

`make lock` runs it in a scratch environment made from envs/requirements.txt and writes envs/requirements.lock,
which `make setup` installs without resolving (pip --no-deps), in several pip processes at once: the largest
first, so that the longest installs start first. A local version label (torch's ``+cpu``) is dropped: the lock
names the release, as requirements.txt does, and pip picks the build the machine's index offers.
Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import importlib.metadata as metadata
import os
import sys

LEFT_OUT = {"hotcold"}  # the package itself, installed editable after the lock


def installed_size(dist: metadata.Distribution) -> int:
    total = 0
    for file in dist.files or ():
        try:
            total += os.path.getsize(dist.locate_file(file))
        except OSError:
            pass
    return total


def main() -> None:
    rows = sorted(((installed_size(d), d.metadata["Name"], d.version.split("+")[0]) for d in metadata.distributions()
                   if d.metadata["Name"].lower() not in LEFT_OUT), key=lambda r: (-r[0], r[1].lower()))
    print("# envs/requirements.txt with every dependency pinned (`make lock` writes it; envs/lock.py), largest first:")
    print("# `make setup` installs it with pip --no-deps, in CORES pip processes at once. Do not edit by hand.")
    print(f"# Python {sys.version_info.major}.{sys.version_info.minor}")
    for size, name, version in rows:
        print(f"{name}=={version}  # {size / 1e6:.1f} MB installed")


if __name__ == "__main__":
    main()
