"""The sparse update every store applies: SGD, row-wise or per-element Adagrad on a batch's distinct rows.

``RowOptimizer.step`` is a batch's backward and update: the lookups'
gradients summed per row (``rows.sum_by_index``), then ``update_rows``. On
the CPU the two run as one compiled kernel (``fused``), on other devices as
the torch composition ``sparse_step``; both are the same float32 operations
in the same order, each rounded as IEEE 754 says, so a row updated on the
host has the bits it would have on a GPU.
"""
from __future__ import annotations

import torch

from hotcold.config import ELEMENTWISE, ROW_OPTIMIZERS, ConfigError, row_state_width
from hotcold.embedding import fused
from hotcold.embedding.rows import RowGroups, bag_sums, sum_by_index


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


def correct_sqrt(x: torch.Tensor) -> torch.Tensor:
    """The square root of float32 ``x`` rounded correctly (IEEE 754), on every device.

    CUDA's ``sqrt`` is; torch's vectorised CPU ``sqrt`` is not (on an AVX-512
    build, 0.7% of random inputs come out one unit in the last place off). The
    float64 root rounded to float32 is the correctly rounded float32 root (a
    double has more than twice a float's precision, so rounding twice is safe).
    """
    if x.device.type == "cuda" or x.dtype != torch.float32:
        return x.sqrt()
    return x.double().sqrt_().to(torch.float32)


def update_rows(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
                lr: float, eps: float, adagrad: bool, sq_mean: torch.Tensor | None = None,
                by_add: bool | None = None, elementwise: bool = False) -> None:
    """One SGD, row-wise or per-element Adagrad step on the rows ``slots``, in place.

    weight [N, D] float32; state [N] (per element: [N, D]); slots: unique
    int64 [U]; grad [U, D], each row's summed gradient. Row-wise Adagrad:
    ``acc += mean(g^2)`` per row, ``w -= lr * (g / (sqrt(acc) + eps))``;
    per-element (``elementwise``): ``acc += g^2`` per element, the same
    division element by element (FBGEMM's ``EXACT_ADAGRAD``, ``torch.optim.Adagrad``'s
    arithmetic); SGD: ``w -= lr * g``. ``sq_mean``
    [U]: each row's mean squared gradient over all its columns, for a store
    that holds only some of a row's columns (column-wise sharding); without it
    ``row_square_means``, whose order is fixed, so a row updated on the host
    gets the same bits as on the GPU. A float64
    ``grad`` (an exact sum) is rounded to the weights' float32 after its
    squares are taken.

    ``by_add`` (default: on a device other than the CPU) adds each row's change in place
    (``index_add_``: the rows are unique, so each element gets one add, the
    same bits as ``w - lr * g``; fewer kernels); otherwise gather, update,
    scatter, which on CPUs is several times faster than ``index_add_`` into
    a large table.
    """
    by_add = weight.device.type != "cpu" if by_add is None else by_add
    if adagrad:
        if elementwise:  # [U, D]: each element's square; a column shard holds its columns' state whole
            sq = (grad * grad).to(state.dtype)
        else:            # [U]
            sq = (row_square_means(grad) if sq_mean is None else sq_mean).to(state.dtype)
        if by_add:
            acc = state.index_add_(0, slots, sq).index_select(0, slots)
        else:
            acc = state.index_select(0, slots) + sq
            state.index_copy_(0, slots, acc)
        denom = correct_sqrt(acc) + eps
        grad = grad / (denom if elementwise else denom.unsqueeze(1))
    if by_add:  # w + (-(lr g)) is w - lr g: IEEE rounds a sum and a difference of the same values alike
        weight.index_add_(0, slots, grad.to(weight.dtype) * -lr)
    else:
        weight.index_copy_(0, slots, weight.index_select(0, slots) - lr * grad.to(weight.dtype))


def sparse_step(weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, order: torch.Tensor,
                starts: torch.Tensor, grads: torch.Tensor, lr: float, eps: float, adagrad: bool,
                elementwise: bool = False) -> None:
    """The backward and update of the rows a batch looked up, from torch operations.

    grads [L, D]: the lookups' gradients; ``order`` [L] and ``starts`` [U]
    group them by distinct row (``RowGroups``); slots [U]: where those rows
    live in ``weight``/``state``. Sums each row's gradients (``bag_sums``),
    then ``update_rows``: the arithmetic ``fused.fused_step`` does in one kernel.
    """
    update_rows(weight, state, slots, bag_sums(order, starts, grads), lr, eps, adagrad, elementwise=elementwise)


class RowOptimizer:
    """SGD, row-wise or per-element Adagrad applied to a set of unique rows.

    Row-wise Adagrad keeps one float per row (the running sum of the mean
    squared gradient of the row), so its state is a [N] tensor that moves with
    the rows wherever a store puts them; per-element Adagrad keeps a float per
    weight, a [N, D] state that moves the same way (every store indexes the
    state by row only). ``fused``: run ``step`` as one kernel where it can
    (``fused.available``: float32 on the CPU, numba installed); False always
    runs the torch composition. Both give the same bits.
    """

    def __init__(self, kind: str, lr: float, eps: float = 1e-8, fused: bool = True) -> None:
        if kind not in ROW_OPTIMIZERS:
            raise ConfigError(f"row optimizer must be one of {ROW_OPTIMIZERS}, got {kind!r}")
        self.kind, self.lr, self.eps = kind, lr, eps
        self.fused = bool(fused)

    @property
    def adagrad(self) -> bool:
        """Row-wise or per-element Adagrad: a state that moves with its rows."""
        return self.kind != "sgd"

    @property
    def elementwise(self) -> bool:
        """Per-element Adagrad: the state [N, D], a float for each weight."""
        return self.kind == ELEMENTWISE

    def state_width(self, dim: int) -> int:
        """Floats of optimizer state a row of ``dim`` weights keeps (0, 1 or ``dim``)."""
        return row_state_width(self.kind, dim)

    def init_state(self, num_rows: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The optimizer state of ``num_rows`` rows of ``dim`` weights: float32 zeros, [N] or per element [N, D].

        SGD keeps none: its [N] is one zero seen N times (a stride-0 view, 4
        bytes), which reads as zeros wherever a store gathers it and is never
        written (``update_rows`` touches the state only for Adagrad, and the
        stores move it only when ``adagrad``).
        """
        if not self.adagrad:
            return torch.zeros(1, dtype=torch.float32, device=device).expand(num_rows)
        shape = (num_rows, dim) if self.elementwise else (num_rows,)
        return torch.zeros(shape, dtype=torch.float32, device=device)

    def runs_fused(self, weight: torch.Tensor, grads: torch.Tensor, exact: bool = False) -> bool:
        """Whether ``step`` on these tensors runs as one kernel."""
        return self.fused and not exact and fused.available(weight, grads)

    def step(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, groups: RowGroups,
             grads: torch.Tensor, exact: bool = False) -> None:
        """A batch's backward and update: its lookups' gradients summed per row, then ``apply``.

        grads [L, D]: the gradient of each lookup; ``groups`` plans their sum
        (``sum_by_index``, float64 with ``exact``); slots [U]: where the
        distinct rows ``groups.rows`` live in ``weight`` and ``state``.
        """
        if self.runs_fused(weight, grads, exact):
            if grads.shape[0] != groups.order.numel():
                raise ValueError(f"step: {grads.shape[0]} gradients for {groups.order.numel()} lookups")
            fused.fused_step(weight, state, slots, groups.order, groups.offsets, grads, self.lr, self.eps,
                             self.adagrad, torch.get_num_threads(), elementwise=self.elementwise)
            return
        self.apply(weight, state, slots, sum_by_index(groups, grads, exact))

    def apply(self, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, grad: torch.Tensor,
              sq_mean: torch.Tensor | None = None) -> None:
        """Update ``weight[slots]`` (and ``state[slots]``) in place: ``update_rows`` with this optimizer.

        weight: [N, D]; state: [N] or [N, D]; slots: unique int64 [U]; grad: [U, D];
        ``sq_mean`` [U] as ``update_rows`` says (row-wise only).
        """
        update_rows(weight, state, slots, grad, self.lr, self.eps, self.adagrad, sq_mean,
                    elementwise=self.elementwise)
