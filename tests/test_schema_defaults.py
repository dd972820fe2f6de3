"""Every store option's default is stated in the workflow schema (``x-default``) and is the code's default.

The schema's ``default`` keyword would be written into every variant by Snakemake's validation; ``x-default``
only states it. Where the code's field is None and the store then takes a size of its own, ``x-default`` says
which (``EFFECTIVE``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hotcold import methods
from hotcold.options.stores import DEFAULT_CACHE_RATIO
from hotcold.options.base import DEFAULT_BUDGET_RATIO
from hotcold.config import read_yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = read_yaml(REPO / "workflows" / "schemas" / "config.schema.yaml")
DEFS = SCHEMA["$defs"]

#: (method, option): the default of an option whose field is None, as the store takes it
EFFECTIVE = {("lru", "cache_ratio"): DEFAULT_CACHE_RATIO, ("lfu", "cache_ratio"): DEFAULT_CACHE_RATIO,
             ("freqcache", "cache_ratio"): DEFAULT_CACHE_RATIO, ("belady", "cache_ratio"): DEFAULT_CACHE_RATIO,
             ("fbgemm", "cache_ratio"): DEFAULT_CACHE_RATIO, ("fae", "budget_ratio"): DEFAULT_BUDGET_RATIO,
             ("scratchpipe", "scratchpad_rows"): "the window's largest working set"}


def target(ref: str) -> dict:
    """What a local ``$ref`` (``#/$defs/...``) points at."""
    node = SCHEMA
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def resolve(node: dict) -> dict:
    """``node`` with its ``$ref`` merged in (its own keys and properties first)."""
    while "$ref" in node:
        ref = target(node["$ref"])
        node = {**ref, **{k: v for k, v in node.items() if k != "$ref"},
                "properties": {**ref.get("properties", {}), **node.get("properties", {})}}
    return node


def option_properties(method: str) -> dict[str, dict]:
    """The schema's properties of one variant of ``method``'s options."""
    variant = resolve(resolve(DEFS["methods"]["properties"][method])["additionalProperties"])
    return {name: resolve(prop) for name, prop in variant.get("properties", {}).items()}


@pytest.mark.parametrize("method", [m for m in methods.names() if methods.get(m).options.__dataclass_fields__])
def test_every_option_states_the_codes_default(method: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(methods.get(method).options)}
    props = option_properties(method)
    assert set(props) <= set(fields), f"{method}: options in the schema but not in the code"
    for name, prop in props.items():
        field = fields[name]
        code = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        expected = EFFECTIVE.get((method, name), code)
        assert prop.get("x-default") == expected, f"{method}.{name}: schema {prop.get('x-default')!r}, code {expected!r}"
