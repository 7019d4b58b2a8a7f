"""A small string-keyed registry (retrievers, tools, CLI commands, generation backends).

Registering a name twice with a different object is an error (as verl's `register_adv_est`);
looking up an unknown name raises ValueError listing what is registered.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator


class Registry:
    """name -> factory, for one kind of thing (`kind` names it in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: register the decorated factory under `name`."""
        def decorate(factory: Any) -> Any:
            self.add(name, factory)
            return factory
        return decorate

    def add(self, name: str, factory: Any) -> None:
        if name in self._items and self._items[name] is not factory:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = factory

    def get(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
