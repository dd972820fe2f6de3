"""Argument readers the verbs share: a mapping or a list given inline as JSON, or as the path of a JSON/YAML file.

Workflow rules pass run configs inline; people pass files. Both read the
same way here, and bad input is a ``ConfigError`` (one line, exit 2).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotcold.config import ConfigError, read_yaml


def load_json_or_file(text: str, opening: str, what: str) -> Any:
    """JSON given inline (``text`` starts with ``opening``), or the path of a JSON/YAML file holding it."""
    if text.lstrip().startswith(opening):
        return json.loads(text)
    path = Path(text)
    if not path.is_file():
        raise ConfigError(f"{text!r} is neither {what} nor an existing file")
    if path.suffix.lower() == ".json":  # YAML 1.1 would read JSON's 1e-08 as a string
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
    return read_yaml(path)


def load_mapping(text: str) -> dict[str, Any]:
    """A JSON object given inline, or the path of a JSON/YAML file holding one."""
    data = load_json_or_file(text, "{", "a JSON object")
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping (JSON object)")
    return data


def load_runs(text: str) -> list[tuple[dict[str, Any], str]]:
    """``[{"run_config": {...}, "out": DIR}, ...]`` given inline, or the path of a JSON/YAML file holding it."""
    data = load_json_or_file(text, "[", "a JSON list")
    if not isinstance(data, list) or not data:
        raise ConfigError("--runs: expected a non-empty list of {run_config, out} objects")
    runs = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"run_config", "out"}:
            raise ConfigError(f"--runs[{i}]: expected an object with exactly the keys run_config and out, "
                              f"got {item!r}")
        config = item["run_config"]
        config = load_mapping(config) if isinstance(config, str) else config
        if not isinstance(config, dict) or not isinstance(item["out"], str) or not item["out"]:
            raise ConfigError(f"--runs[{i}]: run_config must be a mapping and out a directory")
        runs.append((config, item["out"]))
    return runs

