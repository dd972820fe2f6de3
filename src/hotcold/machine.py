"""Facts about this machine that measurements depend on: the CPU's name, the usable cores, the last-level cache.

Read once here, from Linux's ``/proc`` and ``/sys`` where they exist, so
that ``hotcold calibrate`` (the profile's rates and their sources) and
``hotcold bench`` (the cache-sized gather table) agree on what the machine
is. Each falls back to what the Python standard library knows elsewhere.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

#: where Linux lists cpu0's caches, one ``index<i>`` directory (``type``, ``size``, ``level``) each
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
#: how ``last_level_cache_bytes`` found its answer, for a rate's source
CACHE_SOURCE = "the largest data/unified cache of cpu0 the Linux kernel reports (sysfs cpu cache index)"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def last_level_cache_bytes(base: Path = CPU_CACHE_DIR) -> int | None:
    """Bytes of the largest data or unified cache of cpu0 the kernel reports (``base``), or None.

    Sizes read like ``32K``, ``1024K``, ``32M`` or plain bytes; instruction
    caches and unreadable entries are left out.
    """
    best = None
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            if (index / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = size[-1:].upper() if size[-1:].isalpha() else ""
        digits = size[:-1] if unit else size
        if unit in _UNITS and digits.isdigit():
            best = max(best or 0, int(digits) * _UNITS[unit])
    return best
