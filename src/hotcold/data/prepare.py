"""Public entry point of the real datasets (``hotcold download`` / ``preprocess``); the code is in ``sources/``."""
from hotcold.data.sources.prepare import KINDS, SourceConfig, fetch, preprocess

__all__ = ["KINDS", "SourceConfig", "fetch", "preprocess"]
