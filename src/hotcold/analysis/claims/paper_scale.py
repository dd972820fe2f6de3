"""The claims at paper scale: the paper-scale configuration's outputs as workloads, and the knob sweeps.

The paper-scale configuration (``workflows/config/paper-scale-cpu.yaml``)
trains what fits one machine and simulates the rest: ``hotcold simulate``
(caches, scratchpads, FAE) and ``hotcold shard-sim`` (the sharding plans,
weak-scaled). ``PaperScale`` holds those outputs with the configurations they
were simulated under; ``workloads`` turns a claim's run role into cost-model
workloads, from the trained records where the run trained the role, else
from the simulators' counters (``costmodel.simulated``). A dataset is at
paper scale when its tables have their real sizes (a generated dataset with
``max_rows_per_table: null``, or a prepared real one); otherwise the claims
table's paper-scale column says so in one line.

``sweep_profile`` and ``SPEED_KNOBS``/``COMM_KNOBS`` scale one group of a
hardware profile's rates; the claims table prices the same workloads under
each and keeps the values in ``claims_sweep.csv``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from hotcold.costmodel.profile import HardwareProfile, Rate
from hotcold.costmodel.workload import ModelShape
from hotcold.costmodel.simulated import lookup_workload, method_of_policy, simulated_workload

#: the multiples of a profile's rates a sweep prices the claims at
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: the shares a workload knob (FAE's hot batches, Proactive's early lookups) is swept over
SHARES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
#: steps of the trace read for Proactive's early lookups at the paper-scale global batch
EARLY_STEPS = 4

#: knob -> (rates scaled together, True where a larger value is faster; ns rates are divided)
SPEED_KNOBS: dict[str, tuple[tuple[str, ...], bool]] = {
    "PCIe bandwidth": (("pcie_h2d_bw", "pcie_d2h_bw"), True),
    "host memory bandwidth": (("host_memory_bw",), True),
    "host per-row and per-id costs": (("host_gather_row_ns", "host_scatter_row_ns", "host_id_plan_ns",
                                       "host_unique_ns", "host_directory_row_ns", "host_directory_slot_ns",
                                       "host_cached_gather_row_ns", "host_cached_scatter_row_ns",
                                       "host_data_sample_ns", "host_op_us"), False),
    "device memory bandwidth": (("device_memory_bw",), True),
    "dense FLOP/s": (("dense_flops",), True),
}
COMM_KNOBS: dict[str, tuple[tuple[str, ...], bool]] = {
    "inter-node bandwidth": (("inter_node_bw",), True),
    "intra-node bandwidth": (("intra_node_bw",), True),
    "collective latency": (("collective_latency_us",), False),
}


def sweep_profile(profile: HardwareProfile, rates: Sequence[str], faster: bool, factor: float) -> HardwareProfile:
    """``profile`` with ``rates`` made ``factor`` x faster (bandwidths multiplied, per-item costs divided);
    rates the profile lacks stay absent."""
    scaled = dict(profile.rates)
    for key in rates:
        if key in scaled:
            r = scaled[key]
            scaled[key] = Rate(r.value * factor if faster else r.value / factor, r.unit,
                               f"{r.source} (x{factor:g} faster in a sweep)")
    return replace(profile, rates=scaled, name=f"{profile.name} ({', '.join(rates)} x{factor:g})")


# --- the outputs -------------------------------------------------------------------------------------------------

def capped_tables(manifest: Mapping[str, Any]) -> str:
    """Why a dataset is not at paper scale ("" when its tables have their real sizes)."""
    gen = manifest.get("generator")
    if isinstance(gen, str):
        try:
            gen = json.loads(gen)
        except ValueError:
            gen = None
    if isinstance(gen, Mapping):
        cap = gen.get("max_rows_per_table")
        scale = gen.get("scale", 1.0)
        if cap is not None:
            return f"tables capped at {int(cap):,} rows each ({sum(manifest.get('cardinalities', [])):,} rows)"
        if scale not in (None, 1, 1.0):
            return f"tables scaled to {scale:g} of their real sizes"
    return ""


@dataclass
class PaperScale:
    """The paper-scale outputs of one reproduction: simulations by dataset and the configs they ran under.

    ``configs``: dataset -> ``{"simulate": {seed, train}, "shard_sim": {seed, train, model}}`` (the
    workflow's ``simulate_config`` and ``shard_sim_config``); ``data_dir``: the datasets' directory.
    """

    sims: dict[str, pd.DataFrame] = field(default_factory=dict)
    shard_sims: dict[str, pd.DataFrame] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    data_dir: Path | None = None
    _shapes: dict[str, ModelShape] = field(default_factory=dict, repr=False)
    _datasets: dict[str, Any] = field(default_factory=dict, repr=False)
    _traces: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, sims: Sequence[Path], shard_sims: Sequence[Path], configs: Mapping[str, Any] | str | None,
             data_dir: str | Path | None) -> "PaperScale":
        """From ``hotcold simulate``/``shard-sim`` CSVs (named ``<dataset>.csv``) and the configs (JSON text)."""
        cfg = json.loads(configs) if isinstance(configs, str) else dict(configs or {})
        return cls({Path(p).stem: pd.read_csv(p) for p in sims}, {Path(p).stem: pd.read_csv(p) for p in shard_sims},
                   cfg, Path(data_dir) if data_dir else None)

    def dataset(self, name: str) -> Any:
        from hotcold.data.format import Dataset

        if name not in self._datasets:
            path = (self.data_dir or Path(".")) / name
            self._datasets[name] = Dataset.open(path) if (path / "manifest.json").is_file() else None
        return self._datasets[name]

    def absent(self, name: str, need: str = "sim") -> str:
        """One line saying why ``name`` has no paper-scale outputs of kind ``need`` (``sim``, ``shard_sim``,
        ``data``); "" when it has them."""
        ds = self.dataset(name)
        if ds is None:
            return f"paper-scale outputs absent: no dataset {name} under {self.data_dir}"
        capped = capped_tables(ds.manifest)
        if capped:
            return (f"paper-scale outputs absent: {name}'s {capped}; run the paper-scale configuration "
                    f"(workflows/config/paper-scale-cpu.yaml)")
        frames = {"sim": self.sims, "shard_sim": self.shard_sims}.get(need)
        if frames is not None and (name not in frames or name not in self.configs):
            verb = "simulate" if need == "sim" else "shard-sim"
            return f"paper-scale outputs absent: no `hotcold {verb}` output or config for {name}"
        return ""

    def model_config(self, name: str) -> Any:
        from hotcold.run_config import RunConfig

        cfg = self.configs.get(name, {})
        model = cfg.get("model") or cfg.get("shard_sim", {}).get("model") or {}
        return RunConfig.from_dict({"dataset": name, "method": "-", "model": model}).model

    def shape(self, name: str) -> ModelShape:
        if name not in self._shapes:
            self._shapes[name] = ModelShape.of(self.dataset(name), self.model_config(name))
        return self._shapes[name]

    def sim_batch(self, name: str) -> int:
        return int(self.configs[name]["simulate"]["train"]["batch_size"])

    def row_optimizer(self, name: str) -> str:
        return str(self.configs[name]["simulate"]["train"].get("row_optimizer", "adagrad"))

    def trace_counters(self, name: str, batch_size: int) -> dict[str, float]:
        """Lookups, unique rows and Proactive's early lookups (depth 1: rows the previous step did not
        update) per step of ``batch_size`` samples, over the first ``EARLY_STEPS`` steps of the shard-sim
        config's batch order."""
        key = (name, batch_size)
        if key not in self._traces:
            from hotcold.run_config import RunConfig
            from hotcold.data.order import global_batches

            sc = self.configs[name]["shard_sim"]
            train = {**sc.get("train", {}), "steps": EARLY_STEPS, "warmup_steps": 0}
            cfg = RunConfig.from_dict({"dataset": name, "method": "-", "seed": sc.get("seed", 0), "train": train,
                                       "model": sc.get("model", {})})
            self._traces[key] = early_counters(global_batches(self.dataset(name), cfg, batch_size))
        return self._traces[key]


def early_counters(batches: Any) -> dict[str, float]:
    """Mean lookups and unique rows per step, and the mean lookups per step (after the first) whose rows the
    step before did not touch: Proactive's early lookups at depth 1 (a row plan: each row has one owner)."""
    lookups, unique, early, prev = [], [], [], None
    for batch in batches:
        ids = batch.reshape(-1)
        ids = ids[ids >= 0]
        rows = np.unique(ids)
        lookups.append(ids.size)
        unique.append(rows.size)
        if prev is not None:
            early.append(int((~np.isin(ids, prev, assume_unique=False)).sum()))
        prev = rows
    mean = lambda v: float(np.mean(v)) if v else 0.0  # noqa: E731
    return {"lookups": mean(lookups), "unique_rows": mean(unique), "early_lookups": mean(early)}


# --- roles -> workloads ------------------------------------------------------------------------------------------

@dataclass
class Resolved:
    """A run role's workloads at paper scale and where they come from."""

    workloads: list[Any]
    source: str            # "trained fae/256mib" or "simulated fae-epoch at 24.8% of the rows"
    budget: str = ""       # the budget in words


def _sim_rows(frame: pd.DataFrame, run: Any) -> pd.DataFrame:
    """The ``hotcold simulate`` rows of a run role: its policy, its options, then its pick."""
    if frame is None or frame.empty:
        return frame.iloc[0:0] if frame is not None else pd.DataFrame()
    ok = frame[frame["feasible"].astype(bool)] if "feasible" in frame else frame
    methods = ok["policy"].map(lambda p: _safe_method(str(p)))
    rows = ok[methods == run.method]
    opts = dict(run.options)
    if "cache_ratio" in opts:
        rows = rows[np.isclose(rows["cache_ratio"].astype(float), float(opts["cache_ratio"]))]
    if run.method == "scratchpipe":
        rows = rows[rows["policy"] == f"scratchpipe-{int(opts.get('window', 2))}"]
    if run.method == "fae":
        rows = rows[rows["policy"] == f"fae-{opts.get('run_length', 'epoch')}"]
    if rows.empty:
        return rows
    if run.pick == "largest":
        return rows[rows["capacity"] == rows["capacity"].max()].iloc[:1]
    if run.pick == "smallest":
        return rows[rows["capacity"] == rows["capacity"].min()].iloc[:1]
    return rows.iloc[:1]


def _safe_method(policy: str) -> str:
    try:
        return method_of_policy(policy)
    except Exception:
        return ""


def budget_words(method: str, capacity: float, rows: float, dim: int) -> str:
    if method in ("device", "hybrid") or not capacity:
        return ""
    share = f"{100 * capacity / rows:.3g}% of the rows" if rows else f"{capacity:,.0f} rows"
    if method == "fae":
        return f"hot rows {capacity:,.0f} ({share}, {capacity * dim * 4 / 2**20:,.0f} MiB of weights)"
    return f"{capacity:,.0f} slots ({share})"


def resolve(paper: PaperScale, dataset: str, run: Any, trained: list[dict[str, Any]], trained_key: float,
            shape_of: Any) -> Resolved | str:
    """The workloads of role ``run`` on ``dataset`` at paper scale: ``trained`` records (the role's pick among
    the trained variants, ``trained_key`` its budget) unless the simulated candidate is a larger budget
    (``largest``) or none is trained; else the simulated row. A string: why there is none."""
    from hotcold.costmodel.workload import Workload

    shape = paper.shape(dataset)
    frame = paper.sims.get(dataset)
    sim = _sim_rows(frame, run) if frame is not None and run.method not in ("device", "hybrid") else None
    use_sim = not trained or (run.pick == "largest" and sim is not None and not sim.empty
                              and float(sim.iloc[0]["capacity"]) > trained_key * 1.01)
    if not use_sim:
        rec = trained[0]
        report = rec.get("store") or {}
        cap = float(report.get("hot_rows") or report.get("capacity") or 0)
        return Resolved([Workload.from_record(r, shape_of(r) or shape) for r in trained],
                        f"trained {rec['method']}/{rec['variant']}", budget_words(run.method, cap, shape.rows,
                                                                                  shape.dim))
    if frame is None:
        return f"no trained {run.method} and no `hotcold simulate` output for {dataset}"
    batch, opt = paper.sim_batch(dataset), paper.row_optimizer(dataset)
    if run.method in ("device", "hybrid"):
        first = frame.iloc[0]
        per_step = {k: float(first[k]) / float(first["steps"]) for k in ("lookups", "unique_rows")}
        return Resolved([lookup_workload(run.method, per_step, shape, batch, opt)],
                        f"simulated trace ({int(first['steps'])} steps)")
    if sim is None or sim.empty:
        return f"no trained or simulated {run.method} ({run.describe()}) on {dataset}"
    row = sim.iloc[0]
    return Resolved([simulated_workload(row.to_dict(), shape, batch, opt)],
                    f"simulated {row['policy']} ({int(row['steps'])} steps)",
                    budget_words(run.method, float(row["capacity"]), shape.rows, shape.dim))


def workload_words(shape: ModelShape, batch: int, source: str, budget: str = "", world: int = 1,
                   ranks_per_node: int = 1, model_name: str = "") -> str:
    """``DLRM (dim 16, bottom 512-256-64-16, top 512-256-1), batch 2,048, 33.8M rows, ...; counters: ...``."""
    kind = "TBSM-style sequence model" if shape.history else "DLRM"
    model = (f"{kind} (dim {shape.dim}, " + (f"bottom {'-'.join(map(str, shape.bottom_mlp))}, " if not shape.history
                                              else f"history {shape.history}, ")
             + f"top {'-'.join(map(str, shape.top_mlp))})")
    scale = f" at {world // ranks_per_node}x{ranks_per_node}" if world > 1 else ""
    parts = [model, f"batch {batch:,}{scale}", f"{shape.rows / 1e6:.1f}M rows"]
    if budget:
        parts.append(budget)
    return "; ".join(parts) + f"; counters: {source}"
