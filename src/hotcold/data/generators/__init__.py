"""Synthetic datasets shaped like Criteo Kaggle, Criteo Terabyte and Taobao (``hotcold generate``).

Why synthetic: the benchmark needs data whose embedding-access skew, drift and
learnability are known and reproducible at any size, without downloading the
real logs. One ``GeneratorConfig`` describes a dataset; ``kind`` selects the
generator, each described in its module: ``criteo-kaggle-style`` /
``criteo-terabyte-style`` (``generators.criteo``), ``taobao-style``
(``generators.taobao``). Each manifest records the measured access skew under
``skew`` (``hotcold.data.skew.coverage_from_counts`` over every lookup of a
sample, histories included). Output is byte-identical for a given config.
"""
from hotcold.data.generators.config import KINDS, GeneratorConfig
from hotcold.data.generators.run import generate

__all__ = ["KINDS", "GeneratorConfig", "generate"]
