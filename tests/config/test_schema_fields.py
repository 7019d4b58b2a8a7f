"""Every field of `MempoConfig` is read by the package: a field that is validated but read by no code
is a defect (the user sets it and nothing changes).

Static check over the AST of every module of the package except those of ``mempo/config/`` (where the
fields are declared and validated). A field ``f`` of section ``s`` (``rollout``, ``actor``, ``sft``,
``synthetic``, ...) is consumed when some module reads the attribute ``f`` of an expression known to be
that section:

* ``<anything>.s.f`` (``cfg.rollout.sglang_url``, ``ctx.cfg.actor.lr``, ``cfg.synthetic.model_seed``);
* ``<name>.f`` where ``<name>`` (a variable or ``self.x``) is assigned ``<anything>.s``, an
  ``S(...)`` of the section class, ``... or S(...)``, ``a if c else b`` of such values, or another
  name known to be that section, in that module (``r = cfg.rollout``, ``self.config = optim_config
  or ActorConfig()``, ``cfg = self.config``), or is annotated with the section class
  (``model_config: ModelConfig``, ``config: Optional[RolloutConfig]``).

Reading ``f`` off anything else does not count (``getattr`` with a string neither), so a field
name that happens to be an attribute elsewhere (``seed``, ``path``) does not hide an unread field.
"""
import ast
import dataclasses
import functools
import typing

import pytest

from mempo.config import MempoConfig
from support.paths import REPO

PACKAGE = REPO / "mempo"
CONFIG_PACKAGE = PACKAGE / "config"
SECTIONS = {f.name: typing.get_type_hints(MempoConfig)[f.name] for f in dataclasses.fields(MempoConfig)}
CLASS_TO_SECTION = {cls.__name__: name for name, cls in SECTIONS.items()}


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _section_of_value(node, typed=None):
    """The section an expression evaluates to, when its form says so (`typed`: names known so far)."""
    typed = typed or {}
    if isinstance(node, ast.Attribute) and node.attr in SECTIONS:
        return node.attr
    if _dotted(node) in typed:
        return typed[_dotted(node)]
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        return CLASS_TO_SECTION.get(name)
    values = node.values if isinstance(node, ast.BoolOp) else (node.body, node.orelse) \
        if isinstance(node, ast.IfExp) else ()
    for value in values:
        section = _section_of_value(value, typed)
        if section is not None:
            return section
    return None


def _section_of_annotation(node):
    if node is None:
        return None
    for part in ast.walk(node):
        name = part.id if isinstance(part, ast.Name) else part.value if isinstance(part, ast.Constant) else None
        if isinstance(name, str):
            for cls_name, section in CLASS_TO_SECTION.items():
                if cls_name == name or cls_name in name.split("[")[0].split("."):
                    return section
    return None


def consumed_fields(source: str) -> set[tuple[str, str]]:
    """``{(section, field)}`` read in one module's source (module docstring)."""
    tree = ast.parse(source)
    typed: dict[str, str] = {}  # dotted name -> section
    for node in ast.walk(tree):  # annotated arguments first: assignments may name them
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs:
                section = _section_of_annotation(arg.annotation)
                if section is not None:
                    typed[arg.arg] = section
    known = -1
    while known != len(typed):  # until no assignment types another name (``cfg = self.config`` chains)
        known = len(typed)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                section = _section_of_value(node.value, typed)
                if section is not None:
                    for target in node.targets:
                        if _dotted(target) is not None:
                            typed.setdefault(_dotted(target), section)
            elif isinstance(node, ast.AnnAssign) and _dotted(node.target) is not None:
                section = _section_of_annotation(node.annotation) or (
                    _section_of_value(node.value, typed) if node.value is not None else None)
                if section is not None:
                    typed.setdefault(_dotted(node.target), section)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr in SECTIONS:
            found.add((value.attr, node.attr))
        dotted = _dotted(value)
        if dotted in typed:
            found.add((typed[dotted], node.attr))
    return found


@functools.lru_cache(maxsize=None)
def _all_consumed() -> frozenset:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if CONFIG_PACKAGE not in path.parents:
            found |= consumed_fields(path.read_text(encoding="utf-8"))
    return frozenset(found)


def test_the_analysis_tells_a_read_field_from_an_unread_one():
    source = '''
def f(cfg, model_config: ModelConfig, other):
    r = cfg.rollout
    use(r.seed, cfg.actor.lr, model_config.dtype, other.chat_template)
    self.config = opts or ActorConfig()
    use(self.config.beta1, getattr(cfg.eval, "episodes"))

class Engine:
    def run(self):
        c = self.settings
        use(c.tool_workers, self.other.score_mode)

    def __init__(self, settings: Optional[RolloutConfig] = None):
        self.settings = settings if settings is not None else RolloutConfig()
        use(cfg.synthetic.model_seed)
'''
    assert consumed_fields(source) == {("rollout", "seed"), ("actor", "lr"), ("model", "dtype"), ("actor", "beta1"),
                                       ("rollout", "tool_workers"), ("synthetic", "model_seed")}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_config_field_is_read_somewhere(section):
    consumed = _all_consumed()
    unread = [f.name for f in dataclasses.fields(SECTIONS[section]) if (section, f.name) not in consumed]
    assert not unread, (f"{section}: fields validated but read by no module of mempo/ (outside "
                        f"mempo/config/): {unread}")
