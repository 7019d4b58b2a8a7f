"""Small shared type aliases."""
from __future__ import annotations

import os
from typing import Union

__all__ = ["PathLike"]

#: a filesystem path as every mempo function accepts it
PathLike = Union[str, "os.PathLike[str]"]
