"""``hotcold bench embedding``: the harness's core embedding step against FBGEMM's TBE, and gather bandwidth.

The step is what the ``device`` store does per training step (host planning
of the batch's rows and distinct rows, the lookup into [B, K, D], the
gradient sum per distinct row and the row optimizer's sparse update), driven
through ``forward`` and ``backward`` as the loop drives it. The peer is
FBGEMM's table-batched embedding when ``fbgemm_gpu`` imports, otherwise
``torch.nn.EmbeddingBag`` with the same row-wise update; both run interleaved
on the same batches in one process (``time_step``). Defaults (a capped
Criteo-Kaggle step) and what it prints: docs/benchmarks.md.
"""
from __future__ import annotations

import csv
import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from hotcold.config import ConfigError
from hotcold.data.generators.config import CRITEO_KAGGLE_CARDINALITIES
from hotcold.data.powerlaw import draw_ranks, powerlaw_cdf
from hotcold.embedding.base import NullMarker, StoreSpec
from hotcold.embedding.rows import init_table
from hotcold.embedding.update import RowOptimizer
from hotcold.embedding.device import DeviceStore
from hotcold.machine import last_level_cache_bytes, load_average
from hotcold.timing import time_ms

OPTIMIZERS = ("sgd", "adagrad", "elementwise-adagrad")


@dataclass
class BenchConfig:
    """What ``hotcold bench embedding`` measures.

    Defaults are a capped Criteo-Kaggle step: 26 tables of at most 200k rows,
    dim 16, batch 2048, Zipf(1.2) ids, 1 thread.
    """

    threads: int = 1
    batch: int = 2048
    dim: int = 16
    cap: int = 200_000             # rows per table at most (Criteo Kaggle's 26 tables, capped)
    zipf: float = 1.2              # exponent of the ids' Zipf law within each table
    steps: int = 40                # timed steps of each side per repeat
    repeats: int = 7
    warmup: int = 5                # untimed steps of each side first
    check_steps: int = 20          # steps of the weight-agreement check
    device: str = "cpu"
    optimizers: tuple[str, ...] = ("sgd", "adagrad")  # per-element Adagrad on request (--optimizers)
    lr: float = 0.01
    eps: float = 1e-8
    fused: bool = True             # the harness's one-kernel backward + update (``RowOptimizer(fused=...)``)
    batches: int = 16              # distinct batches, cycled
    seed: int = 0
    table_sizes: list[int] = field(default_factory=list)  # default: Kaggle's cardinalities capped at ``cap``

    def validate(self) -> None:
        for name in ("threads", "batch", "dim", "cap", "steps", "repeats", "batches"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"bench: {name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("warmup", "check_steps"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise ConfigError(f"bench: {name} must be an integer >= 0, got {getattr(self, name)!r}")
        if not self.zipf > 0:
            raise ConfigError(f"bench: zipf must be > 0, got {self.zipf!r}")
        bad = [o for o in self.optimizers if o not in OPTIMIZERS]
        if bad or not self.optimizers:
            raise ConfigError(f"bench: optimizers must be some of {list(OPTIMIZERS)}, got {list(self.optimizers)}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"bench: device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("bench: --device cuda, but torch sees no GPU here")

    def sizes(self) -> list[int]:
        return list(self.table_sizes) or [min(int(n), self.cap) for n in CRITEO_KAGGLE_CARDINALITIES]


def zipf_batches(sizes: Sequence[int], batch: int, exponent: float, count: int, seed: int) -> list[torch.Tensor]:
    """``count`` id matrices int64 [batch, len(sizes)]: column t holds ids of table t, P(id = i) ~ (i + 1)^-exponent.

    Drawn as the generators draw theirs (``data.powerlaw``).
    """
    rng = np.random.default_rng(seed)
    cdf = powerlaw_cdf(max(sizes), exponent)
    ids = np.stack([draw_ranks(rng, count * batch, cdf, n) for n in sizes], 1).reshape(count, batch, len(sizes))
    return [torch.from_numpy(np.ascontiguousarray(b)) for b in ids]


# -- the two sides -------------------------------------------------------------------------------------------


class HarnessSide:
    """The ``device`` store, driven as the training loop drives it."""

    name = "hotcold device"

    def __init__(self, sizes: list[int], cfg: BenchConfig, optimizer: str, device: torch.device) -> None:
        opt = RowOptimizer(optimizer, cfg.lr, cfg.eps, fused=cfg.fused)
        self.store = DeviceStore(StoreSpec(list(sizes), cfg.dim, opt, device, seed=cfg.seed))
        self.optimizer = opt

    def prepare(self, ids: torch.Tensor, grad: torch.Tensor) -> Any:
        return ids, grad

    def step(self, prepared: Any) -> None:
        ids, grad = prepared
        self.store.forward(ids, NullMarker())
        self.store.backward(grad, NullMarker())

    def weights(self) -> torch.Tensor:
        return self.store.export()


class FbgemmSide:
    """FBGEMM's TBE (``hotcold.embedding.fbgemm.make_tbe``); its inputs are built outside the timed step."""

    name = "fbgemm tbe"

    def __init__(self, sizes: list[int], cfg: BenchConfig, optimizer: str, device: torch.device) -> None:
        from hotcold.embedding.fbgemm import make_tbe

        self.device = device
        opt = RowOptimizer(optimizer, cfg.lr, cfg.eps)
        self.tbe = make_tbe(sizes, cfg.dim, opt, device, weights=init_table(sizes, cfg.dim, cfg.seed))

    def prepare(self, ids: torch.Tensor, grad: torch.Tensor) -> Any:
        from hotcold.embedding.fbgemm import tbe_inputs

        indices, offsets = tbe_inputs(ids, self.device)
        return indices, offsets, grad.reshape(grad.shape[0], -1)  # [B, K*D], as the TBE's output

    def step(self, prepared: Any) -> None:
        indices, offsets, grad = prepared
        self.tbe(indices, offsets).backward(grad)

    def weights(self) -> torch.Tensor:
        from hotcold.embedding.fbgemm import tbe_weights

        return tbe_weights(self.tbe)


class TorchBagSide:
    """``torch.nn.EmbeddingBag`` (sum, sparse gradient) with the harness's row update (``RowOptimizer.apply``).

    The peer where FBGEMM does not import: what a user would write without it.
    """

    name = "torch EmbeddingBag"

    def __init__(self, sizes: list[int], cfg: BenchConfig, optimizer: str, device: torch.device) -> None:
        self.device, self.opt = device, RowOptimizer(optimizer, cfg.lr, cfg.eps)
        self.bag = torch.nn.EmbeddingBag(sum(sizes), cfg.dim, mode="sum", sparse=True, device=device)
        with torch.no_grad():
            self.bag.weight.copy_(init_table(sizes, cfg.dim, cfg.seed))
        self.state = self.opt.init_state(sum(sizes), cfg.dim, device)
        self.offsets = torch.tensor([0] + list(sizes[:-1]), dtype=torch.int64).cumsum(0)

    def prepare(self, ids: torch.Tensor, grad: torch.Tensor) -> Any:
        rows = (ids + self.offsets).reshape(-1)  # bags of one id each
        return rows.to(self.device), torch.arange(rows.numel(), device=self.device), grad.reshape(rows.numel(), -1)

    def step(self, prepared: Any) -> None:
        rows, offsets, grad = prepared
        self.bag(rows, offsets).backward(grad)
        g = self.bag.weight.grad.coalesce()
        self.bag.weight.grad = None
        slots, values = g.indices()[0], g.values()  # distinct rows [U], their summed gradients [U, D]
        self.opt.apply(self.bag.weight.data, self.state, slots, values)

    def weights(self) -> torch.Tensor:
        return self.bag.weight.detach().to("cpu", copy=True)


def peer_class(device: torch.device, dim: int) -> tuple[type, str | None]:
    """FBGEMM's TBE when it builds here (on ``device``, at ``dim``), else the EmbeddingBag peer, and why not FBGEMM.

    A tiny TBE is built first: a CPU-only FBGEMM wheel imports on a GPU machine but has no CUDA kernels,
    and FBGEMM takes only dims that are multiples of 4.
    """
    try:
        from hotcold.embedding.fbgemm import available, make_tbe
    except ImportError as e:
        return TorchBagSide, f"hotcold.embedding.fbgemm is missing ({e})"
    reason = available()
    if reason is not None:
        return TorchBagSide, reason
    try:
        make_tbe([8], dim, RowOptimizer("sgd", 0.1), device)
    except Exception as e:  # noqa: BLE001 - whatever stops FBGEMM here, the other peer runs and says why
        return TorchBagSide, f"FBGEMM's TBE does not run here ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return FbgemmSide, None


# -- timing --------------------------------------------------------------------------------------------------


def _run_steps(side: Any, prepared: list[Any], steps: int, start: int) -> None:
    for i in range(steps):
        side.step(prepared[(start + i) % len(prepared)])


def time_step(cfg: BenchConfig, optimizer: str, batches: list[torch.Tensor], grads: list[torch.Tensor],
              device: torch.device) -> dict[str, Any]:
    """ms/step of the harness and the peer, interleaved by repeat; their ratio; their weights' agreement.

    The peer is FBGEMM's table-batched embedding
    (``SplitTableBatchedEmbeddingBagsCodegen``, host placement on a CPU, device
    placement on a GPU) when ``fbgemm_gpu`` imports, otherwise
    ``torch.nn.EmbeddingBag`` (sum mode, sparse gradient) with the same
    row-wise update done in plain torch. Its inputs are built before the timed
    region (its best case); the harness's step includes its own planning.

    Both run on the same batches, interleaved in one process (on a CPU step by
    step, alternating which goes first; on a GPU a block of ``steps`` steps of
    each per repeat, timed with CUDA events), each sample timed by
    ``timing.time_ms``, and the result is the median over repeats of ms/step
    and of the per-repeat throughput ratio (peer ms / harness ms; > 1: the
    harness is faster), with the ratios' range. After timing, both are rebuilt
    from the same weights, trained ``check_steps`` steps on the same batches,
    and their weights compared (max abs difference).
    """
    sizes = cfg.sizes()
    peer_cls, why = peer_class(device, cfg.dim)
    ours, peer = HarnessSide(sizes, cfg, optimizer, device), peer_cls(sizes, cfg, optimizer, device)
    ours_in = [ours.prepare(b, g) for b, g in zip(batches, grads)]
    peer_in = [peer.prepare(b, g) for b, g in zip(batches, grads)]
    measure = functools.partial(time_ms, device=device)  # CUDA events on a GPU, the clock on a CPU
    _run_steps(ours, ours_in, max(cfg.warmup, 2), 0)
    _run_steps(peer, peer_in, max(cfg.warmup, 2), 0)
    ours_ms, peer_ms = [], []
    for r in range(cfg.repeats):
        if device.type == "cuda":  # a block of steps per side between two events, alternating which goes first
            pair = [(ours, ours_in, ours_ms), (peer, peer_in, peer_ms)]
            for side, prepared, out in (pair if r % 2 == 0 else pair[::-1]):
                out.append(measure(lambda: _run_steps(side, prepared, cfg.steps, r * cfg.steps)) / cfg.steps)
            continue
        # CPU: alternate step by step (A B B A ...), so a busy moment of a shared machine hits both sides
        times = [0.0, 0.0]
        for i in range(cfg.steps):
            k = r * cfg.steps + i
            for j in ((0, 1) if k % 2 == 0 else (1, 0)):
                side, prepared = (ours, ours_in) if j == 0 else (peer, peer_in)
                times[j] += measure(lambda: side.step(prepared[k % len(prepared)]))
        ours_ms.append(times[0] / cfg.steps)
        peer_ms.append(times[1] / cfg.steps)
    ratios = np.array(peer_ms) / np.array(ours_ms)
    diff = weight_agreement(cfg, optimizer, peer_cls, batches, grads, device) if cfg.check_steps else None
    return {"optimizer": optimizer, "hotcold_ms": float(np.median(ours_ms)), "peer": peer.name,
            "peer_ms": float(np.median(peer_ms)), "ratio": float(np.median(ratios)),
            "ratio_min": float(ratios.min()), "ratio_max": float(ratios.max()),
            "fused": ours.optimizer.fused and device.type == "cpu",  # the one-kernel step runs on the CPU
            "max_abs_diff": diff, "peer_note": why or ""}


def weight_agreement(cfg: BenchConfig, optimizer: str, peer_cls: type, batches: list[torch.Tensor],
                     grads: list[torch.Tensor], device: torch.device) -> float:
    """Max abs difference of the weights after ``check_steps`` steps of both sides from the same weights."""
    sizes = cfg.sizes()
    ours, peer = HarnessSide(sizes, cfg, optimizer, device), peer_cls(sizes, cfg, optimizer, device)
    _run_steps(ours, [ours.prepare(b, g) for b, g in zip(batches, grads)], cfg.check_steps, 0)
    _run_steps(peer, [peer.prepare(b, g) for b, g in zip(batches, grads)], cfg.check_steps, 0)
    return float((ours.weights() - peer.weights()).abs().max())


def gather_bandwidth(cfg: BenchConfig, ids: torch.Tensor, device: torch.device) -> list[dict[str, Any]]:
    """GB/s of a batch-sized ``index_select`` of rows against a copy of the same bytes, in the same run.

    Cases: the benchmark's Zipf batch from the big table; uniform ids over the
    big table; uniform ids over a table of a quarter of the last-level cache
    (the CPU's; a GPU's L2), or 1 MiB when it is unknown. Median of ``repeats`` x 20 calls each.
    A batch-sized gather is B*K rows of D floats from the store's table; the
    CPU's cache size comes from ``hotcold.machine``.
    """
    sizes = cfg.sizes()
    table = init_table(sizes, cfg.dim, cfg.seed).to(device)                   # [N, D]
    offsets = torch.tensor([0] + sizes[:-1], dtype=torch.int64).cumsum(0)
    n_rows, row_bytes = table.shape[0], cfg.dim * table.element_size()
    llc = last_level_cache_bytes() if device.type == "cpu" else \
        getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None)
    small_rows = max(1, (llc // 4 if llc else 1 << 20) // row_bytes)
    gen = torch.Generator().manual_seed(cfg.seed)
    count = ids.numel()
    cases = {
        "zipf ids, big table": ((ids + offsets).reshape(-1), n_rows),
        "uniform ids, big table": (torch.randint(0, n_rows, (count,), generator=gen), n_rows),
        "uniform ids, cache-sized table": (torch.randint(0, min(small_rows, n_rows), (count,), generator=gen),
                                           min(small_rows, n_rows)),
    }
    src = torch.randn(count, cfg.dim, device=device)
    dst = torch.empty_like(src)
    measure = functools.partial(time_ms, device=device)
    out = []
    for case, (rows, n) in cases.items():
        rows = rows.to(device)
        gathered = torch.empty(count, cfg.dim, device=device)
        gather_ms, copy_ms = [], []
        for _ in range(cfg.repeats):  # interleaved, 20 calls per sample
            gather_ms.append(measure(lambda: [torch.index_select(table, 0, rows, out=gathered)
                                              for _ in range(20)]) / 20)
            copy_ms.append(measure(lambda: [dst.copy_(src) for _ in range(20)]) / 20)
        nbytes = count * row_bytes
        g, c = float(np.median(gather_ms)), float(np.median(copy_ms))
        out.append({"case": case, "rows": count, "table_rows": n, "table_mb": n * row_bytes / 2**20,
                    "bytes": nbytes, "gather_gbs": nbytes / g / 1e6, "memcpy_gbs": nbytes / c / 1e6,
                    "share": c / g})
    return out


# -- the verb --------------------------------------------------------------------------------------------------


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Every measurement of the benchmark, as a dict (``config``, ``step``, ``gather``, ``load``)."""
    cfg.validate()
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    load_before = load_average()
    sizes = cfg.sizes()
    batches = zipf_batches(sizes, cfg.batch, cfg.zipf, cfg.batches, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    grads = [torch.randn(cfg.batch, len(sizes), cfg.dim, generator=gen).to(device) for _ in batches]
    steps = [time_step(cfg, o, batches, grads, device) for o in cfg.optimizers]
    gather = gather_bandwidth(cfg, batches[0], device)
    return {"config": {**asdict(cfg), "table_sizes": sizes, "rows": sum(sizes), "torch": torch.__version__},
            "step": steps, "gather": gather, "load": {"before": load_before, "after": load_average()}}


def render(result: dict[str, Any]) -> str:
    """The result as the text the verb prints."""
    cfg = result["config"]
    lines = [f"core embedding step: {len(cfg['table_sizes'])} tables, {cfg['rows']} rows, dim {cfg['dim']}, "
             f"batch {cfg['batch']}, Zipf {cfg['zipf']}, {cfg['threads']} thread(s), {cfg['device']}; "
             f"median of {cfg['repeats']} repeats x {cfg['steps']} steps, interleaved",
             f"{'optimizer':<10}{'hotcold ms':>11}{'peer':>22}{'peer ms':>9}{'ratio':>7}  "
             f"{'(min..max)':<13}{'max |dw|':>9}  fused"]
    for s in result["step"]:
        diff = "n/a" if s["max_abs_diff"] is None else f"{s['max_abs_diff']:.1e}"
        lines.append(f"{s['optimizer']:<10}{s['hotcold_ms']:>11.3f}{s['peer']:>22}{s['peer_ms']:>9.3f}"
                     f"{s['ratio']:>7.2f}  ({s['ratio_min']:.2f}..{s['ratio_max']:.2f})"
                     f"{diff:>10}  {'yes' if s['fused'] else 'no'}")
    notes = {s["peer_note"] for s in result["step"] if s["peer_note"]}
    lines += [f"  peer note: {n}" for n in sorted(notes)]
    lines.append("ratio: peer ms / hotcold ms (> 1: hotcold is faster)")
    lines.append("")
    lines.append(f"gather bandwidth (index_select of {result['gather'][0]['rows']} rows vs a copy of the same bytes):")
    lines.append(f"{'case':<32}{'table MiB':>10}{'gather GB/s':>13}{'memcpy GB/s':>13}{'share':>7}")
    for g in result["gather"]:
        lines.append(f"{g['case']:<32}{g['table_mb']:>10.1f}{g['gather_gbs']:>13.2f}{g['memcpy_gbs']:>13.2f}"
                     f"{g['share']:>7.0%}")
    load = result["load"]
    lines.append(f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}")
    return "\n".join(lines)


def write(result: dict[str, Any], path: Path) -> None:
    """``--out``: the whole result as JSON (``.json``), or the step and gather rows as CSV (``.csv``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(result, indent=2) + "\n")
        return
    if path.suffix != ".csv":
        raise ConfigError(f"bench: --out must end in .json or .csv, got {path.name!r}")
    rows = [{"kind": "step", **s} for s in result["step"]] + [{"kind": "gather", **g} for g in result["gather"]]
    names = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        w.writerows(rows)
