"""File digests: the SHA-256 that checkpoint manifests, index manifests and corpus fingerprints record."""
from __future__ import annotations

import hashlib

from mempo.utils.types import PathLike

__all__ = ["sha256_file"]

_CHUNK_BYTES = 1 << 20  # read 1 MiB at a time: the file never needs to fit in memory


def sha256_file(path: PathLike) -> str:
    """The SHA-256 of the file's bytes, as 64 lowercase hex digits (OSError when it cannot be read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()
