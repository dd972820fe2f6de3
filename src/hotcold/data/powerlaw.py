"""Power-law draws: rank r (0-based) with probability proportional to (r + 1)^-exponent, by an inverted CDF.

Written once for everything that draws skewed ids: the Criteo-style and
Taobao-style generators, and the ids of ``hotcold bench`` and ``hotcold
calibrate``, so that an exponent means the same skew everywhere. Generated
datasets depend on the exact random stream: each draw is one
``rng.random(size)`` call followed by a right-sided ``searchsorted``, the
order and arithmetic the generators have always used, so their output stays
byte-identical.
"""
from __future__ import annotations

import numpy as np


def powerlaw_weights(n: int, exponent: float) -> np.ndarray:
    """Unnormalised weights float64 [n] of ranks 0..n-1: ``(r + 1) ** -exponent``."""
    return np.arange(1, n + 1, dtype=np.float64) ** -exponent


def powerlaw_cdf(n: int, exponent: float) -> np.ndarray:
    """Unnormalised cumulative weights float64 [n] of ranks 0..n-1.

    A prefix ``cdf[:m]`` is the CDF of the first m ranks (``np.cumsum`` adds
    in order), so one CDF over the largest table serves every smaller one.
    """
    return np.cumsum(powerlaw_weights(n, exponent))


def invert_cdf(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Indices int64 (``u``'s shape) into the unnormalised CDF ``cum`` [n] for uniforms ``u`` in [0, 1)."""
    return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), cum.size - 1)


def draw_ranks(rng: np.random.Generator, size: int | tuple[int, ...], cdf: np.ndarray,
               n: int | None = None) -> np.ndarray:
    """Ranks int64 [size] in [0, n) drawn by the first ``n`` entries of ``cdf`` (default: all of it).

    Consumes exactly one ``rng.random(size)``.
    """
    n = cdf.size if n is None else n
    return invert_cdf(cdf[:n], rng.random(size))
