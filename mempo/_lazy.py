"""Lazy package exports: `name -> submodule` tables resolved on first attribute access, so that
importing a package (`mempo.ops`, `mempo.rollout`, `mempo.train`) imports none of its submodules."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """(__all__, __getattr__, __dir__) for `package`, whose attribute `name` lives in
    `package.<exports[name]>`; a resolved attribute is cached in the package's `namespace`."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return sorted(exports), __getattr__, __dir__
