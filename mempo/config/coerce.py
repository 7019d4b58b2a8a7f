"""Converting raw configuration values to their fields' types, and the error every config problem raises.

Conversion follows the field's annotation: ``bool`` (true/false, yes/no, on/off, 1/0), ``int`` (no
silent truncation of 1.5, no bools), ``float`` (ints accepted; ``"1e-6"`` accepted, YAML 1.1 reads it
as a string), ``str``, ``Optional[X]`` (``null``/``none``/``~`` give None), ``list[X]`` (a YAML list,
``"[2, 4]"`` or ``"2,4"``), ``Union[X, Y]`` (the first of X, Y the value converts to, in order),
``Literal[...]`` (one of the choices, exact match) and nested sections (mappings, built with
`build_section`).
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, Mapping, Union

import yaml

from mempo.errors import MempoError
from mempo.utils.jsonl import too_deep_at

__all__ = ["ConfigError", "MAX_YAML_DEPTH", "coerce_value", "build_section", "type_name"]

#: The deepest nesting a config file or a list override may have (a real config nests three levels).
MAX_YAML_DEPTH = 64

_NONE_WORDS = ("null", "none", "~", "")
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")


class ConfigError(MempoError, ValueError):
    """A bad configuration value or key. ``field``: full dotted path; ``reason``: what is allowed."""

    def __init__(self, field_path: str, reason: str):
        self.field = field_path
        self.reason = reason
        super().__init__(f"{field_path}: {reason}" if field_path else reason)

    def under(self, prefix: str) -> "ConfigError":
        """The same error with `prefix` (a section name) put in front of the field path."""
        return ConfigError(f"{prefix}.{self.field}" if self.field else prefix, self.reason)




def type_name(hint: Any) -> str:
    """How an annotation reads in an error message ("one of 'a', 'b'", "int or null", ...)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(hint))
    if origin is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        return " or ".join(type_name(a) for a in args) + (" or null" if optional else "")
    if origin is list:
        return f"a list of ({type_name(typing.get_args(hint)[0])})"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return getattr(hint, "__name__", str(hint))


def _bad(path: str, hint: Any, value: Any) -> ConfigError:
    return ConfigError(path, f"expected {type_name(hint)}, got {value!r}")


def _coerce_scalar(value: Any, hint: type, path: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
            return value.strip().lower() in _TRUE_WORDS
        raise _bad(path, hint, value)
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                pass
        raise _bad(path, hint, value)
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise _bad(path, hint, value)
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _bad(path, hint, value)
    raise ConfigError(path, f"unsupported field type {hint!r}")


def _parse_list_text(text: str, path: str) -> list[Any]:
    stripped = text.strip()
    if stripped.startswith("["):
        column = too_deep_at(stripped, MAX_YAML_DEPTH)  # before parsing: the YAML parser recurses per level
        if column is not None:
            raise ConfigError(path, f"nested deeper than {MAX_YAML_DEPTH} levels (at character {column})")
        try:
            parsed = yaml.safe_load(stripped)
        except yaml.YAMLError as error:
            raise ConfigError(path, f"not a valid list ({str(error).splitlines()[0]})") from None
        if isinstance(parsed, list):
            return parsed
    if stripped == "":
        return []
    return [part.strip() for part in stripped.split(",")]


def coerce_value(value: Any, hint: Any, path: str) -> Any:
    """Convert `value` (a YAML value or an override's text) to the annotated type `hint`.

    Raises ConfigError(path, ...) naming the expected type or the choices.
    """
    origin = typing.get_origin(hint)
    if origin is Union and type(None) not in typing.get_args(hint):
        # 1. each alternative in order; the first that takes the value wins ("2" -> 2, "2,4" -> [2, 4])
        for alternative in typing.get_args(hint):
            try:
                return coerce_value(value, alternative, path)
            except ConfigError:
                continue
        raise _bad(path, hint, value)
    if origin is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
            return None
        inner = args[0] if len(args) == 1 else Union[tuple(args)]
        try:
            return coerce_value(value, inner, path)
        except ConfigError as error:
            raise ConfigError(path, f"{error.reason.replace('expected ', 'expected null or ', 1)}") from None
    if origin is Literal:
        choices = typing.get_args(hint)
        text = value.strip() if isinstance(value, str) else value
        if text in choices:
            return text
        raise ConfigError(path, f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    if origin is list:
        item_hint = typing.get_args(hint)[0]
        items = _parse_list_text(value, path) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise _bad(path, hint, value)
        return [coerce_value(item, item_hint, f"{path}[{i}]") for i, item in enumerate(items)]
    if dataclasses.is_dataclass(hint):
        return build_section(hint, value, path)
    if value is None:
        raise _bad(path, hint, value)
    return _coerce_scalar(value, hint, path)


def build_section(cls: type, data: Any, path: str) -> Any:
    """An instance of the section dataclass `cls` from a mapping (None: all defaults), refusing unknown
    keys; errors from its validation get `path` put in front of their field."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a mapping of {cls.__name__} fields, got {data!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(where, f"unknown key; {cls.__name__} has: {', '.join(sorted(known))}")
    try:
        return cls(**dict(data))
    except ConfigError as error:
        raise (error.under(path) if path else error) from None
