"""Criteo-style click logs: the ``criteo-kaggle-style``, ``criteo-terabyte-style`` and ``criteo-multihot-style``
kinds.

Each reproduces the 26 table sizes of its dataset (optionally capped), 13
heavy-tailed dense counts, power-law row popularity with popular ids
scattered over the table, a slowly drifting hot set, and labels drawn from a
planted logistic model so that a trained DLRM has a known ceiling (the Bayes
AUC, recorded in the manifest). Terabyte differs only in its table sizes,
planted tables and default holdout (its last day of 24, halved into val and
test). The multi-hot kind is Terabyte's on MLPerf's tables, each sample's
first id of a table drawn as Terabyte's and filled out to MLPerf's bag
(``generators.bags``); the planted model reads the first ids.

Two models of the ids: capped tables (``max_rows_per_table`` set, the default
workflow's datasets) draw every sample's ids independently from the power law
(below); at the real table sizes the ids are a prefix of a full dataset in
which every row occurs (``generators.occurrences``, ``docs/datasets.md``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hotcold.data.columns import release_pages
from hotcold.data.format import DatasetWriter
from hotcold.data.generators.bags import bag_ids
from hotcold.data.generators.config import GeneratorConfig, split_ranges
from hotcold.data.generators.drift import HOT_FRACTION, drift
from hotcold.data.generators.occurrences import DRIFT_MIN_PER_SEGMENT, TableOccurrences, expected_touched
from hotcold.data.powerlaw import draw_ranks, powerlaw_cdf
from hotcold.data.skew import add_counts, coverage_from_counts, tail_stats
from hotcold.metrics import roc_auc

NUM_DENSE = 13

# Default popularity exponent of the capped Criteo kinds (``config.DEFAULT_EXPONENTS``),
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
# The manifest's label statistics (CTR, logit stds, Bayes AUC) use every sample up to
# STATS_SAMPLES samples, beyond that every k-th one (k = ceil(rows / STATS_SAMPLES)), so
# memory stays bounded; the bias is solved on every (rows // BIAS_SAMPLES)-th logit.
STATS_SAMPLES = 1 << 22
BIAS_SAMPLES = 1 << 20
RELEASE_ROWS = 1 << 20   # samples between releases of the columns' mapped pages (``format.release_pages``)

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
PLANTED_TABLES = {"criteo-kaggle-style": (1, 4, 7, 24), "criteo-terabyte-style": (7, 15, 17, 24),
                  "criteo-multihot-style": (7, 15, 17, 24)}   # MLPerf's 1543, 155, 976 and 108 rows
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


def _solve_bias(sub: np.ndarray, target: float) -> float:
    """Bias b with mean(sigmoid(sub + b)) = target, by bisection on the logits ``sub``."""
    lo, hi = -40.0, 40.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1 / (1 + np.exp(-(sub + mid)))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _every(lo: int, hi: int, stride: int) -> np.ndarray:
    """Offsets within ``[lo, hi)`` of the samples whose index is a multiple of ``stride``."""
    return np.arange(-(-lo // stride) * stride, hi, stride) - lo


class _CappedIds:
    """Ids of the capped model: every sample draws each table's rank from the power law, independently."""

    def __init__(self, cfg: GeneratorConfig, cards: list[int], rngs: list[np.random.Generator]) -> None:
        self.cdf = powerlaw_cdf(max(cards), cfg.exponent)   # unnormalised; table t inverts cdf[:n_t]
        self.perms = [rng.permutation(n).astype(np.int32) for rng, n in zip(rngs, cards)]  # rank -> id
        self.hots = [max(1, math.ceil(HOT_FRACTION * n)) for n in cards]
        self.cfg, self.cards, self.rngs = cfg, cards, rngs
        n_rows, segs = cfg.rows, cfg.drift_segments
        self.boundaries = [k * n_rows // segs for k in range(segs + 1)]  # drift segments of this dataset
        self.segment = 0

    def ids(self, t: int, lo: int, hi: int) -> np.ndarray:
        return self.perms[t][draw_ranks(self.rngs[t], hi - lo, self.cdf, self.cards[t])]

    def enter(self, seg: int) -> None:
        while self.segment < seg:
            self.segment += 1
            if self.cfg.drift > 0:
                for t in range(len(self.cards)):
                    drift(self.perms[t], self.hots[t], self.cfg.drift, self.rngs[t])


class _FullSizeIds:
    """Ids of the full-size model (``generators.occurrences``): a prefix of the full dataset's occurrences."""

    def __init__(self, cfg: GeneratorConfig, cards: list[int], rngs: list[np.random.Generator]) -> None:
        full = cfg.full_samples
        self.tables = [TableOccurrences(n, full, cfg.exponent, cfg.drift, cfg.drift_segments, rng)
                       for n, rng in zip(cards, rngs)]
        self.boundaries = [min(cfg.rows, b) for b in self.tables[0].boundaries]

    def ids(self, t: int, lo: int, hi: int) -> np.ndarray:
        return self.tables[t].ids(lo, hi)

    def enter(self, seg: int) -> None:   # each table drifts as its ids enter a segment
        pass


def _chunks(boundaries: list[int], chunk_rows: int) -> list[tuple[int, int, int]]:
    """(segment, lo, hi) steps of at most ``chunk_rows`` samples, none straddling a segment boundary."""
    return [(seg, lo, min(lo + chunk_rows, boundaries[seg + 1]))
            for seg in range(len(boundaries) - 1)
            for lo in range(boundaries[seg], boundaries[seg + 1], chunk_rows)]


def generate_criteo(cfg: GeneratorConfig, out: Path, progress: bool = True,
                    chunk_rows: int = CHUNK_ROWS) -> dict[str, Any]:
    """Write a Criteo-style dataset for ``cfg`` (either Criteo kind) to ``out``; return its manifest.

    ``chunk_rows`` bounds the samples drawn per step; it does not change the output.

    Samples are produced in chunks straight into the memory-mapped columns of a
    ``DatasetWriter``, table by table, with one random stream per table, so the
    output is byte-identical for a given config and independent of the chunk
    size, and memory does not grow with ``rows``. Capped tables
    (``max_rows_per_table`` set) draw ranks from the power law (``data.powerlaw``);
    real-size tables follow the full-size model (``generators.occurrences``).
    A first pass writes ids and dense features and keeps a sample of the
    logits to solve the bias; a second draws the labels.
    """
    n_rows, cards, bags = cfg.rows, cfg.cardinalities, cfg.bags
    n_tables = len(cards)
    firsts = np.cumsum([0] + (bags or [1] * n_tables))[:-1]   # each table's first column of ``sparse``
    streams = np.random.SeedSequence(cfg.seed).spawn(n_tables + 5)
    table_rngs = [np.random.default_rng(s) for s in streams[:n_tables]]
    dense_rngs = tuple(np.random.default_rng(s) for s in streams[n_tables:n_tables + 3])
    model_rng = np.random.default_rng(streams[n_tables + 3])
    label_rng = np.random.default_rng(streams[n_tables + 4])
    model = (_FullSizeIds if cfg.full_size else _CappedIds)(cfg, cards, table_rngs)

    planted = [t for t in PLANTED_TABLES[cfg.kind] if t < n_tables]
    a = model_rng.standard_normal(NUM_DENSE)
    w_dense = a / np.linalg.norm(a) * DENSE_LOGIT_SCALE / DENSE_SIGMA  # [13]
    effects = {t: model_rng.normal(0.0, EFFECT_STD, cards[t]) for t in planted}  # per-id effects

    def logits(dense: np.ndarray, sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense and categorical parts of the planted logit of a chunk: float64 [m] each."""
        cat = np.zeros(len(dense), dtype=np.float64)
        for t in planted:
            cat += effects[t][sparse[:, t]]
        return dense.astype(np.float64) @ w_dense, cat

    steps = _chunks(model.boundaries, chunk_rows)
    stride = max(1, -(-n_rows // STATS_SAMPLES))      # label statistics on every stride-th sample
    bias_stride = max(1, n_rows // BIAS_SAMPLES)
    counts = [np.zeros(n, dtype=np.int64) for n in cards]
    dense_sub, cat_sub, bias_sub, prob_sub, label_sub = [], [], [], [], []
    with DatasetWriter(out) as w, \
            tqdm(total=2 * n_rows, unit="rows", desc=f"generate {cfg.name}", disable=not progress) as bar:
        dense = w.column("dense", np.float32, (n_rows, NUM_DENSE))
        sparse = w.column("sparse", np.int32, (n_rows, sum(bags or [1] * n_tables)))
        labels = w.column("labels", np.float32, (n_rows,))
        columns = (dense, sparse, labels)
        for seg, lo, hi in steps:                     # pass 1: ids, dense features, logit samples
            if lo // RELEASE_ROWS != hi // RELEASE_ROWS:
                for col in columns:
                    release_pages(col)
            model.enter(seg)
            ids = np.empty((hi - lo, n_tables), dtype=np.int32)
            for t in range(n_tables):
                ids[:, t] = model.ids(t, lo, hi)
                if bags is None:
                    add_counts(counts[t], ids[:, t])
                else:
                    bag = bag_ids(ids[:, t], cfg.seed, t, bags[t], cards[t])
                    sparse[lo:hi, firsts[t]:firsts[t] + bags[t]] = bag
                    add_counts(counts[t], bag.ravel())
            x = _dense_chunk(hi - lo, dense_rngs)
            dense[lo:hi] = x
            if bags is None:
                sparse[lo:hi] = ids
            d, c = logits(x, ids)
            keep, keep_b = _every(lo, hi, stride), _every(lo, hi, bias_stride)
            dense_sub.append(d[keep])
            cat_sub.append(c[keep])
            bias_sub.append((d + c)[keep_b])
            bar.update(hi - lo)
        dense_logit, cat_logit = np.concatenate(dense_sub), np.concatenate(cat_sub)
        logit = dense_logit + cat_logit
        bias = _solve_bias(np.concatenate(bias_sub), TARGET_CTR)
        for _, lo, hi in steps:                       # pass 2: labels
            if lo // RELEASE_ROWS != hi // RELEASE_ROWS:
                for col in columns:
                    release_pages(col)
            d, c = logits(np.asarray(dense[lo:hi]), np.asarray(sparse[lo:hi][:, firsts]))
            prob = 1 / (1 + np.exp(-((d + c) + bias)))
            y = (label_rng.random(hi - lo) < prob).astype(np.float32)
            labels[lo:hi] = y
            keep = _every(lo, hi, stride)
            prob_sub.append(prob[keep])
            label_sub.append(y[keep])
            bar.update(hi - lo)
        prob, y = np.concatenate(prob_sub), np.concatenate(label_sub)
        for col in columns:
            release_pages(col)

        splits = split_ranges(n_rows, cfg.holdout_fraction)
        a_test, b_test = splits["test"]
        test = slice(-(-a_test // stride), -(-b_test // stride))   # the sampled test samples
        planted_model = {
            "form": "label ~ Bernoulli(sigmoid(bias + dense @ dense_weights + sum_t effect_t[id_t]))",
            "categorical_tables": planted,
            "categorical_cardinalities": [cards[t] for t in planted],
            "effect_std": EFFECT_STD,
            "dense_weights": [round(float(v), 6) for v in w_dense],
            "bias": bias,
            "target_ctr": TARGET_CTR,
            "ctr": float(y.mean()),
            "dense_logit_std": float(dense_logit.std()),
            "categorical_logit_std": float(cat_logit.std()),
            "logit_std": float(logit.std()),
            "bayes_auc": roc_auc(y, prob),
            "bayes_auc_test": roc_auc(y[test], prob[test]),
            **({"statistics_sample_stride": stride} if stride > 1 else {}),
        }
        generator = {**cfg.to_dict(), "full_cardinalities": cfg.full_cardinalities,
                     "hot_fraction": HOT_FRACTION}
        meta = {
            "name": cfg.name,
            "kind": cfg.kind,
            "generator": generator,
            "planted_model": planted_model,
            "skew": coverage_from_counts(counts),
        }
        if cfg.full_size:
            generator["full_size_model"] = _full_size_summary(cfg, model)
            meta["tail"] = tail_stats(counts)
        return w.commit(cardinalities=cards, splits=splits, meta=meta, bags=bags)


def _full_size_summary(cfg: GeneratorConfig, model: _FullSizeIds) -> dict[str, Any]:
    """What the full-size model promises: rows seen over the full dataset, the share a prefix touches."""
    full = cfg.full_samples
    return {
        "doc": "counts over full_samples samples: 1 + power law per row (generators.occurrences); "
               "this dataset is the first `rows` samples",
        "full_samples": full,
        "drift_min_per_segment": DRIFT_MIN_PER_SEGMENT,
        "rows_seen_over_10_full": int(sum(int((t.counts > 10).sum()) for t in model.tables)),
        "touched_expected": [round(expected_touched(t.counts, cfg.rows, full), 6) for t in model.tables],
    }
