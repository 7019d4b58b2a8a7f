"""How mempo's modules import each other, read from the source (ast) of every module of mempo/ and
kernels/ (installed as `mempo.kernels`), counting every import (module level and inside functions):

* every module imports;
* no import cycle among mempo modules, and none among its packages and top-level modules (*units*:
  ``mempo.<name>``, a package with all its modules or one top-level module);
* the layers (`LAYERS`, docs/ARCHITECTURE.md): every unit has a layer and imports only units of
  lower layers (so no library unit imports `mempo.apps`);
* an import inside a function is a heavy optional dependency (or, from `mempo.ops`, the Triton
  kernels; from a command module of `mempo.apps`, the library it runs) and says why in a
  ``# reason:`` comment on its line or on the line above its group of imports.
"""
import ast
import importlib
from pathlib import Path
from typing import NamedTuple

from support.paths import REPO

#: the units of mempo, bottom to top: a unit imports only units of lower layers (and the `mempo` root
#: package). A unit listed here but absent from the tree is skipped; every unit of the tree must be listed.
LAYERS = (
    ("mempo.errors",),
    ("mempo.utils",),
    ("mempo.seeds", "mempo.protocol", "mempo.kernels", "mempo._scanner"),  # _scanner: the compiled C++ scanner
    ("mempo.config", "mempo.ops", "mempo.tools"),  # tools: the public tool interface
    ("mempo.records",),  # the trajectory, round and scoring records
    ("mempo.algo", "mempo.env"),
    ("mempo.model",),
    ("mempo.rollout",),
    ("mempo.scoring", "mempo.synthetic"),  # synthetic: the demo's world, its oracle agent and backend
    ("mempo.eval",),
    ("mempo.train", "mempo.serve"),  # serve: the trained agent behind an OpenAI-compatible API
    ("mempo.integrations",),
    ("mempo.apps",),
    ("mempo.__main__",),
)
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
#: what a function may import lazily: a heavy optional dependency, by top-level name.
HEAVY_OPTIONAL = {"sglang", "verl", "fastapi", "uvicorn", "pydantic", "starlette", "matplotlib", "rich", "wandb",
                  "tensorboard", "faiss", "sentence_transformers", "pyarrow", "bm25s", "numpy", "transformers"}
LAZY_SUBMODULES = {"torch.utils.tensorboard"}  # torch's optional tensorboard writer
#: importer package -> what else it may import inside a function
LAZY_ALLOWED = {
    "mempo.ops": ("mempo.kernels",),  # `import mempo.ops` stays without triton
    "mempo.apps": ("mempo", "torch"),  # the command modules: `mempo --help` imports no library
    # the verl checker: its modules that import verl come after `import verl` failing is reported in one line
    "mempo.integrations.verl.__main__": ("mempo.integrations.verl",),
}


class Import(NamedTuple):
    importer: str
    target: str  # a mempo module name, or the dotted name of another module
    line: int
    in_function: bool
    reason: bool


def _modules() -> dict[str, Path]:
    found = {}
    for root, prefix in ((REPO / "mempo", ("mempo",)), (REPO / "kernels", ("mempo", "kernels"))):
        for path in sorted(root.rglob("*.py")):
            parts = prefix + path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _unit(module: str) -> str:
    """``mempo.<name>`` of a mempo module (its package or top-level module); "mempo" for the root."""
    return ".".join(module.split(".")[:2])


def _has_reason(lines: list[str], lineno: int) -> bool:
    """A ``# reason:`` comment on the import's line, or above the group of imports it belongs to."""
    if "# reason:" in lines[lineno - 1]:
        return True
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].strip().startswith("# reason:")


def _imports(name: str, path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []

    def resolve(module: str) -> str:
        while module not in MODULES and "." in module and module.startswith("mempo."):
            module = module.rsplit(".", 1)[0]
        return module

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                else:
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")[:len(package.split(".")) - child.level + 1]
                        base = ".".join(parts + ([base] if base else []))
                    # ``from package import submodule`` imports the submodule
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
                for target in targets:
                    found.append(Import(name, resolve(target), child.lineno, in_function,
                                        _has_reason(lines, child.lineno)))
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _graph() -> dict[str, set[str]]:
    return {name: {i.target for i in found if i.target in MODULES and i.target != name}
            for name, found in IMPORTS.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, components, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_every_module_imports():
    failed = {}
    for name in MODULES:
        if name == "mempo.__main__":  # runs the CLI
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if not (error.name or "").startswith("mempo") and error.name.split(".")[0] in HEAVY_OPTIONAL:
                continue  # an optional dependency this environment lacks
            failed[name] = repr(error)
        except Exception as error:  # noqa: BLE001  (reported, with the module)
            failed[name] = repr(error)
    assert not failed, failed


def test_the_walk_sees_the_package():
    """Guards the checks below against reading nothing: the modules and known edges are there."""
    assert len(MODULES) > 60 and "mempo.kernels.answer_logprob" in MODULES and "mempo.apps.cli" in MODULES
    graph = _graph()
    assert "mempo.ops.advantage" in graph["mempo.algo.advantages"]
    assert "mempo.kernels.group_zscore" in graph["mempo.ops.advantage"]  # a lazy (function-level) edge
    assert "mempo.env.retriever" in graph["mempo.env.client"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def _unit_graph() -> dict[str, set[str]]:
    """unit -> the other units its modules import."""
    graph: dict[str, set[str]] = {}
    for name, found in IMPORTS.items():
        targets = graph.setdefault(_unit(name), set())
        targets.update(_unit(i.target) for i in found if _within(i.target, ("mempo",)) and i.target != "mempo")
        targets.discard(_unit(name))
    return graph


def test_every_unit_has_a_layer():
    units = {_unit(name) for name in MODULES} - {"mempo"}
    assert "mempo.records" in units and "mempo.apps" in units
    assert sorted(units - set(LAYER)) == []


def test_no_package_level_cycles():
    """No two units import each other, directly or through others."""
    graph = _unit_graph()
    assert _cycles(graph) == []
    mutual = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if a < b and a in graph.get(b, ()))
    assert mutual == []


def test_every_unit_imports_only_lower_layers():
    offending = []
    for name, found in IMPORTS.items():
        unit = _unit(name)
        for i in found:
            target = _unit(i.target)
            if not _within(i.target, ("mempo",)) or i.target == "mempo" or target == unit:
                continue
            if target not in LAYER or unit not in LAYER or LAYER[target] >= LAYER[unit]:
                offending.append(f"{name}:{i.line} imports {i.target}")
    assert offending == []


def test_function_level_imports_are_heavy_optional_dependencies_with_a_reason():
    offending = []
    for name, found in IMPORTS.items():
        for i in found:
            if not i.in_function:
                continue
            extra = next((allowed for package, allowed in LAZY_ALLOWED.items() if _within(name, (package,))), ())
            ok_target = (i.target.split(".")[0] in HEAVY_OPTIONAL or _within(i.target, tuple(LAZY_SUBMODULES))
                         or _within(i.target, extra))
            if not ok_target:
                offending.append(f"{name}:{i.line} imports {i.target} inside a function")
            elif not i.reason:
                offending.append(f"{name}:{i.line} imports {i.target} inside a function without a '# reason:'")
    assert offending == []


def test_no_lazy_package_attributes():
    """Names resolve by plain imports: no package of mempo defines a module ``__getattr__``."""
    lazy = [name for name, path in MODULES.items() if path.name == "__init__.py"
            and any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                    for n in ast.parse(path.read_text(encoding="utf-8")).body)]
    assert lazy == []
