"""The workflow schema's store options, checked directly (the dry-run tests show that the workflow applies them)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hotcold.config import read_yaml

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed: the workflow's schema "
                                 "checks need it (make setup installs it)")

REPO = Path(__file__).resolve().parents[1]
SCHEMA = read_yaml(REPO / "workflows" / "schemas" / "config.schema.yaml")
DEFAULT = read_yaml(REPO / "workflows" / "config" / "default.yaml")
PAPER = read_yaml(REPO / "workflows" / "config" / "paper.yaml")
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


DISTRIBUTED = jsonschema.Draft202012Validator(
    {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], **SCHEMA["properties"]["distributed"]})


def distributed_errors(section: dict) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in DISTRIBUTED.iter_errors(section)]


@pytest.mark.parametrize("options", [
    {"sharded": {"t": {"plan": "table", "table_ranks": {"0": 1}}, "r": {"plan": "row", "memory_headroom": 1.0},
                 "c": {"plan": "column"}, "rs": {"plan": "balanced"}, "f": {"plan": "flexshard"}, "d": {}}},
    {"proactive": {"row": {"plan": "row", "depth": 2, "memory_headroom": 2}}},
    {"flexshard": {"base": {}, "roomy": {"memory_headroom": 1.5}}},
    {"sharded": {"row": {"plan": None}}, "proactive": None, "flexshard": {"base": None}},
], ids=["sharded-plans", "proactive", "flexshard", "nulls"])
def test_good_scale_out_options_pass(options: dict) -> None:
    assert errors(options) == []


@pytest.mark.parametrize(("options", "expected"), [
    ({"sharded": {"a": {"plan": "diagonal"}}}, "['sharded', 'a', 'plan']"),
    ({"sharded": {"a": {"memory_headroom": 0.9}}}, "['sharded', 'a', 'memory_headroom']: 0.9 is less than"),
    ({"sharded": {"a": {"depth": 1}}}, "'depth' was unexpected"),
    ({"sharded": {"a": {"table_ranks": {"0": -1}}}}, "['sharded', 'a', 'table_ranks', '0']"),
    ({"proactive": {"a": {"depth": 0}}}, "['proactive', 'a', 'depth']"),
    ({"proactive": {"a": {"depth": True}}}, "['proactive', 'a', 'depth']"),
    ({"proactive": {"a": {"plan": "rows"}}}, "['proactive', 'a', 'plan']"),
    ({"flexshard": {"a": {"plan": "row"}}}, "'plan' was unexpected"),
    ({"flexshard": {"a": {"memory_headroom": "lots"}}}, "['flexshard', 'a', 'memory_headroom']"),
])
def test_bad_scale_out_options_name_the_key(options: dict, expected: str) -> None:
    found = errors(options)
    assert any(expected in e for e in found), found


def test_shipped_distributed_sections_pass() -> None:
    assert distributed_errors(DEFAULT["distributed"]) == [] and distributed_errors(PAPER["distributed"]) == []


@pytest.mark.parametrize(("section", "expected"), [
    ({"scales": [{"world": 1, "ranks_per_node": 1}]}, "['scales', 0, 'world']: 1 is less than the minimum of 2"),
    ({"scales": [{"world": 4}]}, "'ranks_per_node' is a required property"),
    ({"scales": [{"world": 4, "ranks_per_node": 2, "nodes": 2}]}, "'nodes' was unexpected"),
    ({"scales": [{"world": 4, "ranks_per_node": 0}]}, "['scales', 0, 'ranks_per_node']"),
    ({"train": {"stesp": 3}}, "'stesp' was unexpected"),
    ({"shard_sim": {"plans": ["row", "diagonal"]}}, "['shard_sim', 'plans', 1]"),
    ({"shard_sim": {"scales": ["16*8"]}}, "['shard_sim', 'scales', 0]: '16*8' does not match"),
    ({"shard_sim": {"scales": ["0x8"]}}, "['shard_sim', 'scales', 0]"),
    ({"shard_sim": {"headrooms": [0.5]}}, "['shard_sim', 'headrooms', 0]: 0.5 is less than the minimum of 1.0"),
    ({"shard_sim": {"plan": ["row"]}}, "'plan' was unexpected"),
    ({"worlds": []}, "'worlds' was unexpected"),
    ({"wire_dtype": "float16"}, "['wire_dtype']: 'float16' is not one of"),
    ({"exact": "yes"}, "['exact']: 'yes' is not of type 'boolean'"),
    ({"timeout_s": 0}, "['timeout_s']: 0 is less than the minimum of 1"),
    ({"timeout_s": "5m"}, "['timeout_s']: '5m' is not of type 'number'"),
])
def test_bad_distributed_section_names_the_key(section: dict, expected: str) -> None:
    found = distributed_errors(section)
    assert any(expected in e for e in found), found
