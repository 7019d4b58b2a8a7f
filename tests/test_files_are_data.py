"""Loading never runs code from a file (issue 47), read from the source (ast) of every Python file of
mempo/, kernels/, bench/, tools/ and examples/, so that no later change can bring it back:

* nothing unpickles unrestricted: no ``pickle.load`` / ``pickle.loads`` / ``Unpickler`` (nor
  marshal, shelve, dill, cloudpickle, joblib), except the restricted DCP index reader of
  `mempo.train.sharded` (`read_index`, a subclass of the Python unpickler);
* every ``torch.load(...)`` passes ``weights_only=True``; nothing widens what that loader admits
  (``torch.serialization.add_safe_globals`` / ``safe_globals``); ``np.load`` never with
  ``allow_pickle=True``; YAML only through safe loaders;
* every ``from_pretrained`` is called in `mempo.model.loading`, the one module that names
  ``trust_remote_code``, and only to turn it off.
"""
import ast

from support.paths import REPO

ROOTS = ("mempo", "kernels", "bench", "tools", "examples")
RESTRICTED_READER = "mempo/train/sharded.py"
LOADING = "mempo/model/loading.py"
UNSAFE_MODULES = {"marshal", "shelve", "dill", "cloudpickle", "joblib"}


def _files():
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(encoding="utf-8"), str(path))


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _keyword(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node):
    return isinstance(node, ast.Constant) and node.value is True


def test_the_package_tree_is_there():
    names = [name for name, _ in _files()]
    assert RESTRICTED_READER in names and LOADING in names and len(names) > 100


def test_nothing_unpickles_unrestricted():
    found = []
    for name, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{name}:{node.lineno}: imports {m}" for m in modules if m.split(".")[0] in UNSAFE_MODULES]
                if isinstance(node, ast.ImportFrom) and node.module == "pickle":
                    found.append(f"{name}:{node.lineno}: from pickle import ...")
            dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
            if dotted in ("pickle.load", "pickle.loads", "pickle.Unpickler", "pickle._Unpickler", "pickle._loads",
                          "pickle._load"):
                if not (name == RESTRICTED_READER and dotted == "pickle._Unpickler"):
                    found.append(f"{name}:{node.lineno}: {dotted}")
    assert found == []


def test_the_restricted_reader_is_the_one_unpickler_and_resolves_only_its_table():
    tree = dict(_files())[RESTRICTED_READER]
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    reader = classes["_IndexUnpickler"]
    assert [_dotted(base) for base in reader.bases] == ["pickle._Unpickler"]
    methods = {node.name for node in reader.body if isinstance(node, ast.FunctionDef)}
    assert {"find_class", "persistent_load", "_load_build"} <= methods


def test_every_torch_load_is_weights_only():
    found = []
    for name, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = _dotted(node.func)
                if called == "torch.load" and not _is_true(_keyword(node, "weights_only")):
                    found.append(f"{name}:{node.lineno}: torch.load without weights_only=True")
                if called in ("np.load", "numpy.load") and _keyword(node, "allow_pickle") is not None \
                        and not (isinstance(_keyword(node, "allow_pickle"), ast.Constant)
                                 and _keyword(node, "allow_pickle").value is False):
                    found.append(f"{name}:{node.lineno}: np.load with allow_pickle")
                if called in ("yaml.load", "yaml.load_all") and "Safe" not in ast.unparse(_keyword(node, "Loader")
                                                                                         or ast.Constant(None)) \
                        and name != "mempo/config/loader.py":
                    found.append(f"{name}:{node.lineno}: yaml.load without a safe loader")
            dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
            if dotted and dotted.endswith(("add_safe_globals", "serialization.safe_globals", "yaml.unsafe_load",
                                           "yaml.full_load", "yaml.UnsafeLoader", "yaml.FullLoader")):
                found.append(f"{name}:{node.lineno}: {dotted}")
    assert found == []


def test_the_yaml_loader_is_a_safe_loader():
    tree = dict(_files())["mempo/config/loader.py"]
    loaders = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _dotted(node.func) == "yaml.load"]
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    for call in loaders:
        loader = _dotted(_keyword(call, "Loader"))
        assert loader == "yaml.SafeLoader" or [_dotted(b) for b in classes[loader].bases] == ["yaml.SafeLoader"]


def test_only_the_loading_module_calls_from_pretrained_and_it_never_runs_repository_code():
    found = []
    for name, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "from_pretrained" and name != LOADING:
                found.append(f"{name}:{node.lineno}: from_pretrained outside {LOADING}")
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                found.append(f"{name}:{node.lineno}: trust_remote_code as a keyword")
            if isinstance(node, ast.Constant) and node.value == "trust_remote_code":
                parent_ok = name == LOADING
                found += [] if parent_ok else [f"{name}:{node.lineno}: names trust_remote_code"]
            if isinstance(node, ast.Name) and "trust_remote_code" in node.id:
                found.append(f"{name}:{node.lineno}: {node.id}")
    assert found == []
    tree = dict(_files())[LOADING]
    settings = [node for node in ast.walk(tree) if isinstance(node, ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == "trust_remote_code" for k in node.keys)]
    assert len(settings) == 1 and [ast.unparse(v) for v in settings[0].values] == ["False"]
    text = (REPO / LOADING).read_text()
    named = text.count('"trust_remote_code": False') + text.count("``trust_remote_code``")
    assert text.count("trust_remote_code") == named
    for path in [p for root in ("configs", "examples") for p in (REPO / root).rglob("*") if p.is_file()]:
        assert "trust_remote_code: true" not in path.read_text(errors="replace").lower().replace("=", ": "), path
