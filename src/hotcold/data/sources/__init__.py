"""The real datasets: download, parsers of the Criteo and Taobao formats, preprocessing.

``catalog`` says where each dataset comes from and fetches it (``download``
does verified HTTP); ``textparse`` is the vectorised text input shared by the
``criteo`` and ``taobao`` preprocessors; ``prepare`` ties a ``source`` config
section (``source_config``, with ``criteo_config`` and ``taobao_config``: the
options apart from the preprocessing) to fetch and preprocess. The names of
``catalog`` are re-exported here.
"""
from hotcold.data.sources.catalog import (
    CRITEO_KAGGLE_TRAIN_LINES,
    CRITEO_KAGGLE_URL,
    CRITEO_TERABYTE_BASE_URL,
    CRITEO_TERABYTE_DAYS,
    CRITEO_TERABYTE_URL_TEMPLATE,
    TAOBAO_FILE,
    TAOBAO_URL,
    describe_local,
    fetch_criteo_kaggle,
    fetch_criteo_terabyte,
    locate_taobao,
)

__all__ = [
    "CRITEO_KAGGLE_URL", "CRITEO_KAGGLE_TRAIN_LINES", "CRITEO_TERABYTE_BASE_URL",
    "CRITEO_TERABYTE_URL_TEMPLATE", "CRITEO_TERABYTE_DAYS", "TAOBAO_URL", "TAOBAO_FILE",
    "describe_local", "fetch_criteo_kaggle", "fetch_criteo_terabyte", "locate_taobao",
]
