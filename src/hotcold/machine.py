"""Facts about this machine that measurements depend on: the CPU's name, the usable cores, the last-level cache.

Read once here, from Linux's ``/proc`` and ``/sys`` where they exist, so
that ``hotcold calibrate`` (the profile's rates and their sources) and
``hotcold bench`` (the cache-sized gather table) agree on what the machine
is. Each falls back to what the Python standard library knows elsewhere.
"""
from __future__ import annotations

import os
import platform
import subprocess
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


#: cgroup v2 files of this process's memory limit and usage (a container's or a job's limit)
CGROUP_DIR = Path("/sys/fs/cgroup")


def _meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """``/proc/meminfo`` in bytes (empty where there is none)."""
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _cgroup_room(base: Path = CGROUP_DIR) -> int | None:
    """Bytes this process's cgroup (v2) may still allocate: ``memory.max - memory.current``; None without a limit."""
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def host_memory() -> tuple[int | None, int | None, str]:
    """(available, total) bytes of RAM and where the numbers come from; None where unknown.

    Available is the kernel's ``MemAvailable`` (free plus reclaimable page
    cache), lowered to what the process's cgroup limit still allows; total
    is ``MemTotal``, or the cgroup limit where that is lower.
    """
    info = _meminfo()
    avail, total = info.get("MemAvailable"), info.get("MemTotal")
    source = "MemAvailable of /proc/meminfo"
    room = _cgroup_room()
    if room is not None and (avail is None or room < avail):
        avail, source = room, "the cgroup's memory.max less memory.current"
        try:
            total = min(total or 1 << 62, int((CGROUP_DIR / "memory.max").read_text().strip()))
        except (OSError, ValueError):
            pass
    return avail, total, source


def device_memory(device: "object") -> tuple[int, int, str]:
    """(free, total) bytes of a CUDA device's memory (``torch.cuda.mem_get_info``) and where they come from."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total), "torch.cuda.mem_get_info"


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, rounded (None where the system has none): a timing's context."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_id() -> str:
    """This machine: its host name and its boot's id (two fresh machines of one kind may share a name)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = ""
    return f"{platform.node() or 'unknown'}" + (f"-{boot}" if boot else "")


def nvidia_smi(*args: str) -> list[list[str]] | None:
    """``nvidia-smi ARGS --format=csv,noheader,nounits`` as rows of fields; None where it does not answer."""
    try:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [[f.strip() for f in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]
