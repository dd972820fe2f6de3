"""AUC and log loss against direct computations."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from hotcold.metrics import log_loss, roc_auc


def pairwise_auc(y, s) -> float:
    """P(score of a positive > score of a negative), ties counting one half."""
    pos = [b for a, b in zip(y, s) if a]
    neg = [b for a, b in zip(y, s) if not a]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    s = np.round(rng.random(300) + 0.3 * y, 1)  # rounding makes many ties
    assert roc_auc(y, s) == pytest.approx(pairwise_auc(y, s), abs=1e-12)


def test_auc_extremes_and_degenerate():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert roc_auc([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9]) == 0.0
    assert np.isnan(roc_auc([1, 1], [0.3, 0.4]))


def test_log_loss():
    assert log_loss([1, 0], [0.5, 0.5]) == pytest.approx(np.log(2))
    assert log_loss([1], [1.0]) < 1e-6
