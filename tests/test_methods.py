"""The method registry and the typed store options, pinned to the workflow schema's ``$defs.methods``."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hotcold import methods
from hotcold.config import ConfigError, read_yaml
from hotcold.embedding.base import EmbeddingStore
from hotcold.options.base import StoreOptions


SCHEMA = read_yaml(Path(__file__).resolve().parents[1] / "workflows/schemas/config.schema.yaml")
DEFS = SCHEMA["$defs"]
#: values tried on every option: the schema and the options class must accept and reject the same ones
PROBES = [True, False, 0, 1, 2, -1, 0.0, 0.5, 0.9, 1.0, 1.5, 2.5, 1e9, "x", "epoch", "none", "lru", "lfu",
          "static", "row", "table", "flexshard", {}, {"0": 1}, {"0": -1}, [1]]
#: options another option needs before it applies (a size only with a cache)
CONTEXT = {("fbgemm", "cache_ratio"): {"cache": "lru"}, ("fbgemm", "cache_rows"): {"cache": "lru"}}


def resolve(node: dict) -> dict:
    """``node`` with its ``$ref`` followed (refs within ``$defs`` only), ``properties`` of both kept."""
    while "$ref" in node:
        target = DEFS
        for part in node["$ref"].removeprefix("#/$defs/").split("/"):
            target = target[part]
        own = {k: v for k, v in node.items() if k != "$ref"}
        node = {**target, **own, "properties": {**target.get("properties", {}), **own.get("properties", {})}}
    return node


def option_schemas(method: str) -> dict[str, dict]:
    """Option name -> its schema, for one method's variants."""
    variant = resolve(resolve(DEFS["methods"]["properties"][method])["additionalProperties"])
    return {k: resolve(v) for k, v in variant.get("properties", {}).items()}


def schema_accepts(prop: dict, value) -> bool:
    """Whether the schema takes ``value``: JSON Schema counts 1.0 as an integer; the options (as every typed
    config of hotcold) take integers only. Skips where jsonschema is not installed (a bare GPU machine)."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (make setup installs it)")
    strict = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=(
        jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
            "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool))))
    return strict({"$defs": DEFS, **prop}).is_valid(value)


def parses(method: str, options: dict) -> bool:
    try:
        methods.get(method).parse_options(options)
    except ConfigError:
        return False
    return True


def test_every_method_once_with_a_store_and_typed_options():
    assert len(set(methods.METHODS)) == len(methods.METHODS)
    for name, m in methods.METHODS.items():
        assert m.name == name and issubclass(m.store, EmbeddingStore)
        assert issubclass(m.options, StoreOptions) and dataclasses.is_dataclass(m.options)
        assert m.parse_options(None) == m.options()  # the defaults are valid options
    assert methods.names(spans_ranks=True) == ["sharded", "proactive", "flexshard"]
    assert methods.names(peer=True) == ["fbgemm"]


def test_an_unknown_method_fails_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown method 'nope'; known: \[.*'device'"):
        methods.get("nope")


def test_the_schema_names_every_method_and_its_options():
    assert sorted(DEFS["methods"]["properties"]) == sorted(methods.names())
    for name in methods.names():
        assert sorted(option_schemas(name)) == sorted(methods.get(name).options.names()), name


@pytest.mark.parametrize("method", methods.names())
def test_schema_and_options_accept_the_same_values(method):
    """Each option alone: every probe the schema accepts parses, and every one it rejects fails."""
    defaults = methods.get(method).options()
    for key, prop in option_schemas(method).items():
        default = getattr(defaults, key)
        assert default is None or schema_accepts(prop, default), (method, key, default)
        for value in PROBES + list(prop.get("enum", [])):
            if value is None:
                continue
            options = {**CONTEXT.get((method, key), {}), key: value}
            assert schema_accepts(prop, value) == parses(method, options), (method, key, value)


@pytest.mark.parametrize("method", methods.names())
def test_unknown_and_null_options_fail_naming_the_key(method):
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['cache_ratoi'\]"):
        methods.get(method).parse_options({"cache_ratoi": 0.1})
    for key in methods.get(method).options.names():
        with pytest.raises(ConfigError, match=key):
            methods.get(method).parse_options({key: None})
