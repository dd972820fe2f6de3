"""The workflow schema's store options, checked directly (the dry-run tests show that the workflow applies them)."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((REPO / "workflows" / "schemas" / "config.schema.yaml").read_text())
DEFAULT = yaml.safe_load((REPO / "workflows" / "config" / "default.yaml").read_text())
PAPER = yaml.safe_load((REPO / "workflows" / "config" / "paper.yaml").read_text())
METHODS = jsonschema.Draft202012Validator(
    {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": "#/$defs/methods"})


def errors(methods: dict) -> list[str]:
    """Each error as '<path>: <message>'."""
    return [f"{list(e.absolute_path)}: {e.message}" for e in METHODS.iter_errors(methods)]


@pytest.mark.parametrize("options", [
    {"fae": {"a": {"sample_fraction": 0.05, "budget_bytes": 0, "run_length": 1}}},
    {"fae": {"a": {"sample_fraction": 1, "budget_ratio": 1.0, "run_length": "epoch"}}},
    {"fae": {"a": {"budget_ratio": None, "budget_bytes": 134217728}}},
    {"lru": {"a": {"cache_ratio": 1, "pin_host": False}}, "lfu": {"a": {"cache_rows": 1}}},
    {"freqcache": {"a": {"cache_ratio": 0.015, "warmup_ratio": 0, "evict": "lfu", "pin_host": True}}},
    {"scratchpipe": {"a": {"window": 0, "scratchpad_rows": 1}, "b": {"scratchpad_ratio": 0.5}, "c": {}}},
    {"device": {"base": {}}, "hybrid": {"base": None}, "lru": None},
], ids=["fae-bytes", "fae-ratio-epoch", "null-removes", "caches", "freqcache", "scratchpipe", "nulls"])
def test_good_store_options_pass(options: dict) -> None:
    assert errors(options) == []


def test_shipped_configs_pass() -> None:
    assert errors(DEFAULT["methods"]) == [] and errors(PAPER["methods"]) == []


@pytest.mark.parametrize(("options", "expected"), [
    ({"lrux": {"a": {}}}, "'lrux' was unexpected"),
    ({"lru": {"a": {"cache_ratio": 0}}}, "['lru', 'a', 'cache_ratio']: 0 is less than or equal to the minimum of 0"),
    ({"lru": {"a": {"cache_ratio": 1.5}}}, "['lru', 'a', 'cache_ratio']: 1.5 is greater than the maximum of 1"),
    ({"lru": {"a": {"cache_ratio": True}}}, "['lru', 'a', 'cache_ratio']: True is not of type 'number'"),
    ({"lfu": {"a": {"cache_rows": 0}}}, "['lfu', 'a', 'cache_rows']"),
    ({"lfu": {"a": {"cache_rows": True}}}, "['lfu', 'a', 'cache_rows']: True is not of type 'integer'"),
    ({"lfu": {"a": {"cache_rows": 2.5}}}, "['lfu', 'a', 'cache_rows']"),
    ({"lfu": {"a": {"cache_ratio": 0.1, "cache_rows": 5}}}, "cache_ratio and cache_rows are alternatives"),
    ({"lru": {"a": {"cache_ratoi": 0.1}}}, "'cache_ratoi' was unexpected"),
    ({"lru": {"a": {"pin_host": 1}}}, "['lru', 'a', 'pin_host']"),
    ({"lru": {"a": {"warmup_ratio": 0.7}}}, "'warmup_ratio' was unexpected"),
    ({"freqcache": {"a": {"warmup_ratio": 1.2}}}, "['freqcache', 'a', 'warmup_ratio']"),
    ({"freqcache": {"a": {"warmup_ratio": True}}}, "['freqcache', 'a', 'warmup_ratio']"),
    ({"freqcache": {"a": {"evict": "lru"}}}, "['freqcache', 'a', 'evict']"),
    ({"freqcache": {"a": {"cache_ratio": 0}}}, "['freqcache', 'a', 'cache_ratio']"),
    ({"freqcache": {"a": {"cache_ratio": 0.1, "cache_rows": 9}}}, "cache_ratio and cache_rows are alternatives"),
    ({"fae": {"a": {"budget_ratio": 2.0}}}, "['fae', 'a', 'budget_ratio']"),
    ({"fae": {"a": {"budget_bytes": -1}}}, "['fae', 'a', 'budget_bytes']"),
    ({"fae": {"a": {"budget_ratio": 0.1, "budget_bytes": 64}}}, "budget_bytes and budget_ratio are alternatives"),
    ({"fae": {"a": {"sample_fraction": 0}}}, "['fae', 'a', 'sample_fraction']"),
    ({"fae": {"a": {"sample_fraction": True}}}, "['fae', 'a', 'sample_fraction']"),
    ({"fae": {"a": {"run_length": 0}}}, "['fae', 'a', 'run_length']"),
    ({"fae": {"a": {"run_length": "forever"}}}, "['fae', 'a', 'run_length']"),
    ({"fae": {"a": {"run_length": True}}}, "['fae', 'a', 'run_length']"),
    ({"fae": {"a": {"window": 2}}}, "'window' was unexpected"),
    ({"scratchpipe": {"a": {"window": -1}}}, "['scratchpipe', 'a', 'window']"),
    ({"scratchpipe": {"a": {"window": True}}}, "['scratchpipe', 'a', 'window']"),
    ({"scratchpipe": {"a": {"scratchpad_rows": 0}}}, "['scratchpipe', 'a', 'scratchpad_rows']"),
    ({"scratchpipe": {"a": {"scratchpad_ratio": 0.2, "scratchpad_rows": 5}}}, "scratchpad_ratio and scratchpad_rows"),
    ({"device": {"a": {"cache_ratio": 0.1}}}, "'cache_ratio' was unexpected"),
    ({"hybrid": {"a": {"x": None}}}, "'x' was unexpected"),
    ({"lru": [1]}, "['lru']: [1] is not of type 'object', 'null'"),
    ({"lru": {"a": 0.1}}, "['lru', 'a']"),
    ({"lru": {"A": {}}}, "'A' does not match"),
])
def test_bad_store_options_name_the_key(options: dict, expected: str) -> None:
    found = errors(options)
    assert any(expected in e for e in found), found
