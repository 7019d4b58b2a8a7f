"""Reading a configuration: YAML files, dotted overrides, building and validating `MempoConfig`, dumping.

`load_config(path, overrides)` reads the YAML mapping (`read_yaml_mapping`: a safe loader that
refuses a key given twice in one mapping, naming it and both lines), applies the overrides
(``"actor.lr=1e-5"``, ``"eval.objectives=[2,4,8]"``: keys checked against the tree, values kept as
text), then builds the tree, converting every value to its field's type and validating it
(`mempo.config.schema`). `dump_config` writes plain YAML; loading it back gives an equal config.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import yaml

from mempo.config.coerce import ConfigError, build_section, type_name
from mempo.config.schema import MempoConfig
from mempo.utils.atomic import replace_file_atomically

__all__ = ["load_config", "read_yaml_mapping", "config_from_dict", "config_to_dict", "dump_config", "apply_overrides",
           "split_overrides"]


def _section_fields(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of the raw config mapping `data` with dotted overrides ``"a.b=value"`` applied.

    Keys are checked against the config tree (unknown keys raise ConfigError naming the dotted
    path); values stay text here and are converted by field type when the config is built.
    """
    result: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for override in overrides:
        if "=" not in override:
            raise ConfigError(override.strip(), "override must look like 'section.field=value'")
        dotted, text = override.split("=", 1)
        dotted = dotted.strip()
        parts = dotted.split(".")
        cls: Any = MempoConfig
        node = result
        for depth, part in enumerate(parts):
            hints = _section_fields(cls)
            if part not in hints:
                where = ".".join(parts[: depth + 1])
                raise ConfigError(where, f"unknown key; {cls.__name__} has: {', '.join(sorted(hints))}")
            hint = hints[part]
            if depth == len(parts) - 1:
                if dataclasses.is_dataclass(hint):
                    raise ConfigError(dotted, f"is a section; override one of its fields "
                                              f"({', '.join(sorted(_section_fields(hint)))})")
                node[part] = text
            else:
                if not dataclasses.is_dataclass(hint):
                    raise ConfigError(".".join(parts[: depth + 1]), f"is a field, not a section ({type_name(hint)})")
                child = node.get(part)
                node[part] = dict(child) if isinstance(child, Mapping) else {}
                node, cls = node[part], hint
    return result


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(overrides, rest)``: the ``key=value`` words of a command line that are not options, and the
    other words in order. For scripts whose overrides may follow a list option (``--ks 2 4
    rollout.temperature=0.7``), which argparse would read as one of that option's values."""
    overrides = [word for word in argv if "=" in word and not word.startswith("-")]
    return overrides, [word for word in argv if word not in overrides]


def config_from_dict(data: Optional[Mapping[str, Any]] = None, overrides: Sequence[str] = ()) -> MempoConfig:
    """Build and validate a MempoConfig from a raw mapping plus dotted overrides."""
    raw = apply_overrides(data or {}, overrides)
    return build_section(MempoConfig, raw, "")


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a mapping with the same key twice (PyYAML keeps the last one
    silently, so a duplicated section would drop the first). Keys brought in by a merge (``<<``)
    may be overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: SafeLoader reports it below
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int):
        super().__init__(key, first, again)
        self.key, self.first, self.again = key, first, again


def _yaml_error_text(error: yaml.YAMLError) -> str:
    """A YAML error as one line: the problem and its line/column (PyYAML's own text spans lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(error, "context", None)
    return " ".join(f"{problem}{where}{f' ({context})' if context else ''}".split())


def read_yaml_mapping(path: Union[str, Path]) -> dict[str, Any]:
    """The top-level mapping of a YAML file (empty file: {}); ConfigError naming the file for a
    missing or unreadable file, bytes that are not UTF-8, invalid YAML, a duplicated key (with
    both lines) or a top level that is not a mapping."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("", f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError("", f"{path}: is a directory, not a YAML config file") from None
    except OSError as error:
        raise ConfigError("", f"{path}: cannot read the config ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise ConfigError("", f"{path}:{line}: not valid UTF-8 (byte {error.start}: {error.reason})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as dup:
        raise ConfigError("", f"{path}: key {dup.key!r} appears twice in one mapping (lines {dup.first} "
                                        f"and {dup.again}); YAML would keep only the last") from None
    except yaml.YAMLError as error:
        raise ConfigError("", f"{path}: not valid YAML: {_yaml_error_text(error)}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return dict(data)


def load_config(path: Union[str, Path, None] = None, overrides: Sequence[str] = ()) -> MempoConfig:
    """Load a YAML file (None: all defaults; `read_yaml_mapping`), apply dotted overrides, convert
    and validate."""
    data: Any = read_yaml_mapping(path) if path is not None else {}
    return config_from_dict(data, overrides)


def config_to_dict(cfg: MempoConfig) -> dict[str, Any]:
    """The config as plain nested dicts / lists / scalars (YAML and JSON friendly)."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: MempoConfig, path: Union[str, Path, None] = None) -> str:
    """The config as YAML text (sections in declaration order); also written to `path` if given
    (atomically: `mempo.utils.atomic.replace_file_atomically`)."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)
    if path is not None:
        replace_file_atomically(path, text, phase="config")
    return text
