"""The dense part of a training step (forward, loss, backward, the dense optimizer), eager or as a CUDA graph.

On a GPU the dense step of a DLRM is a few hundred microseconds of kernels
that take milliseconds to launch one by one. With ``train.cuda_graphs`` the
step is captured once, after the warm-up, as a CUDA graph over static input
buffers, and each later step copies its inputs in and replays it: the same
kernels in the same order on the same values, so the same bits as eager
(what changes is only who launches them). The warm-up steps before the
capture run on the capture's side stream, as capture requires, and train as
any step does.

A graph needs a CUDA device, one process (over ranks the dense gradients
are all-reduced between backward and the optimizer) and the whole batch in
one piece; ``graph_obstacle`` says what is missing. ``auto`` falls back to
eager when one is missing or the capture fails, and says why
(``DenseStep.note``); ``on`` stops the run instead.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import nn

from hotcold.config import ConfigError
from hotcold.model.optim import DenseOptimizer

if TYPE_CHECKING:  # the ranks a step spans: only their methods are called here
    from hotcold.distributed.world import World


def graph_obstacle(device: torch.device, world: World) -> str | None:
    """Why the dense step cannot be a CUDA graph here, or None when it can."""
    if device.type != "cuda":
        return f"no CUDA device (the trainer is {device.type})"
    if world.size > 1 or world.slices > 1:
        return "over several ranks the dense gradients are all-reduced between backward and the optimizer step"
    return None


def check_graphs(mode: str, device: torch.device, world: World) -> str | None:
    """``graph_obstacle``, and a ``ConfigError`` naming it where ``train.cuda_graphs`` is on."""
    obstacle = graph_obstacle(device, world) if mode != "off" else "train.cuda_graphs is off"
    if mode == "on" and obstacle:
        raise ConfigError(f"train.cuda_graphs is on, but {obstacle} (use auto or off)")
    return obstacle


class CudaGraphs:
    """What ``DenseStep`` needs of CUDA: a side stream, running on it, capturing into a graph and replaying it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def on_side(self) -> Iterator[None]:
        """Run the block on the side stream, after what the current stream has queued; the current waits for it."""
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            yield
        current.wait_stream(self.side)

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """``fn`` captured into a graph on the side stream (not run); the graph and ``fn``'s static output.

        The capture is thread-local: the step pipeline's worker and ScratchPipe's movers go on pinning host
        memory, copying on their own streams and waiting for events while this thread captures (a global
        capture forbids those calls in every thread: the first GPU run failed there)."""
        graph = torch.cuda.CUDAGraph()
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.graph(graph, stream=self.side, capture_error_mode="thread_local"):
            out = fn()
        return graph, out

    def replay(self, graph: Any, out: torch.Tensor) -> torch.Tensor:
        graph.replay()
        return out


class DenseStep:
    """Runs the dense part of each training step; the embedding gradient lands in ``emb.grad``.

    ``mode``: ``train.cuda_graphs``. ``capture_at``: the step whose dense
    part is captured (then replayed from that step on): the last warm-up
    step, and at least the third (two eager steps on the side stream first).
    """

    def __init__(self, model: nn.Module, opt: DenseOptimizer, loss_fn: nn.Module, world: World,
                 device: torch.device, mode: str, capture_at: int) -> None:
        self.model, self.opt, self.loss_fn, self.world, self.device = model, opt, loss_fn, world, device
        obstacle = check_graphs(mode, device, world)
        self.graphed = False
        self.note = obstacle or "waiting for the warm-up"  # why eager, or how the graph went
        self.capture_at = max(2, capture_at) if obstacle is None else None
        self.mode = mode
        #: the CUDA calls of the capture (None: eager throughout)
        self.graphs = CudaGraphs(device) if self.capture_at is not None else None
        self._graph: Any = None
        self._static: tuple[torch.Tensor, ...] = ()
        self._loss: torch.Tensor | None = None
        # d loss / d loss: on a GPU given, not made by a kernel every step; on the CPU backward() makes it (a given
        # gradient has torch import its symbolic shapes and sympy: 0.4-0.9 s of CPU in every training process)
        self._one = torch.ones((), device=device) if device.type == "cuda" else None

    @property
    def kind(self) -> str:
        """``graph`` once the step replays a captured graph, else ``eager``."""
        return "graph" if self.graphed else "eager"

    def __call__(self, i: int, dense: torch.Tensor, emb: torch.Tensor, valid: torch.Tensor,
                 labels: torch.Tensor, see: Callable[[torch.Tensor], None], timer: Any,
                 begin_backward: Any) -> None:
        """Step ``i``'s dense forward, backward and optimizer step on its inputs, each loss handed to ``see``.

        ``emb`` [B, T, D] is a leaf that requires grad; its gradient is in ``emb.grad`` afterwards.
        """
        if self.capture_at is not None and i == self.capture_at:
            self._capture(dense, emb, valid, labels)
        if self.graphed:
            see(self._replay(dense, emb, valid, labels))
        elif self.graphs is None:
            self._eager(dense, emb, valid, labels, see, timer, begin_backward)
        else:
            with self.graphs.on_side():  # the warm-up steps on the capture's stream
                self._eager(dense, emb, valid, labels, see, timer, begin_backward)

    def _eager(self, dense, emb, valid, labels, see, timer, begin_backward) -> None:
        self.opt.zero_grad(set_to_none=True)
        for part in self.world.parts(labels.shape[0]):  # the whole batch, except in a data-parallel replay
            x = (dense, emb, valid, labels) if part is None else (dense[part], emb[part], valid[part], labels[part])
            loss = self.loss_fn(self.model(*x[:3]), x[3])
            loss.backward(self._one)
            see(loss)
            self.world.accumulate(self.model)
        self.world.sync_dense(self.model, emb, timer, begin_backward)
        self.opt.step()

    def _forward_backward_step(self) -> torch.Tensor:
        """What the graph holds; the gradients start as None (no kernel: they are the graph's own buffers)."""
        dense, emb, valid, labels = self._static
        self.opt.zero_grad(set_to_none=True)
        emb.grad = None
        loss = self.loss_fn(self.model(dense, emb, valid), labels)
        loss.backward(self._one)
        self.opt.step()
        return loss

    def _capture(self, dense, emb, valid, labels) -> None:
        """Capture the dense step over static copies of this step's inputs; on failure, eager (or stop: ``on``)."""
        static_emb = torch.empty_like(emb).requires_grad_()
        self._static = (torch.empty_like(dense), static_emb, torch.empty_like(valid), torch.empty_like(labels))
        self.opt.zero_grad(set_to_none=True)  # the graph makes the gradients, in its own memory
        try:
            self._graph, self._loss = self.graphs.capture(self._forward_backward_step)
        except Exception as e:  # noqa: BLE001 - whatever stops the capture, the step runs eagerly (or the run stops)
            why = f"capture failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            self.opt.zero_grad(set_to_none=True)
            self._static, self._loss, self.capture_at, self.graphs = (), None, None, None
            if self.mode == "on":
                raise RuntimeError(f"train.cuda_graphs is on, but the {why}") from e
            self.note = f"eager: {why}"
            return
        self.graphed, self.note = True, "graph"

    def _replay(self, dense, emb, valid, labels) -> torch.Tensor:
        s_dense, s_emb, s_valid, s_labels = self._static
        s_dense.copy_(dense)
        with torch.no_grad():
            s_emb.copy_(emb)
        s_valid.copy_(valid)
        s_labels.copy_(labels)
        loss = self.graphs.replay(self._graph, self._loss)
        emb.grad = s_emb.grad  # [B, T, D], rewritten by the next replay: the store reads it before that
        return loss.detach().clone()  # the static loss is rewritten too; the guard reads it later
