"""Synthetic datasets shaped like Criteo Kaggle, Criteo Terabyte and Taobao (``hotcold generate``).

Why synthetic: the benchmark needs data whose embedding-access skew, drift and
learnability are known and reproducible at any size, without downloading the
real logs. One ``GeneratorConfig`` describes a dataset; ``kind`` selects the
generator:

- ``criteo-kaggle-style`` / ``criteo-terabyte-style`` (``generators.criteo``): the 26
  table sizes of Criteo Kaggle or of Terabyte under DLRM's ``max_ind_range``
  10M convention (optionally capped), 13 heavy-tailed dense counts,
  power-law row popularity with scattered ids, a slowly drifting hot set and
  planted logistic labels with a known Bayes AUC.
- ``taobao-style`` (``generators.taobao``): the Taobao UserBehavior layout of TBSM,
  (user, target item, target category) plus the (item, category) history of
  the user's previous clicks, power-law items tied to power-law categories,
  drifting per-user interests and 50% sampled negatives.

Each manifest records the measured access skew under ``skew``
(``hotcold.data.skew.coverage_from_counts`` over every lookup of a sample,
histories included). Output is byte-identical for a given config.

Knobs and kinds: ``exponent`` and ``holdout_fraction`` default per kind
(``None`` resolves them); ``max_length`` and ``interest_drift`` apply to
``taobao-style`` only and are rejected for the Criteo kinds.
"""
from hotcold.data.generators.config import KINDS, GeneratorConfig
from hotcold.data.generators.run import generate

__all__ = ["KINDS", "GeneratorConfig", "generate"]
