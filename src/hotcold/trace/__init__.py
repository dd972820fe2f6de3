"""Access traces of the embedding lookups: per-row counts and skew profiles (``hotcold profile``).

The profile API is re-exported lazily, so importing a sibling module (e.g.
``hotcold.trace.policies`` on the training path) does not load pandas.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Profile", "coverage_figure", "dataset_stats", "load_profile", "profile_dataset", "save_profile",
           "write_dataset_stats"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("hotcold.trace.profile"), name)
    raise AttributeError(f"module 'hotcold.trace' has no attribute {name!r}")
