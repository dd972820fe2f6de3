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


def test_a_run_parses_its_store_options_once_and_records_what_was_given(small_dataset, tmp_path, monkeypatch):
    """From the run config's JSON to the trained record (``hotcold train``'s path): one parse of a mapping into
    the method's options; everything after it holds the typed object."""
    import json

    from hotcold.options.base import StoreOptions
    from hotcold.options.stores import CacheOptions
    from hotcold.run_config import RunConfig
    from hotcold.runs.runner import train_run

    parses = []
    parse = StoreOptions.parse.__func__

    def counted(cls, data, where):
        if not isinstance(data, StoreOptions):
            parses.append((cls.__name__, where))
        return parse(cls, data, where)

    monkeypatch.setattr(StoreOptions, "parse", classmethod(counted))
    text = json.dumps({"dataset": small_dataset.path.name, "method": "lru", "store": {"cache_ratio": 0.05},
                       "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
                       "train": {"steps": 4, "warmup_steps": 1, "batch_size": 64, "eval_samples": 256}})
    cfg = RunConfig.from_dict(json.loads(text))
    assert cfg.store == CacheOptions(cache_ratio=0.05)
    record = train_run(cfg, small_dataset.path, tmp_path / "run", device="cpu", progress=False)
    assert parses == [("CacheOptions", "run config: store")]
    assert record["config"]["store"] == {"cache_ratio": 0.05}
    assert RunConfig.from_dict(record["config"]).store == cfg.store


def test_a_run_config_refuses_options_its_method_does_not_take():
    from hotcold.config import ConfigError
    from hotcold.run_config import RunConfig

    with pytest.raises(ConfigError, match="run config: store.*cache_ratio"):
        RunConfig.from_dict({"dataset": "d", "method": "device", "store": {"cache_ratio": 0.05}})
    with pytest.raises(ConfigError, match="takes no store options"):
        RunConfig.from_dict({"dataset": "d", "method": "-", "store": {"window": 2}})
