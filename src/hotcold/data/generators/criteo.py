"""Criteo-style click logs: the ``criteo-kaggle-style`` and ``criteo-terabyte-style`` kinds.

Both reproduce the 26 table sizes of their dataset (optionally capped), 13
heavy-tailed dense counts, power-law row popularity with popular ids
scattered over the table, a slowly drifting hot set, and labels drawn from a
planted logistic model so that a trained DLRM has a known ceiling (the Bayes
AUC, recorded in the manifest). Terabyte differs only in its table sizes,
planted tables and default holdout (its last day of 24, halved into val and
test).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hotcold.data.format import write_dataset
from hotcold.data.generators.config import GeneratorConfig, split_ranges
from hotcold.data.generators.drift import HOT_FRACTION, drift
from hotcold.data.powerlaw import draw_ranks, powerlaw_cdf
from hotcold.data.skew import coverage_stats
from hotcold.metrics import roc_auc

NUM_DENSE = 13

# Default popularity exponent of the Criteo kinds (``config.DEFAULT_EXPONENTS``),
# calibrated with ``coverage_stats`` on the default Kaggle config (500k rows,
# tables capped at 100k rows, drift 0.05 over 20 segments, seed 0). Measured on
# the eight capped big tables (93k-100k rows), min-max:
#   exponent  top 0.1%     top 1%       top 10%      max/median
#   1.20      0.66-0.67    0.82-0.83    0.94         4.9e4-9.8e4
#   1.25      0.71-0.73    0.86-0.87    0.96         5.7e4-1.1e5
#   1.30      0.76-0.78    0.90         0.97         6.5e4-1.3e5
#   1.35      0.81-0.82    0.92-0.93    0.98         7.3e4-1.5e5
# (the median accessed row is read once; with drift 0, exponent 1.3 gives top 1%
# 0.92 and max/median 1.3e5 on every table). 1.3 matches the ~90% of lookups
# on the top 1% of rows that FAE and Bagpipe report for Criteo.

CHUNK_ROWS = 1 << 18

# Dense counts: per feature, count = floor(exp(mu + sigma * z)) (0 with
# probability p_zero), z standard normal with a shared factor of weight
# DENSE_RHO so features correlate, as Criteo's count features do.
DENSE_MU = np.array([0.5, 2.0, 1.0, 1.5, 6.0, 3.0, 1.5, 2.0, 3.5, 0.2, 1.0, 0.1, 1.5])
DENSE_SIGMA = np.array([1.2, 1.5, 1.0, 1.0, 2.0, 1.8, 1.4, 1.0, 1.3, 0.8, 1.0, 0.8, 1.2])
DENSE_P_ZERO = np.array([0.45, 0.05, 0.2, 0.2, 0.02, 0.2, 0.3, 0.05, 0.05, 0.45, 0.3, 0.75, 0.2])
DENSE_RHO = 0.3

# Planted label model: logit = bias + dense @ w + sum_t effect_t[id_t] over a
# few small/medium tables that a small DLRM learns within a few hundred steps:
# Kaggle C2, C5, C8, C25 (583, 305, 633 and 105 rows), Terabyte C8, C16, C18,
# C25 (1442, 122, 970 and 101 rows). The scales were calibrated on Kaggle,
# 200k rows, seeds 0-3: dense-part std 0.7-0.9, categorical-part std 1.1-1.2,
# Bayes AUC 0.80-0.81 at a 25% click rate.
PLANTED_TABLES = {"criteo-kaggle-style": (1, 4, 7, 24), "criteo-terabyte-style": (7, 15, 17, 24)}
DENSE_LOGIT_SCALE = 0.8   # L2 norm of w * sigma, i.e. rough std of the dense logit part
EFFECT_STD = 0.6          # std of the per-id effects of each planted table
TARGET_CTR = 0.25


def _dense_chunk(m: int, rngs: tuple[np.random.Generator, ...]) -> np.ndarray:
    """Heavy-tailed counts for ``m`` samples, returned as log(1 + count), float32 [m, 13]."""
    r_factor, r_noise, r_zero = rngs
    z = math.sqrt(DENSE_RHO) * r_factor.standard_normal(m)[:, None] \
        + math.sqrt(1 - DENSE_RHO) * r_noise.standard_normal((m, NUM_DENSE))
    counts = np.floor(np.exp(DENSE_MU + DENSE_SIGMA * z))
    counts[r_zero.random((m, NUM_DENSE)) < DENSE_P_ZERO] = 0.0
    return np.log1p(counts).astype(np.float32)


def _solve_bias(logit: np.ndarray, target: float) -> float:
    """Bias b with mean(sigmoid(logit + b)) = target, by bisection on at most ~1M logits."""
    sub = logit[:: max(1, logit.size // (1 << 20))]
    lo, hi = -40.0, 40.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1 / (1 + np.exp(-(sub + mid)))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def generate_criteo(cfg: GeneratorConfig, out: Path, progress: bool = True,
                    chunk_rows: int = CHUNK_ROWS) -> dict[str, Any]:
    """Write a Criteo-style dataset for ``cfg`` (either Criteo kind) to ``out``; return its manifest.

    ``chunk_rows`` bounds the samples drawn per step; it does not change the output.

    Samples are produced in chunks, table by table, with one random stream per
    table (ranks drawn by ``data.powerlaw``), so the output is byte-identical for
    a given config and independent of the chunk size.
    """
    n_rows, cards = cfg.rows, cfg.cardinalities
    n_tables = len(cards)
    streams = np.random.SeedSequence(cfg.seed).spawn(n_tables + 5)
    table_rngs = [np.random.default_rng(s) for s in streams[:n_tables]]
    dense_rngs = tuple(np.random.default_rng(s) for s in streams[n_tables:n_tables + 3])
    model_rng = np.random.default_rng(streams[n_tables + 3])
    label_rng = np.random.default_rng(streams[n_tables + 4])

    # Unnormalised power-law CDF over ranks, shared by all tables: table t samples
    # rank r with P ∝ (r+1)^-exponent by inverting cdf[:n_t].
    cdf = powerlaw_cdf(max(cards), cfg.exponent)
    perms = [rng.permutation(n).astype(np.int32) for rng, n in zip(table_rngs, cards)]  # rank -> id
    hots = [max(1, math.ceil(HOT_FRACTION * n)) for n in cards]

    planted = [t for t in PLANTED_TABLES[cfg.kind] if t < n_tables]
    a = model_rng.standard_normal(NUM_DENSE)
    w_dense = a / np.linalg.norm(a) * DENSE_LOGIT_SCALE / DENSE_SIGMA  # [13]
    effects = {t: model_rng.normal(0.0, EFFECT_STD, cards[t]) for t in planted}  # per-id effects

    dense = np.empty((n_rows, NUM_DENSE), dtype=np.float32)
    sparse = np.empty((n_rows, n_tables), dtype=np.int32)
    dense_logit = np.empty(n_rows, dtype=np.float64)
    bounds = [k * n_rows // cfg.drift_segments for k in range(cfg.drift_segments + 1)]
    with tqdm(total=n_rows, unit="rows", desc=f"generate {cfg.name}", disable=not progress) as bar:
        for seg in range(cfg.drift_segments):
            if seg > 0 and cfg.drift > 0:
                for t in range(n_tables):
                    drift(perms[t], hots[t], cfg.drift, table_rngs[t])
            for lo in range(bounds[seg], bounds[seg + 1], chunk_rows):
                hi = min(lo + chunk_rows, bounds[seg + 1])
                for t, n in enumerate(cards):
                    sparse[lo:hi, t] = perms[t][draw_ranks(table_rngs[t], hi - lo, cdf, n)]
                dense[lo:hi] = _dense_chunk(hi - lo, dense_rngs)
                dense_logit[lo:hi] = dense[lo:hi].astype(np.float64) @ w_dense
                bar.update(hi - lo)

    cat_logit = np.zeros(n_rows, dtype=np.float64)
    for t in planted:
        cat_logit += effects[t][sparse[:, t]]
    logit = dense_logit + cat_logit
    bias = _solve_bias(logit, TARGET_CTR)
    prob = 1 / (1 + np.exp(-(logit + bias)))
    labels = (label_rng.random(n_rows) < prob).astype(np.float32)

    splits = split_ranges(n_rows, cfg.holdout_fraction)
    test = slice(*splits["test"])
    planted_model = {
        "form": "label ~ Bernoulli(sigmoid(bias + dense @ dense_weights + sum_t effect_t[id_t]))",
        "categorical_tables": planted,
        "categorical_cardinalities": [cards[t] for t in planted],
        "effect_std": EFFECT_STD,
        "dense_weights": [round(float(v), 6) for v in w_dense],
        "bias": bias,
        "target_ctr": TARGET_CTR,
        "ctr": float(labels.mean()),
        "dense_logit_std": float(dense_logit.std()),
        "categorical_logit_std": float(cat_logit.std()),
        "logit_std": float(logit.std()),
        "bayes_auc": roc_auc(labels, prob),
        "bayes_auc_test": roc_auc(labels[test], prob[test]),
    }
    generator = {**cfg.to_dict(), "full_cardinalities": cfg.full_cardinalities,
                 "hot_fraction": HOT_FRACTION}
    meta = {
        "name": cfg.name,
        "kind": cfg.kind,
        "generator": generator,
        "planted_model": planted_model,
        "skew": coverage_stats(sparse, cards),
    }
    return write_dataset(out, dense=dense, sparse=sparse, labels=labels, cardinalities=cards,
                         splits=splits, meta=meta)
