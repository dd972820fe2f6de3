"""The workflow's config as Snakemake reads it: the default file, a ``--configfile`` overlaid, the schema's defaults.

Dataset sections merge into the global ones (``merged``: mappings key by key, a null removes); a
``--configfile`` lies over ``default.yaml`` as Snakemake lays it (``overlaid``); ``with_defaults`` fills in
what the schema says where a key is missing, as Snakemake's ``validate`` does.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

from hotcold.config import ConfigError, read_yaml


def merged(base: Mapping[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """``override`` merged into ``base``: mappings key by key, other values replace, None removes."""
    out = dict(base)
    for key, value in (override or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


#: the workflow's own config (the Snakefile's ``configfile``) and schema
REPO = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = REPO / "workflows" / "config" / "default.yaml"
SCHEMA = REPO / "workflows" / "schemas" / "config.schema.yaml"


def overlaid(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base`` as Snakemake merges ``--configfile`` over the Snakefile's ``configfile``:
    mappings key by key, every other value (a null too) replaces. The nulls stay: ``Matrix`` reads a null
    dataset, method, variant or option as removed, and a null setting (``max_rows_per_table``) as its value."""
    out = dict(base)
    for key, value in override.items():
        out[key] = overlaid(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def with_defaults(config: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the schema's defaults filled in where keys are missing, as Snakemake's ``validate``
    (``set_default``) does wherever a subschema's ``properties`` apply; needs no jsonschema."""
    defs = schema.get("$defs", {})

    def resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in node:
            target: Any = defs
            for part in node["$ref"].removeprefix("#/$defs/").split("/"):
                target = target[part]
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"},
                    "properties": {**target.get("properties", {}), **node.get("properties", {})}}
        return node

    def fill(instance: Any, node: Mapping[str, Any]) -> None:
        if not isinstance(instance, dict):
            return
        node = resolve(node)
        props = node.get("properties", {})
        for key, sub in props.items():
            if "default" in sub and key not in instance:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                fill(instance[key], sub)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in instance.keys() - props.keys():
                fill(instance[key], extra)

    filled = copy.deepcopy(config)
    fill(filled, schema)
    return filled


def workflow_config(path: Path | str | None = None) -> dict[str, Any]:
    """The config the workflow runs with ``--configfile path`` (None: none): ``default.yaml`` with the file
    overlaid (``overlaid``) and the schema's defaults filled in, as ``make reproduce CONFIG=path`` sees it."""
    def load(p: Path) -> dict[str, Any]:
        try:
            data = read_yaml(p) or {}
        except OSError as e:
            raise ConfigError(f"{p}: cannot read the config: {' '.join(str(e).split())}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: a config must be a mapping, got {type(data).__name__}")
        return data

    config = load(DEFAULT_CONFIG)
    if path is not None and Path(path).resolve() != DEFAULT_CONFIG.resolve():
        config = overlaid(config, load(Path(path)))
    return with_defaults(config, load(SCHEMA))


def without_nulls(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` with None-valued keys removed at every level (a null in a merged file removes)."""
    return {k: without_nulls(v) if isinstance(v, dict) else v for k, v in mapping.items() if v is not None}


def to_json(data: Any) -> str:
    """How a verb receives a config on its command line."""
    return json.dumps(data, sort_keys=True)
