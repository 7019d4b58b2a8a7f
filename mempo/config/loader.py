"""Reading a configuration: YAML files, dotted overrides, building and validating `MempoConfig`, dumping.

`load_config(path, overrides)` reads the YAML mapping (`read_yaml_mapping`: a safe loader that
refuses a key given twice in one mapping, naming it and both lines), applies the overrides
(``"actor.lr=1e-5"``, ``"eval.objectives=[2,4,8]"``: keys checked against the tree, values kept as
text), then builds the tree, converting every value to its field's type and validating it
(`mempo.config.schema`). A config file is bounded before anything is built from it: at most
`MAX_CONFIG_BYTES` bytes read (10 MiB; a pipe is read as one), `MAX_YAML_DEPTH` levels of nesting
and `MAX_YAML_NODES` values counted with every alias expanded
(a YAML "alias bomb" of nine levels expands to 10^9), else a ConfigError naming the file and
line. `dump_config` writes plain YAML; loading it back gives an equal config.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import yaml

from mempo.config.coerce import MAX_YAML_DEPTH, ConfigError, build_section, type_name
from mempo.config.schema import MempoConfig
from mempo.utils.atomic import replace_file_atomically

__all__ = ["MAX_CONFIG_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "load_config", "read_yaml_mapping",
           "config_from_dict", "config_to_dict", "dump_config", "apply_overrides", "split_overrides"]


#: The most values (scalars, lists and mappings, every alias expanded) a config file may hold.
MAX_YAML_NODES = 100_000
#: The most bytes a config file may hold (at most this much is read: ``/dev/zero`` is refused, a pipe
#: works); `MAX_YAML_NODES` values of about 100 characters each.
MAX_CONFIG_BYTES = 10 * 1024 * 1024


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
    may be overridden, as YAML intends. Nesting deeper than `MAX_YAML_DEPTH` and a document of more
    than `MAX_YAML_NODES` values with its aliases expanded are refused (`_TooLarge`) before anything
    is constructed."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _TooLarge(f"nested deeper than {MAX_YAML_DEPTH} levels (line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            _check_expanded_size(node)
        return node

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


class _TooLarge(Exception):
    """A config document over `MAX_YAML_DEPTH` or `MAX_YAML_NODES` (the message says which and where)."""


def _check_expanded_size(root: yaml.Node) -> None:
    """Raise `_TooLarge` when `root` holds more than `MAX_YAML_NODES` nodes with every alias expanded.

    Aliases share their node, so each node's expanded size is computed once (post-order over an
    explicit stack, no recursion) and reused wherever the node is referenced again."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) \
            else list(node.value) if isinstance(node, yaml.SequenceNode) else []
        if children_done or not children:
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in children)  # a cycle counts 1
            if sizes[id(node)] > MAX_YAML_NODES:
                raise _TooLarge(f"more than {MAX_YAML_NODES} values with its aliases expanded (the value at "
                                f"line {node.start_mark.line + 1})")
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


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
    missing or unreadable file, more than `MAX_CONFIG_BYTES`, bytes that are not UTF-8, invalid YAML,
    a duplicated key (with both lines), a document over `MAX_YAML_DEPTH` / `MAX_YAML_NODES` or a top
    level that is not a mapping."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:  # a pipe or a FIFO is read as a stream: bounded, not refused
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("", f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError("", f"{path}: is a directory, not a YAML config file") from None
    except OSError as error:
        raise ConfigError("", f"{path}: cannot read the config ({error.strerror or error})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError("", f"{path}: too large a config: more than {MAX_CONFIG_BYTES:,} bytes "
                              f"(mempo.config.loader.MAX_CONFIG_BYTES)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise ConfigError("", f"{path}:{line}: not valid UTF-8 (byte {error.start}: {error.reason})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _TooLarge as error:
        raise ConfigError("", f"{path}: too large a config: {error}") from None
    except RecursionError:
        raise ConfigError("", f"{path}: too large a config: nested too deeply") from None
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
