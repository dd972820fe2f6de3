"""Hardware profiles: how fast a machine does each kind of work the cost model prices.

A profile (``workflows/config/hardware/*.yaml``, or ``hotcold calibrate``'s
output) gives every rate with its unit and its source. ``kind`` ``cpu``: the
trainer device is host memory (no host-device transfers); ``gpu``: a GPU
beside its host. Host rates are always needed, device rates on a GPU; the
network's (``COMM_RATES``) only to model collectives, and the shared cores'
(``SHARED_RATES``) only where ranks share one machine's cores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hotcold.config import ConfigError, parse_yaml

KINDS = ("cpu", "gpu")

#: rate -> (unit, what it is); every profile gives these
HOST_RATES = {
    "host_memory_bw": ("GB/s", "host memory bandwidth (a large memcpy: bytes copied / time)"),
    "host_gather_row_ns": ("ns/row", "fixed cost per row of a host row gather (index_select) beyond its bytes"),
    "host_scatter_row_ns": ("ns/row", "fixed cost per row of a host row scatter (index_copy_/index_add_)"),
    "host_id_plan_ns": ("ns/id", "global rows from column ids (offset add, padding check)"),
    "host_unique_ns": ("ns/id", "RowGroups.of (lookups grouped by row, one sort), per id of a batch"),
    "host_directory_row_ns": ("ns/row", "cache/scratchpad directory bookkeeping per unique row"),
    "host_directory_slot_ns": ("ns/slot", "directory scan per slot when choosing victims"),
    "host_op_us": ("us/op", "host dispatch latency of one tensor op"),
    "dense_flops": ("GFLOP/s", "fp32 rate the DLRM MLPs and interaction reach (forward, backward, optimizer)"),
    "host_cache_mib": ("MiB", "last-level cache of the host: the tables that fit in it use the cached row rates"),
    "host_cached_gather_row_ns": ("ns/row", "a host row gather from a table that fits in the last-level cache, "
                                            "per row, its bytes included"),
    "host_cached_scatter_row_ns": ("ns/row", "a host row scatter into a table that fits in the last-level cache, "
                                             "per row, its bytes included"),
    "host_data_sample_ns": ("ns/sample", "the loader's read of one sample (memory-mapped dense features, ids and "
                                         "label at sorted rows, into tensors) beyond its bytes"),
}
#: optional: the cores the processes of a ``cpu`` profile's machine share
SHARED_RATES = {
    "host_cores": ("count", "cores the host's processes share: P ranks of t threads beyond them slow down"),
    "host_parallel_efficiency": ("fraction", "a one-thread process's speed when every core runs one, as a share "
                                             "of its speed alone (shared caches, memory, hyperthreads)"),
}
DEVICE_RATES = {
    "pcie_h2d_bw": ("GB/s", "host-to-device copy bandwidth, pinned, effective"),
    "pcie_d2h_bw": ("GB/s", "device-to-host copy bandwidth, pinned, effective"),
    "pcie_latency_us": ("us", "latency of one host-device copy"),
    "device_memory_bw": ("GB/s", "device memory bandwidth"),
    "device_gather_efficiency": ("fraction", "share of device bandwidth a row gather/scatter of D floats reaches"),
    "device_kernel_us": ("us", "kernel launch latency"),
}
#: optional on a ``gpu`` profile: the dense step where it is bound by launching its ops, not by arithmetic
#: (without them its ops are priced at ``max(host_op_us, device_kernel_us)`` each)
LAUNCH_RATES = {
    "dense_op_us": ("us/op", "one op of the DLRM dense step (forward, autograd backward, optimizer) launched "
                             "eagerly: a small step's time / its ops (ModelShape.dense_ops)"),
    "dense_graph_op_us": ("us/op", "the same step replayed as a CUDA graph: its time / its ops"),
}
COMM_RATES = {
    "collective_latency_us": ("us", "latency of one collective"),
    "intra_node_bw": ("GB/s", "intra-node (NVLink) bandwidth per GPU, one direction"),
    "inter_node_bw": ("GB/s", "inter-node (InfiniBand/Ethernet) bandwidth per GPU, one direction"),
    "gpus_per_node": ("count", "GPUs (ranks) per node"),
}
ALL_RATES = {**HOST_RATES, **SHARED_RATES, **DEVICE_RATES, **LAUNCH_RATES, **COMM_RATES}


@dataclass(frozen=True)
class Rate:
    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class HardwareProfile:
    """A machine's rates; ``kind`` ``cpu``: the trainer device is host memory (no transfers)."""

    name: str
    description: str
    kind: str
    rates: dict[str, Rate]

    def value(self, key: str) -> float:
        if key not in self.rates:
            raise ConfigError(f"hardware profile {self.name!r} has no rate {key!r} (needed here)")
        return self.rates[key].value

    def has(self, key: str) -> bool:
        return key in self.rates

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "kind": self.kind,
                "rates": {k: {"value": r.value, "unit": r.unit, "source": r.source} for k, r in self.rates.items()}}


def required_rates(kind: str) -> dict[str, tuple[str, str]]:
    """The rates a profile of ``kind`` must give. The network's (``COMM_RATES``) are optional: a
    calibrated single-machine profile has none, and modelling a collective without them is an error."""
    return {**HOST_RATES, **DEVICE_RATES} if kind == "gpu" else dict(HOST_RATES)


def profile_from_dict(data: Any, where: str) -> HardwareProfile:
    """Validate a profile mapping; every problem is a ConfigError naming ``where`` and the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a hardware profile must be a mapping")
    unknown = sorted(set(data) - {"name", "description", "kind", "rates"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: description, kind, name, rates")
    for key in ("name", "description"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ConfigError(f"{where}: {key} must be a non-empty string")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
    raw = data.get("rates")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: rates must be a mapping of rate -> {{value, unit, source}}")
    need = required_rates(kind)
    bad = sorted(set(raw) - set(ALL_RATES))
    if bad:
        raise ConfigError(f"{where}: unknown rate(s) {bad}; known: {sorted(ALL_RATES)}")
    missing = sorted(set(need) - set(raw))
    if missing:
        raise ConfigError(f"{where}: missing rate(s) {missing} (a {kind} profile needs {sorted(need)})")
    rates = {}
    for key, entry in raw.items():
        at = f"{where}: rates.{key}"
        if not isinstance(entry, Mapping) or set(entry) != {"value", "unit", "source"}:
            raise ConfigError(f"{at} must be a mapping with exactly value, unit and source")
        v = entry["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{at}: value must be a finite number > 0, got {v!r}")
        unit = ALL_RATES[key][0]
        if entry["unit"] != unit:
            raise ConfigError(f"{at}: unit must be {unit!r}, got {entry['unit']!r}")
        if not isinstance(entry["source"], str) or len(entry["source"].strip()) < 8:
            raise ConfigError(f"{at}: source must say where the value comes from, got {entry['source']!r}")
        if key in ("device_gather_efficiency", "host_parallel_efficiency") and v > 1:
            raise ConfigError(f"{at}: a share of the bandwidth is at most 1, got {v!r}")
        rates[key] = Rate(float(v), unit, entry["source"].strip())
    return HardwareProfile(data["name"], data["description"].strip(), kind, rates)


def load_profile(path: str | Path) -> HardwareProfile:
    """A hardware profile from a YAML file (see ``workflows/config/hardware/``)."""
    import yaml

    path = Path(path)
    try:
        data = parse_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    return profile_from_dict(data, str(path))
