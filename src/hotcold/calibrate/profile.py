"""``hotcold calibrate``: measure this machine's rates with micro-benchmarks and write a hardware profile.

The cost model prices counters with a profile's rates; this verb measures
them here, so that modelled and measured times can be compared on the
machine that ran the runs. Each benchmark times the operation the stores
really run, on tables and ids shaped like the runs' (``Calibration``); on a
CPU the profile is of kind ``cpu`` (host memory is the trainer device),
with ``--device cuda`` it adds the GPU's rates (``calibrate``). The rates:
docs/costmodel.md, "Hardware profiles" and "Calibration". The benchmarks:
``calibrate.host``, ``calibrate.network`` and ``calibrate.device``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hotcold.calibrate.device import cuda_rates, dense_rates
from hotcold.calibrate.host import host_rates
from hotcold.calibrate.network import network_rates
from hotcold.calibrate.rates import Calibration
from hotcold.config import ConfigError
from hotcold.costmodel.profile import profile_from_dict
from hotcold.files import atomic_write_text


def calibrate(device: str = "cpu", dim: int = 16, batch_size: int = 1024, lookups: int | None = None,
              repeats: int = 15, table_mib: int = 64, name: str | None = None, network: bool = True,
              threads: int | None = None) -> dict[str, Any]:
    """Measure the rates; the profile as a mapping (validated by ``costmodel.profile_from_dict``).

    ``network``: on a CPU, also time loopback gloo collectives (two spawned processes, a few seconds).
    ``threads``: torch's intra-op threads for the benchmarks, as the training jobs set them (None: as they are).

    On a CPU the trainer device is host memory and ``.to(cpu)`` is a no-op, so
    the profile is of kind ``cpu`` with host rates, the core count, how fast
    one-thread processes run side by side (the dense step alone, then one per core
    at once), and the network rates of the scale-out runs here: P gloo processes on this machine,
    whose "nodes" are simulated, so intra- and inter-node traffic both go over
    loopback; two processes of one thread each time ``all_to_all_single`` at a few
    sizes and a line ``latency + bytes / bandwidth`` is fitted. With
    ``device="cuda"`` it adds pinned H2D/D2H bandwidth, device bandwidth, a device
    row gather's share of it and the kernel latency, timed with CUDA events, and
    the dense rate on the GPU; NCCL collectives need two GPUs, so a CUDA profile
    has no network rates.
    """
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"calibrate: device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("calibrate: --device cuda, but torch sees no GPU")
    for key, v in (("dim", dim), ("batch_size", batch_size), ("repeats", repeats), ("table_mib", table_mib)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"calibrate: {key} must be a positive integer, got {v!r}")
    cal = Calibration(dim, batch_size, lookups or 26 * batch_size, repeats, table_mib)
    host_rates(cal)
    on = None
    if device == "cuda":
        on = cuda_rates(cal)
        dense_rates(cal, torch.device("cuda"), max(cal.rates["host_op_us"]["value"],
                                                   cal.rates["device_kernel_us"]["value"]), on)
    else:
        dense_rates(cal, torch.device("cpu"), cal.rates["host_op_us"]["value"])
        if network:
            network_rates(cal)
    label = on or cal.cpu
    left = ("; no network rates: NCCL collectives need two GPUs" if device == "cuda"
            else "" if network else "; no network rates (not asked for)") + "".join(f"; {n}" for n in cal.notes)
    profile = {"name": name or f"calibrated-{device}",
               "description": f"{label}, torch {torch.__version__}, measured by hotcold calibrate on {cal.when}"
                              f"{left}",
               "kind": "gpu" if device == "cuda" else "cpu", "rates": cal.rates}
    profile_from_dict(profile, "calibrate")  # what we write must load
    return profile


def write_profile(profile: dict[str, Any], out: Path) -> Path:
    import yaml

    return atomic_write_text(Path(out), yaml.safe_dump(profile, sort_keys=False, width=120))
