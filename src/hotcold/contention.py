"""Whether other programs slowed a run: measured beside the run, never from its own step times.

A run's step times cannot tell a slow method from a slowed machine: under a
sustained slowdown every step is slow alike (the spread stays narrow) and the
process still gets a fair share of CPU time. Two measurements that do not
depend on the run itself judge it instead (``Watch``):

- the machine's CPU time from ``/proc/stat`` over the run: the busy time of
  the cores the process may use (its affinity), less its own CPU time, is what
  other programs ran there; with the hypervisor's steal it says how many of
  the cores the run needed (``threads`` of them, times the ranks on the node)
  others held on average. Beyond ``MAX_OTHER_CORES`` the run is disturbed.
- a fixed CPU probe (``probe``: the same small matmuls on the run's threads,
  about 30 ms on a quiet core) timed before and after the run, against the
  quietest probe this process has seen (``QuietProbe``, calibrated at first
  use): a probe slower than ``MAX_PROBE_SLOWDOWN`` x the quiet one means a slow
  spell at the run's start or end, also where ``/proc`` says nothing (another
  VM on the host without steal accounting, clock throttling).

A GPU run is judged by what disturbs a GPU run (``Watch(gpu=...)``): the
``/proc/stat`` measure (host load beyond the job's own threads: the
launching host is a GPU step's critical path), other processes computing on
its GPU, and the GPU's clocks (``gpu_state``: the SM clock against its
maximum and the active throttle reasons, before and after). The CPU probe is
not used there: right after a run it measures the run's own threads winding
down as much as anything else.

``verdict`` turns the numbers into ``disturbed`` and its reasons; the record
keeps the numbers (``contention`` in its summary). Without ``/proc/stat``
(not Linux) only the probe judges.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from hotcold.machine import nvidia_smi

#: other programs' (and steal's) CPU beyond the cores the run left free, in cores averaged over the run
MAX_OTHER_CORES = 0.3
#: a probe before or after the run slower than this x the quietest probe of the process
MAX_PROBE_SLOWDOWN = 1.5
#: the probe's work: ``PROBE_ROUNDS`` products of two PROBE_N x PROBE_N float32 matrices per thread
#: (about 45 ms on a quiet machine here, one thread or two: 33.5 MFLOP a product)
PROBE_N = 256
PROBE_ROUNDS = 128

#: a GPU whose SM clock ran below this share of its maximum (before or after the run) was throttled
MIN_SM_CLOCK_SHARE = 0.85
#: nvidia-smi's throttle reasons that do not slow a run (the GPU idles between runs; a clock set on purpose)
HARMLESS_THROTTLE = {"gpu_idle", "applications_clocks_setting"}

PROC_STAT = Path("/proc/stat")
PROC_LOADAVG = Path("/proc/loadavg")


@dataclass(frozen=True)
class CpuTimes:
    """The CPU seconds of a set of cores (from ``/proc/stat``): busy (user, nice, system, irq, softirq) and steal."""

    busy_s: float
    steal_s: float
    cores: int


def read_cpu_times(cores: set[int] | None = None, path: Path = PROC_STAT) -> CpuTimes | None:
    """The summed ``cpuN`` lines of ``path`` for ``cores`` (every core when None); None where it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    busy = steal = 0
    n = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cores is not None and int(name[3:]) not in cores:
            continue
        v = [int(x) for x in fields] + [0] * 8
        # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
        busy += v[0] + v[1] + v[2] + v[5] + v[6]
        steal += v[7]
        n += 1
    return CpuTimes(busy / tick, steal / tick, n) if n else None


def read_load(path: Path = PROC_LOADAVG) -> tuple[float, int] | None:
    """The 1-minute load average and the number of runnable tasks now (``/proc/loadavg``); None elsewhere."""
    try:
        fields = path.read_text().split()
        return float(fields[0]), int(fields[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class GpuState:
    """What may disturb a run on one GPU now: other processes computing on it, its clocks and why they are low."""

    other_pids: tuple[int, ...]        # compute processes on the GPU that are not this one
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    throttle: tuple[str, ...]          # active throttle reasons that slow a run (``HARMLESS_THROTTLE`` apart)
    idle: bool = False                 # nothing ran on it just now: its clocks are down by design


#: the throttle reasons nvidia-smi reports, by the field name of ``--query-gpu`` (``clocks_event_reasons`` on new
#: drivers, ``clocks_throttle_reasons`` on old ones)
_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
            "hw_power_brake_slowdown", "sw_thermal_slowdown", "sync_boost")


def gpu_state(index: int) -> GpuState | None:
    """GPU ``index``'s state from ``nvidia-smi`` (None where it does not answer)."""
    for prefix in ("clocks_event_reasons", "clocks_throttle_reasons"):
        rows = nvidia_smi("-i", str(index), "--query-gpu=uuid,clocks.sm,clocks.max.sm,"
                    + ",".join(f"{prefix}.{r}" for r in _REASONS))
        if rows:
            break
    else:
        return None
    uuid, sm, max_sm, *flags = rows[0]
    apps = nvidia_smi("--query-compute-apps=gpu_uuid,pid") or []
    own = os.getpid()
    others = tuple(sorted(int(pid) for gpu, pid in apps if gpu == uuid and pid.isdigit() and int(pid) != own))

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    on = {r for r, f in zip(_REASONS, flags) if f.strip().lower() == "active"}
    return GpuState(others, number(sm), number(max_sm), tuple(r for r in _REASONS if r in on - HARMLESS_THROTTLE),
                    "gpu_idle" in on)


def probe_ms(threads: int) -> float:
    """Milliseconds of the fixed probe work (``PROBE_ROUNDS`` products per thread) on ``threads`` torch threads
    (the setting is restored after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.rand(PROBE_N, PROBE_N, generator=g)
        b = torch.rand(PROBE_N, PROBE_N, generator=g)
        out = torch.empty(PROBE_N, PROBE_N)
        torch.mm(a, b, out=out)  # untimed: first-call allocation and dispatch
        t0 = time.perf_counter_ns()
        for _ in range(PROBE_ROUNDS * max(1, threads)):
            torch.mm(a, b, out=out)
        return (time.perf_counter_ns() - t0) / 1e6
    finally:
        torch.set_num_threads(before)


class QuietProbe:
    """The quietest probe a process has seen, per thread count: the reference a probe is compared with.

    Calibrated at first use for a thread count by the fastest of ``calibration``
    probes; every later probe that is faster lowers it. Under a slowdown that
    lasts the whole process the reference is slow too: the ``/proc`` measure
    judges that case.
    """

    def __init__(self, measure: Callable[[int], float] = probe_ms, calibration: int = 3) -> None:
        self._measure = measure
        self._calibration = calibration
        self._quiet: dict[int, float] = {}

    def measure(self, threads: int) -> float:
        """One probe's milliseconds (calibrating first where this thread count is new)."""
        if threads not in self._quiet:
            self._quiet[threads] = min(self._measure(threads) for _ in range(self._calibration))
        ms = self._measure(threads)
        self._quiet[threads] = min(self._quiet[threads], ms)
        return ms

    def quiet(self, threads: int) -> float:
        return self._quiet[threads]


_QUIET = QuietProbe()


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


class Watch:
    """Measures a run's contention: ``start()`` before it, ``stop()`` after; ``stop`` returns the numbers.

    ``threads``: the run's threads per process; ``local_ranks``: its processes
    on this machine (the ranks of a scale-out run on the node; each is taken to
    use as much CPU as this one). ``probe``: a ``QuietProbe`` (the process's by
    default), or None for no probe.
    """

    def __init__(self, threads: int, local_ranks: int = 1, probe: QuietProbe | None = _QUIET,
                 stat: Callable[[], CpuTimes | None] | None = None,
                 own_cpu: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.perf_counter,
                 gpu: Callable[[], GpuState | None] | None = None) -> None:
        self.threads, self.local_ranks = max(1, threads), max(1, local_ranks)
        self.gpu = gpu
        self.probe = None if gpu is not None else probe  # a GPU run is judged by its GPU, not by a CPU probe
        cores = _affinity()
        self._stat = stat or (lambda: read_cpu_times(cores))
        self._own_cpu, self._clock = own_cpu, clock

    @classmethod
    def for_device(cls, device: Any, threads: int, local_ranks: int = 1) -> "Watch":
        """The watch of a run on ``device`` (a ``torch.device``): a CUDA run's is its GPU's (``gpu_state``)."""
        if getattr(device, "type", device) == "cuda":
            import torch

            index = device.index if device.index is not None else torch.cuda.current_device()
            return cls(threads, local_ranks, gpu=lambda: gpu_state(index))
        return cls(threads, local_ranks)

    def start(self) -> None:
        self._gpu0 = self.gpu() if self.gpu is not None else None
        self._probe0 = self.probe.measure(self.threads) if self.probe is not None else None
        self._load0 = read_load()
        self._t0, self._cpu0, self._stat0 = self._clock(), self._own_cpu(), self._stat()

    def stop(self) -> dict[str, Any]:
        t1, cpu1, stat1 = self._clock(), self._own_cpu(), self._stat()
        load1 = read_load()
        probe1 = self.probe.measure(self.threads) if self.probe is not None else None
        out: dict[str, Any] = {"wall_s": t1 - self._t0, "own_cpu_s": cpu1 - self._cpu0, "threads": self.threads,
                               "local_ranks": self.local_ranks}
        if self._stat0 is not None and stat1 is not None:
            out.update(cores=stat1.cores, busy_s=stat1.busy_s - self._stat0.busy_s,
                       steal_s=stat1.steal_s - self._stat0.steal_s)
        if self.probe is not None:
            out.update(probe_ms=[self._probe0, probe1], probe_quiet_ms=self.probe.quiet(self.threads))
        loads = [x for x in (self._load0, load1) if x is not None]
        if loads:
            out.update(load1=[x[0] for x in loads], procs_running=[x[1] for x in loads])
        if self.gpu is not None:
            states = [g for g in (self._gpu0, self.gpu()) if g is not None]
            out["gpu"] = [asdict(g) for g in states] if states else None  # None: nvidia-smi did not answer
        return {**out, **verdict(out)}


def verdict(m: dict[str, Any]) -> dict[str, Any]:
    """``other_cores``, ``probe_slowdown``, ``disturbed`` and ``disturbed_reason`` from ``Watch``'s numbers.

    ``other_cores``: the CPU time other programs ran on the run's cores, plus
    steal, less the cores the run left free (cores - threads x local ranks),
    per second of the run; the rest of this process's CPU time is the run's
    (x ``local_ranks`` for the ranks beside it).
    """
    reasons = []
    other = float("nan")
    wall = m.get("wall_s") or 0.0
    if "busy_s" in m and wall > 0:
        others_s = max(0.0, m["busy_s"] - m["own_cpu_s"] * m.get("local_ranks", 1))
        free = max(0, m["cores"] - m["threads"] * m.get("local_ranks", 1))
        other = max(0.0, others_s / wall - free) + m["steal_s"] / wall
        if other > MAX_OTHER_CORES:
            reasons.append(f"other programs held {other:.2f} of the run's cores on average "
                           f"(> {MAX_OTHER_CORES:g}; /proc/stat over {wall:.1f} s)")
    for state in m.get("gpu") or []:
        if state["other_pids"]:
            reasons.append(f"other processes computed on the GPU (pids {', '.join(map(str, state['other_pids']))})")
        if state["throttle"]:
            reasons.append(f"the GPU's clocks were held down ({', '.join(state['throttle'])})")
        sm, top = state.get("sm_clock_mhz"), state.get("max_sm_clock_mhz")
        if sm and top and sm < MIN_SM_CLOCK_SHARE * top and not state.get("idle"):
            reasons.append(f"the GPU's SM clock ran at {sm:.0f} of its {top:.0f} MHz (< {MIN_SM_CLOCK_SHARE:.0%})")
    reasons = list(dict.fromkeys(reasons))  # before and after alike: said once
    slowdown = float("nan")
    probes = [p for p in m.get("probe_ms") or [] if p is not None]
    if probes and m.get("probe_quiet_ms"):
        slowdown = max(probes) / m["probe_quiet_ms"]
        if slowdown > MAX_PROBE_SLOWDOWN:
            reasons.append(f"the fixed CPU probe took {slowdown:.2f}x its quiet time around the run "
                           f"(> {MAX_PROBE_SLOWDOWN:g})")
    return {"other_cores": other, "probe_slowdown": slowdown, "disturbed": bool(reasons),
            "disturbed_reason": "; ".join(reasons)}


def pool(parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The contention of a run's repeats: each repeat's numbers, the worst ``other_cores`` and ``probe_slowdown``,
    disturbed when any repeat was (its reasons, by repeat). None when no repeat was watched."""
    watched = [(i, p) for i, p in enumerate(parts) if p is not None]
    if not watched:
        return None

    def worst(key: str) -> float:
        values = [p[key] for _, p in watched if p.get(key) == p.get(key)]  # NaN is not equal to itself
        return max(values) if values else float("nan")

    reasons = [f"repeat {i + 1}: {p['disturbed_reason']}" if len(parts) > 1 else p["disturbed_reason"]
               for i, p in watched if p.get("disturbed")]
    return {"other_cores": worst("other_cores"), "probe_slowdown": worst("probe_slowdown"),
            "disturbed": bool(reasons), "disturbed_reason": "; ".join(reasons), "repeats": [p for _, p in watched]}
