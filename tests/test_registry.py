"""The method registry names each store and pricing function by path: the names must be the stores' own, and
reading the registry must not import torch (Snakemake and the analysis read it where none is needed)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hotcold import methods


@pytest.mark.parametrize("name", methods.names())
def test_each_method_names_its_store_options_and_pricing_as_the_store_has_them(name):
    m = methods.get(name)
    assert m.store.__name__ == m.store_path.split(":")[1]
    assert m.store.Options is m.options
    assert m.store.spans_ranks == m.spans_ranks
    assert (m.cost is None) == m.peer
    if m.cost is not None:
        assert callable(m.cost) and m.cost.__name__.startswith("price_")


def test_reading_the_registry_imports_no_torch():
    code = ("import sys\nimport hotcold.methods as m\nm.get('lru').parse_options({'cache_ratio': 0.05})\n"
            "m.names(spans_ranks=True)\nprint(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
