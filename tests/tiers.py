"""The test tiers (pyproject.toml: ``make test`` runs the tests not marked ``slow``, ``make test-all`` every test).

A parametrized check whose cases differ only in data, optimizer or store keeps a covering few of them in the
default tier (every store, plan or dataset at least once) and the rest in the slow tier: ``tiered``.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable

import pytest

SLOW = pytest.mark.slow


def tiered(cases: Iterable, default: Collection) -> list:
    """``cases`` for ``pytest.mark.parametrize``: those in ``default`` as they are (default tier), the others
    marked ``slow``. A case of several arguments is a tuple, as parametrize takes it."""
    cases = list(cases)
    missing = [case for case in default if case not in cases]
    assert not missing, f"default-tier cases that are not cases: {missing}"
    return [case if case in default else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=SLOW)
            for case in cases]
