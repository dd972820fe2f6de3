"""A workflow config's schema error in one line: the setting, what is wrong with it, and what is allowed.

Snakemake's ``validate`` raises the first ``jsonschema`` error with the
whole schema below it (50 to 2,770 lines); the workflow shows this line
instead (``error_line``), in the manner of the package's own messages
("unknown option(s) ['cache_ration']; allowed: [...]").
"""
from __future__ import annotations

from typing import Any, Mapping

MAX_MESSAGE = 240  # characters of jsonschema's message kept (it can quote a whole section)


def _setting(path: Any) -> str:
    """A path in the config as ``train.steps`` or ``distributed.scales[0].world``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out or "(the top level)"


def _names(schema: Any, root: Mapping[str, Any], seen: int = 0) -> list[str]:
    """The property names a subschema defines: its own, its ``$ref``'s (in ``root``) and its ``allOf``, ``anyOf``,
    ``oneOf``, ``then`` and ``else`` parts', as ``unevaluatedProperties`` sees them."""
    if not isinstance(schema, dict) or seen > 8:
        return []
    out = list(schema.get("properties", {}))
    if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#/"):
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        out += _names(target, root, seen + 1)
    for key in ("allOf", "anyOf", "oneOf"):
        for part in schema.get(key, []):
            out += _names(part, root, seen + 1)
    for key in ("then", "else"):
        out += _names(schema.get(key), root, seen + 1)
    return list(dict.fromkeys(out))


def error_line(error: Any, root: Mapping[str, Any] | None = None) -> str:
    """``error`` (a ``jsonschema.ValidationError`` against the schema ``root``) as ``setting: message[; allowed:
    ...]``. Of an error under ``oneOf``/``anyOf``, the alternative's that fits best, with the schema's
    description of the choice."""
    from jsonschema.exceptions import best_match

    top = error
    if error.context:
        error = best_match(error.context)
    note = top.schema.get("description") if top.validator in ("oneOf", "anyOf") and isinstance(top.schema, dict) \
        else None
    message = error.message if len(error.message) <= MAX_MESSAGE else error.message[:MAX_MESSAGE] + " ..."
    if note:
        message = f"{message} ({note})" if top.context else note
    allowed: list[str] = []
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties":
        allowed = [*schema.get("properties", {}), *(f"names matching {p}" for p in schema.get("patternProperties", {}))]
    elif error.validator == "unevaluatedProperties":
        allowed = _names(schema, root or {})
    return f"{_setting(error.absolute_path)}: {message}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")


def schema_error(exc: BaseException, root: Mapping[str, Any] | None = None) -> str | None:
    """Snakemake's validation error ``exc`` (against the schema ``root``) as one line (``error_line``), or None
    when it carries no ``jsonschema`` error."""
    from jsonschema.exceptions import ValidationError

    cause = exc.__cause__ or exc.__context__  # Snakemake raises its error while handling jsonschema's
    if isinstance(cause, ValidationError):
        return f"Error validating config file: {error_line(cause, root)}"
    return None


def check_config(path: Any) -> str:
    """A workflow config file checked as ``snakemake --configfile path`` reads it: the file parses (else its
    line), ``default.yaml`` with it overlaid fits the schema (one line naming the setting; where jsonschema is
    installed, as Snakemake needs it) and its datasets and runs are valid (``Matrix.check``); a line on what
    it asks for."""
    from hotcold.config import ConfigError, read_yaml
    from hotcold.workflow.matrix import Matrix
    from hotcold.workflow.settings import SCHEMA, workflow_config

    config = workflow_config(path)
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import best_match
    except ImportError:  # pragma: no cover - make setup installs it with Snakemake
        pass
    else:
        schema = read_yaml(SCHEMA)
        error = best_match(Draft202012Validator(schema).iter_errors(config))
        if error is not None:
            raise ConfigError(f"{path}: {error_line(error, schema)}")
    matrix = Matrix(config)
    matrix.check()
    runs = matrix.runs()
    return (f"{path}: valid; {len(matrix.datasets())} dataset(s) ({', '.join(matrix.datasets())}), {len(runs)} "
            f"run(s), {sum(r.scale_out for r in runs)} of them over ranks")
