"""The sparse update every store applies: SGD or row-wise Adagrad on a batch's distinct rows.

``RowOptimizer.step`` is a batch's backward and update: the lookups'
gradients summed per row (``rows.sum_by_index``), then ``update_rows``.
On the CPU the two can run fused through ``torch.compile``
(``HOTCOLD_COMPILE=1``); the arithmetic is the same either way.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch

from hotcold.config import ConfigError, row_state_width
from hotcold.embedding.rows import RowGroups, bag_sums, sum_by_index


#: environment switch of the compiled sparse step: "1" compiles it (where ``torch.compile`` works), else plain
COMPILE_ENV = "HOTCOLD_COMPILE"


def row_square_sums(grad: torch.Tensor) -> torch.Tensor:
    """[U]: each row of ``grad`` [U, D] squared and summed, in one fixed order on every device.

    A pairwise tree of elementwise adds: the left half of the columns plus the
    right half, halving until one column is left (an odd width's last column
    is added into the first column of that level's sums). Elementwise adds and
    multiplies round the same on a CPU and a GPU, where a library reduction
    (``sum``, ``mean``) adds in an order of its own per processor.
    """
    sq = grad * grad
    width = sq.shape[1]
    if width == 0:
        return sq.new_zeros(sq.shape[0])
    while width > 1:
        half = width // 2
        pairs = sq[:, :half] + sq[:, half:2 * half]
        if width % 2:
            pairs[:, 0] += sq[:, 2 * half]
        sq, width = pairs, half
    return sq[:, 0]


def row_square_means(grad: torch.Tensor) -> torch.Tensor:
    """[U]: each row's mean squared gradient: ``row_square_sums`` times the reciprocal of the width.

    A product, not a division by the width: CUDA divides a tensor by a scalar
    as a product with its reciprocal while the CPU divides, which differ in the
    last bit unless the width is a power of two.
    """
    return row_square_sums(grad) * (1.0 / max(grad.shape[1], 1))


def update_rows(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
                lr: float, eps: float, adagrad: bool, sq_mean: torch.Tensor | None = None) -> None:
    """One SGD or row-wise Adagrad step on the rows ``slots``, in place.

    weight [N, D] float32; state [N]; slots: unique int64 [U]; grad [U, D],
    each row's summed gradient. Adagrad: ``acc += mean(g^2)`` per row,
    ``w -= lr * g / (sqrt(acc) + eps)``; SGD: ``w -= lr * g``. ``sq_mean``
    [U]: each row's mean squared gradient over all its columns, for a store
    that holds only some of a row's columns (column-wise sharding); without it
    ``row_square_means``, whose order is fixed, so a row updated on the host
    gets the same bits as on the GPU. A float64
    ``grad`` (an exact sum) is rounded to the weights' float32 after its
    squares are taken. Gather, update, scatter: the rows are unique, and on
    CPUs this is several times faster than ``index_add_`` into a large table.
    """
    if adagrad:
        sq_mean = row_square_means(grad) if sq_mean is None else sq_mean
        acc = state.index_select(0, slots) + sq_mean.to(state.dtype)  # [U]
        state.index_copy_(0, slots, acc)
        grad = grad / (acc.sqrt() + eps).unsqueeze(1)
    weight.index_copy_(0, slots, weight.index_select(0, slots) - lr * grad.to(weight.dtype))


def sparse_step(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, order: torch.Tensor,
                starts: torch.Tensor, grads: torch.Tensor, lr: float, eps: float, adagrad: bool) -> None:
    """The backward and update of the rows a batch looked up, fused: the function ``torch.compile`` takes.

    grads [L, D]: the lookups' gradients; ``order`` [L] and ``starts`` [U]
    group them by distinct row (``RowGroups``); slots [U]: where those rows
    live in ``weight``/``state``. Sums each row's gradients (``bag_sums``),
    then ``update_rows``. Run plainly it is exactly those two calls.
    """
    update_rows(weight, state, slots, bag_sums(order, starts, grads), lr, eps, adagrad)


class _CompiledStep:
    """``sparse_step`` through ``torch.compile(dynamic=True)``, made on first use; plain where that fails.

    One graph per optimizer kind; the number of lookups and rows varies
    without recompiling. Compiling takes seconds at the first call (a
    training run's warm-up steps absorb it). A failure (no C++ compiler, an
    old torch) is said once, then every call runs ``sparse_step`` plainly.
    """

    def __init__(self) -> None:
        self.fn: Callable[..., None] | None = None
        self.failed: str | None = None

    def __call__(self, *args: Any) -> None:
        if self.failed is None:
            try:
                if self.fn is None:
                    self.fn = torch.compile(sparse_step, dynamic=True)
                self.fn(*args)
                return
            except Exception as e:  # noqa: BLE001 - any compiler failure means: run it plainly
                self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                warnings.warn(f"torch.compile of the sparse step failed, running it plainly: {self.failed}",
                              RuntimeWarning, stacklevel=2)
        sparse_step(*args)


_COMPILED = _CompiledStep()


def compile_requested() -> bool:
    """Whether ``HOTCOLD_COMPILE`` asks for the compiled sparse step."""
    return os.environ.get(COMPILE_ENV, "0").strip() == "1"


class RowOptimizer:
    """SGD or row-wise Adagrad applied to a set of unique rows.

    Row-wise Adagrad keeps one float per row (the running sum of the mean
    squared gradient of the row), so its state is a [N] tensor that moves with
    the rows wherever a store puts them. ``compile``: run ``step`` on the CPU
    through ``torch.compile`` (None: as ``HOTCOLD_COMPILE`` says; exact
    float64 sums and every other device run plainly).
    """

    def __init__(self, kind: str, lr: float, eps: float = 1e-8, compile: bool | None = None) -> None:
        if kind not in ("sgd", "adagrad"):
            raise ConfigError(f"row optimizer must be 'sgd' or 'adagrad', got {kind!r}")
        self.kind, self.lr, self.eps = kind, lr, eps
        self.compile = compile_requested() if compile is None else bool(compile)

    @property
    def state_width(self) -> int:
        """Floats of optimizer state per row."""
        return row_state_width(self.kind)

    @property
    def compiled(self) -> bool:
        """Whether ``step`` runs compiled on the CPU (requested, and the compiler has not failed)."""
        return self.compile and _COMPILED.failed is None

    def init_state(self, num_rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The optimizer state of ``num_rows`` rows: float32 [N] zeros.

        SGD keeps none: its [N] is one zero seen N times (a stride-0 view, 4
        bytes), which reads as zeros wherever a store gathers it and is never
        written (``update_rows`` touches the state only for Adagrad, and the
        stores move it only when ``state_width`` is 1).
        """
        if not self.state_width:
            return torch.zeros(1, dtype=torch.float32, device=device).expand(num_rows)
        return torch.zeros(num_rows, dtype=torch.float32, device=device)

    def step(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, groups: RowGroups,
             grads: torch.Tensor, exact: bool = False) -> None:
        """A batch's backward and update: its lookups' gradients summed per row, then ``apply``.

        grads [L, D]: the gradient of each lookup; ``groups`` plans their sum
        (``sum_by_index``, float64 with ``exact``); slots [U]: where the
        distinct rows ``groups.rows`` live in ``weight`` and ``state``.
        """
        if (self.compile and not exact and grads.device.type == "cpu" and weight.device.type == "cpu"
                and grads.dtype == weight.dtype == torch.float32 and groups.size > 1):
            # (below two rows a dynamic graph would specialise and recompile; they cost nothing plainly)
            _COMPILED(weight, state, slots, groups.order, groups.offsets[:-1], grads.contiguous(), self.lr, self.eps,
                      self.kind == "adagrad")
            return
        self.apply(weight, state, slots, sum_by_index(groups, grads, exact))

    def apply(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
              sq_mean: torch.Tensor | None = None) -> None:
        """Update ``weight[slots]`` (and ``state[slots]``) in place: ``update_rows`` with this optimizer.

        weight: [N, D]; state: [N]; slots: unique int64 [U]; grad: [U, D];
        ``sq_mean`` [U] as ``update_rows`` says.
        """
        update_rows(weight, state, slots, grad, self.lr, self.eps, self.kind == "adagrad", sq_mean)
