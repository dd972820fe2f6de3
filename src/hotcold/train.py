"""The one training loop and evaluation. It never names a technique.

Per step: take the step's inputs from the step pipeline (``data``: the batch
read, its rows planned by the store, its dense features and labels on the
device; prepared while the previous step trained, or just now with
``train.pipeline`` off), let the store look up and pool the embeddings, run
the dense forward and backward and the dense optimizer (``dense_fwd_bwd``),
and hand the embedding gradients back to the store for the sparse update.
The store marks its own phases (``emb_fwd``, ``h2d``, ``d2h``, ``emb_update``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from hotcold.config import ConfigError
from hotcold.run_config import RunConfig
from hotcold.data.format import Dataset
from hotcold.data.loader import BatchLoader, eval_batches, release_pages
from hotcold.data.packed import PackedBuffers
from hotcold.data.order import batch_rows
from hotcold.data.skew import row_counts
from hotcold.distributed.batch import batch_option, check_batch_fits
from hotcold.distributed.world import World
from hotcold import methods
from hotcold.accel import runtime
from hotcold.embedding.base import EmbeddingStore, StoreSpec
from hotcold.embedding.device import DeviceStore
from hotcold.options.base import NoOptions
from hotcold.embedding.update import RowOptimizer
from hotcold.memory import require_memory
from hotcold.metrics import log_loss, roc_auc
from hotcold.model import build_model
from hotcold.model.optim import DenseAdagrad, DenseOptimizer, DenseSGD
from hotcold.dense_step import DenseStep, check_graphs
from hotcold.pipeline import StepPipeline, pipeline_on
from hotcold.timing import PhaseTimer, TimedPart, summarize_repeats


class DivergedError(RuntimeError):
    """Training produced a non-finite loss or parameter: the run ends as a ``diverged`` record naming ``step``."""

    def __init__(self, step: int, what: str, cfg: RunConfig) -> None:
        t = cfg.train
        self.step = step
        super().__init__(f"non-finite {what} at step {step} of {t.steps} (counted from 0; "
                         f"lr {t.lr:g}, dense_lr {t.dense_lr:g}, {t.row_optimizer}/{t.dense_optimizer})")


class DivergenceGuard:
    """Watches the training loss and the parameters for a non-finite value without a host sync per step.

    Each step's loss tensor is kept as it is, on the device (``see``); every
    ``every`` steps, where the CUDA phase timer synchronises anyway, and after
    the last step (``check``), the losses since the last check are tested at
    once. A parameter that turns non-finite makes the next step's loss
    non-finite (every dense parameter and every looked-up row reaches the
    logit), so parameters are tested once, at the end (``finish``: the dense
    ones and every embedding row, which covers the last update). Over several
    ranks the first bad step is agreed by one (uncounted) all-reduce at each
    check, so every rank stops at the same check.
    """

    NONE = 1 << 62

    def __init__(self, cfg: RunConfig, world: World) -> None:
        self.cfg, self.world, self.every = cfg, world, cfg.timing.window
        self.steps = cfg.train.steps
        self._seen: list[tuple[int, torch.Tensor]] = []  # (step, loss) since the last check, left on the device

    def see(self, step: int, loss: torch.Tensor) -> None:
        if loss.device.type != "meta":  # a step on meta tensors (the host's work alone) has no values to check
            self._seen.append((step, loss.detach()))

    def check(self, step: int) -> None:
        """At every ``every``-th step and the last: raise ``DivergedError`` if anything seen so far is non-finite."""
        if (step + 1) % self.every and step + 1 < self.steps:
            return
        first, what = self.NONE, ""
        if self._seen:
            bad = (~torch.isfinite(torch.stack([loss for _, loss in self._seen]))).nonzero()
            if bad.numel():
                first, what = self._seen[int(bad[0])][0], "loss"
        self._seen = []
        agreed = self.world.first_across(first)
        if agreed != self.NONE:
            raise DivergedError(agreed, what if agreed == first else "loss or parameter (on another rank)", self.cfg)

    def finish(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """After training: every parameter (the embedding rows too) must be finite."""
        bad = [name for name, t in named if not _all_finite([t])]
        last = self.steps - 1
        if self.world.first_across(last if bad else self.NONE) != self.NONE:  # every rank stops, or none
            what = f"parameter {bad[0]}" if bad else "parameter (on another rank)"
            raise DivergedError(last, f"{what} after the last step", self.cfg)


FINITE_CHUNK = 1 << 22  # elements tested at once: a table of many rows needs no mask of its own size


def _all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite (a large one in chunks of ``FINITE_CHUNK`` elements)."""
    for t in tensors:
        flat = t.detach().reshape(-1)
        for a in range(0, flat.numel(), FINITE_CHUNK):
            if not bool(torch.isfinite(flat[a:a + FINITE_CHUNK]).all()):
                return False
    return True


@dataclass
class RunResult:
    summary: dict[str, Any]
    metrics: dict[str, Any]
    order: list[np.ndarray]  # the row batches trained on
    store_report: dict[str, Any]
    phases: list[tuple[int, dict[str, float]]]
    counters: list[tuple[int, dict[str, int]]]
    model: nn.Module
    store: EmbeddingStore
    embedding: torch.Tensor  # every row's final weights, float32 [N, D] on the CPU (``store.final_rows()``)
    timed: TimedPart         # the timed steps' samples, for summaries over several repeats

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Every trained parameter, dense ones first, then the embedding rows."""
        named = [(n, p.detach()) for n, p in self.model.named_parameters()]
        return named + [("embedding.weight", self.embedding)]


def dense_optimizer(cfg: RunConfig, params) -> DenseOptimizer:
    t = cfg.train
    if t.dense_optimizer == "sgd":
        return DenseSGD(params, lr=t.dense_lr)
    return DenseAdagrad(params, lr=t.dense_lr, eps=t.adagrad_eps)


def store_spec(cfg: RunConfig, ds: Dataset, device: torch.device, world: World | None = None) -> StoreSpec:
    """What a run's store is built from: the dataset's tables, the run's options and optimizer, the device."""
    return StoreSpec(
        table_sizes=ds.cardinalities,
        dim=cfg.model.embedding_dim,
        optimizer=RowOptimizer(cfg.train.row_optimizer, cfg.train.lr, cfg.train.adagrad_eps),
        device=device,
        seed=cfg.seed,
        options=cfg.store,
        column_tables=ds.column_tables,
        comm=world.comm if world is not None else None,
        batch_share=cfg.train.batch_size / max(1, ds.split("train")[1] - ds.split("train")[0]),
        exact_sums=world is not None and world.data_parallel > 1,
        warmup_steps=cfg.train.warmup_steps,
    )


def build(cfg: RunConfig, ds: Dataset, device: torch.device, order: Sequence[np.ndarray] | None = None,
          world: World | None = None) -> tuple[nn.Module, EmbeddingStore, list[np.ndarray]]:
    """The model, the store (initialised identically for every method) and the batch order.

    ``order`` (row batches of the train split) replaces the store's own
    schedule, so a reference store can replay another store's batches.
    ``world``: the ranks the store spans (one process when None).
    """
    method = methods.get(cfg.method)
    torch.manual_seed(cfg.seed)
    model = build_model(ds, cfg.model).to(device)
    spec = store_spec(cfg, ds, device, world)
    cls = method.store
    if world is not None and world.size > 1 and not method.spans_ranks:
        raise ConfigError(f"method {cfg.method!r} runs in one process; over several ranks use "
                          f"{', '.join(methods.names(spans_ranks=True))}")
    check_memory(cfg, cls, spec, own_order=order is None, world=world)
    if cls.needs_frequencies:
        spec.frequencies = torch.from_numpy(row_counts(ds, "train"))
    rows = list(order if order is not None else cls.schedule(spec, ds, default_order(cfg, ds)))
    if len(rows) < cfg.train.steps:
        raise ConfigError(f"the batch order has {len(rows)} batches, fewer than steps={cfg.train.steps}")
    rows = rows[: cfg.train.steps]
    if cls.needs_batches:
        start = ds.split("train")[0]
        spec.batches = lambda: (torch.from_numpy(ds.batch_ids(r + start)) for r in rows)  # ids only
    return model, cls(spec), rows


def check_memory(cfg: RunConfig, cls: type[EmbeddingStore], spec: StoreSpec, own_order: bool = True,
                 world: World | None = None) -> None:
    """Fail with ``InfeasibleError`` before anything is allocated when the run's tables do not fit this machine.

    Checks the store's rows (``memory_need``) in one process, and the
    ``device`` reference that replays the run afterwards (a store with its own
    batch order, or a run over several ranks: ``reference``) wherever it runs.
    """
    many = world is not None and world.size > 1
    label = f"{cfg.dataset}/{cfg.method}/{cfg.variant}: {spec.num_rows} rows of dimension {spec.dim}"
    if not many:
        require_memory(cls.memory_need(spec), spec.device, f"{label} ({cls.__name__}, {cfg.train.row_optimizer})")
    replayed = many and cfg.distributed.reference == "replay"  # distributed.reference none: no replay to fit
    if (replayed or (own_order and cls.own_schedule())) and cls is not DeviceStore:
        require_memory(DeviceStore.memory_need(spec), spec.device,
                       f"{label} (its device reference replay, {cfg.train.row_optimizer})")


def default_order(cfg: RunConfig, ds: Dataset) -> Iterator[np.ndarray]:
    """The loader's batch order: row indices into the train split."""
    start, stop = ds.split("train")
    return batch_rows(stop - start, cfg.train.batch_size, cfg.train.steps, cfg.seed, cfg.train.shuffle)


#: threads reading the training batches ahead where the trainer is a GPU (or stands in for one), or the step
#: pipeline prepares steps ahead
READERS = 2


def train_loader(cfg: RunConfig, ds: Dataset, lookahead: int, rows: Iterable[np.ndarray] | None = None,
                 part: tuple[int, int] = (0, 1), readers: int = 0,
                 buffers: PackedBuffers | None = None) -> BatchLoader:
    """The training batches; ``part`` (rank, ranks): only that rank's contiguous slice of each is read."""
    t = cfg.train
    return BatchLoader(ds, "train", t.batch_size, t.steps, cfg.seed, t.shuffle, lookahead, rows, part, readers,
                       buffers)


class Trainer:
    """One run's training, a step at a time: the model, the store, the optimizers, the step pipeline, the timer.

    ``train`` is ``Trainer(...)``, ``step`` for every step, ``finish``; the
    step benchmark (``hotcold bench step``) drives the same steps. With a
    ``world`` of several ranks, this rank trains on its slice of every global
    batch (``order``: see ``build``).
    """

    def __init__(self, cfg: RunConfig, ds: Dataset, device: torch.device, order: Sequence[np.ndarray] | None = None,
                 world: World | None = None, progress: bool = True) -> None:
        self.cfg, self.ds, self.device = cfg, ds, device
        self.world = world = world or World.single()
        world.comm.use_wire(cfg.distributed.wire())  # what this run's collectives send (a launch may train many runs)
        world.check_batch(cfg.train.batch_size)
        check_batch_fits(cfg.train.batch_size, ds, batch_option(cfg.distributed))
        self.progress = progress and world.is_main
        check_graphs(cfg.train.cuda_graphs, device, world)  # before anything is built
        self.model, self.store, self.rows = build(cfg, ds, device, order, world)
        self.opt = dense_optimizer(cfg, self.model.parameters())
        self.dense = DenseStep(self.model, self.opt, nn.BCEWithLogitsLoss(), world, device, cfg.train.cuda_graphs,
                               capture_at=cfg.train.warmup_steps - 1)
        self.timer = PhaseTimer("cuda" if device.type == "cuda" else "cpu",
                                warmup=cfg.train.warmup_steps, window=cfg.timing.window)
        ahead, rt = pipeline_on(cfg, device), runtime(device)
        buffers = PackedBuffers(rt) if rt.offloaded else None  # the readers pack each batch for one copy
        loader = train_loader(cfg, ds, self.store.lookahead, rows=self.rows, part=(world.rank, world.size),
                              readers=READERS if ahead or rt.offloaded else 0, buffers=buffers)  # this rank's slice
        self.pipeline = StepPipeline(iter(loader), cfg.train.steps, self.store, device, ahead)
        self.guard = DivergenceGuard(cfg, world)
        self.counters: list[tuple[int, dict[str, int]]] = []

    def step(self, i: int) -> None:
        """Train step ``i`` (steps are trained in order, from 0)."""
        timer, store = self.timer, self.store
        timer.begin_step()
        step = self.pipeline.next()  # read, planned and copied while the previous step trained (or just now)
        timer.mark("data")
        store.prefetch(step.batch.upcoming)
        emb = store.forward(step.batch.ids, timer).detach().requires_grad_()  # [B, T, D]
        self.dense(i, step.dense, emb, step.valid, step.labels, lambda loss: self.guard.see(i, loss), timer,
                   store.begin_backward)
        timer.mark("dense_fwd_bwd")
        store.backward(emb.grad, timer)
        timer.end_step()
        self.counters.append((step.batch.step, store.step_counters()))
        self.guard.check(i)  # every timing.window steps (where the CUDA timer syncs) and the last

    def finish(self, evaluation: bool = True) -> RunResult:
        """After the last step: settle the counters, evaluate, and gather the run's result."""
        cfg, store, world, timer = self.cfg, self.store, self.world, self.timer
        timer.flush()
        store.settle_counters()  # device-side counts, read once the timed steps are over
        release_pages(self.ds)  # the training batches' mapped pages: not held under evaluation and the record
        counters = world.combine_counters(self.counters)
        metrics = evaluate(self.model, store, self.ds, cfg, self.device, self.progress) if evaluation else {}
        report = {**store.report(), "dense_step": self.dense.kind, "dense_step_note": self.dense.note}
        embedding = store.final_rows()
        self.guard.finish([*self.model.named_parameters(), ("embedding.weight", embedding)])
        warm, pipeline = cfg.train.warmup_steps, self.pipeline
        timed = TimedPart(timer.steps, [c for c in counters if c[0] >= warm], cfg.train.batch_size,
                          timer.kind, host_steps=timer.host_steps, cpu_ms=timer.cpu_ms,
                          threads=torch.get_num_threads(), judge_cpu=timer.kind == "cpu" and world.size == 1,
                          prepared_ms=pipeline.prepared_ms[warm:], waited_ms=pipeline.waited_ms[warm:],
                          pipelined=pipeline.ahead)
        summary = summarize_repeats([timed])
        summary.update(world=world.size, ranks_per_node=world.comm.topology.ranks_per_node, plan=report.get("plan"),
                       batch_size=cfg.train.batch_size, batch_per_rank=cfg.train.batch_size // world.data_parallel)
        return RunResult(summary, metrics, self.rows, report, timer.steps, counters, self.model, store, embedding,
                         timed)

    def close(self) -> None:
        """Release the store's and the pipeline's threads (the store first: a plan may be waiting on it)."""
        self.store.close()
        self.pipeline.close()


def train(cfg: RunConfig, ds: Dataset, device: torch.device, progress: bool = True,
          order: Sequence[np.ndarray] | None = None, world: World | None = None,
          evaluation: bool = True) -> RunResult:
    """Train for ``cfg.train.steps`` steps, then evaluate on the test split (``order``: see ``build``).

    With a ``world`` of several ranks, this rank trains on its slice of every
    global batch; the returned counters are summed over ranks, the phases are
    this rank's. ``evaluation`` False skips the evaluation (empty metrics): a
    repeat of a run whose first repeat was evaluated.
    """
    trainer = Trainer(cfg, ds, device, order, world, progress)
    try:
        for i in tqdm(range(cfg.train.steps), desc=f"train {cfg.method}/{cfg.variant}",
                      disable=not trainer.progress, mininterval=2.0):
            trainer.step(i)
        return trainer.finish(evaluation)
    finally:
        trainer.close()


def reference(cfg: RunConfig, ds: Dataset, device: torch.device, order: Sequence[np.ndarray],
              progress: bool = True) -> RunResult | None:
    """The ``device`` store in one process on the run's batch ``order``, for a store with its own order (FAE)
    or a run over several ranks (trained on the same global batches, each as the ranks' slices:
    ``World.replay``); None for the others, whose reference is the ``device`` run of the workflow, and for a run
    over several ranks with ``distributed.reference: none`` (its record says exactness was not checked)."""
    ref_cfg = _reference_config(cfg)
    if ref_cfg is None:
        return None
    world = cfg.distributed.world
    return train(ref_cfg, ds, device, progress=progress, order=order,
                 world=World.replay(world) if world > 1 else None)


def reference_key(cfg: RunConfig, order: Sequence[np.ndarray]) -> tuple[str, int, str] | None:
    """What ``reference`` trains, as a key (None where it trains nothing): its config without the run's
    variant name, the slices it replays and a digest of the batch order. Equal keys: the same replay."""
    ref_cfg = _reference_config(cfg)
    if ref_cfg is None:
        return None
    digest = hashlib.sha256()
    for batch in order:
        digest.update(np.ascontiguousarray(batch, dtype=np.int64).tobytes())
        digest.update(b"|")
    named = json.dumps(dataclasses.replace(ref_cfg, variant="").to_dict(), sort_keys=True)
    return named, cfg.distributed.world, digest.hexdigest()


def _reference_config(cfg: RunConfig) -> RunConfig | None:
    """The config ``reference`` trains: ``cfg`` on the ``device`` store in one process (None: no replay)."""
    world = cfg.distributed.world
    if not methods.get(cfg.method).store.own_schedule() and world == 1:
        return None
    if world > 1 and cfg.distributed.reference == "none":
        return None
    return dataclasses.replace(cfg, method="device", store=NoOptions(), distributed=type(cfg.distributed)())


@torch.no_grad()
def evaluate(model: nn.Module, store: EmbeddingStore, ds: Dataset, cfg: RunConfig,
             device: torch.device, progress: bool = True) -> dict[str, Any]:
    """AUC and log loss on the test split (or its first ``eval_samples`` rows)."""
    model.eval()
    scores, labels = [], []
    batches = eval_batches(ds, "test", cfg.train.eval_batch_size, cfg.train.eval_samples)
    for dense, ids, y in tqdm(batches, desc="evaluate", disable=not progress, mininterval=2.0):
        logits = model(dense.to(device), store.lookup(ids), (ids >= 0).to(device))
        scores.append(torch.sigmoid(logits).double().cpu().numpy())
        labels.append(y.numpy())
    model.train()
    p, y = np.concatenate(scores), np.concatenate(labels)
    return {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "eval_samples": int(y.size)}
