"""The kernels' sorting and selection (``hotcold.sorting``) against numpy, compiled and as plain Python."""
from __future__ import annotations

import numpy as np
import pytest

from hotcold import sorting
from hotcold.jit import python

KINDS = ("compiled", "python")


def arrays(seed: int, count: int = 300):
    """(array, lo, hi): random lengths up to 200 and value ranges from 2 values to 10**12; some sorted, some
    reversed, some all equal; int64 and uint64."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        n = int(rng.integers(0, 200))
        a = rng.integers(0, int(rng.choice([1, 2, 5, 1000, 10**12])), n)
        if trial % 5 == 1:
            a = np.sort(a)
        elif trial % 5 == 2:
            a = np.sort(a)[::-1]
        a = np.ascontiguousarray(a, dtype=np.uint64 if trial % 3 == 0 else np.int64)
        lo = int(rng.integers(0, n + 1))
        yield a, lo, int(rng.integers(lo, n + 1))


def fn(name: str, kind: str):
    f = getattr(sorting, name)
    return f if kind == "compiled" else python(f)


@pytest.mark.parametrize("kind", KINDS)
def test_sort_range_sorts_the_range_and_leaves_the_rest(kind: str) -> None:
    for a, lo, hi in arrays(0):
        got = a.copy()
        fn("sort_range", kind)(got, lo, hi)
        want = a.copy()
        want[lo:hi] = np.sort(a[lo:hi])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_kth_smallest_is_numpys_partition(kind: str) -> None:
    rng = np.random.default_rng(1)
    for a, _, n in arrays(1):
        if n == 0:
            continue
        k = int(rng.integers(0, n))
        got = a.copy()
        assert fn("kth_smallest", kind)(got, n, k) == np.partition(a[:n], k)[k]
        np.testing.assert_array_equal(np.sort(got[:n]), np.sort(a[:n]))   # reordered, nothing lost
        np.testing.assert_array_equal(got[n:], a[n:])


@pytest.mark.parametrize("kind", KINDS)
def test_stable_argsort_is_numpys_stable_argsort(kind: str) -> None:
    for a, _, _ in arrays(2):
        order, tmp = np.empty(a.size, np.int64), np.empty(a.size, np.int64)
        fn("stable_argsort", kind)(a, order, tmp)
        np.testing.assert_array_equal(order, np.argsort(a, kind="stable"))


@pytest.mark.parametrize("kind", KINDS)
def test_search_right_is_numpys_searchsorted_on_the_right(kind: str) -> None:
    rng = np.random.default_rng(3)
    for a, _, _ in arrays(3):
        a = np.sort(a)
        for x in rng.integers(0, 2 + (int(a.max()) if a.size else 0), 5).astype(a.dtype):
            assert fn("search_right", kind)(a, x) == np.searchsorted(a, x, side="right")
