"""Public entry point of the generated datasets (``hotcold generate``); the code is in ``generators/``."""
from hotcold.data.generators.config import (
    CRITEO_KAGGLE_CARDINALITIES,
    CRITEO_TERABYTE_CARDINALITIES,
    DEFAULT_EXPONENTS,
    DEFAULT_HOLDOUT,
    DEFAULT_NAMES,
    FULL_CARDINALITIES,
    KINDS,
    TAOBAO_CARDINALITIES,
    TAOBAO_DEFAULTS,
    GeneratorConfig,
    split_ranges,
    split_sizes,
)
from hotcold.data.generators.run import generate

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES", "CRITEO_TERABYTE_CARDINALITIES", "DEFAULT_EXPONENTS", "DEFAULT_HOLDOUT",
    "DEFAULT_NAMES", "FULL_CARDINALITIES", "KINDS", "TAOBAO_CARDINALITIES", "TAOBAO_DEFAULTS",
    "GeneratorConfig", "generate", "split_ranges", "split_sizes",
]
