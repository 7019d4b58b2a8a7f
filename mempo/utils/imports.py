"""Objects named by import path (``"package.module:name"``), as configs name a user's tools and rewards."""
from __future__ import annotations

import importlib
import re
from typing import Any

__all__ = ["is_import_path", "load_object"]

_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def is_import_path(text: Any) -> bool:
    """Whether `text` has the form ``"package.module:name"`` (a dotted module, a colon, a dotted attribute)."""
    return isinstance(text, str) and _PATH.fullmatch(text.strip()) is not None


def load_object(path: str) -> Any:
    """The object ``"package.module:name"`` names (``name`` may be dotted: ``module:Class.attr``).

    ValueError with one line saying what is wrong: not of that form, the module cannot be imported (its
    own error, e.g. a missing dependency or a syntax error in it, on that line), or it has no such
    attribute."""
    if not is_import_path(path):
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:name'")
    module_name, _, attribute = path.strip().partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # reason: any error of the user's module is reported as one line
        detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise ValueError(f"{path!r}: cannot import {module_name!r} ({detail})") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{path!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target
