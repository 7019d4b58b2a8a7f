"""File digests: the SHA-256 that checkpoint manifests, index manifests and corpus fingerprints record, and
the digest of a saved model's weights (`weights_digest`) that benchmarks and the demo's report name a model by."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from mempo.utils.types import PathLike

__all__ = ["sha256_file", "weights_digest"]

_CHUNK_BYTES = 1 << 20  # read 1 MiB at a time: the file never needs to fit in memory


def sha256_file(path: PathLike) -> str:
    """The SHA-256 of the file's bytes, as 64 lowercase hex digits (OSError when it cannot be read)."""
    digest = hashlib.sha256()
    _feed(digest, path)
    return digest.hexdigest()


def weights_digest(model_dir: PathLike) -> str:
    """SHA-256 (64 hex digits) over the names and bytes of a saved model directory's weight files
    (``*.safetensors`` / ``*.bin``, in name order): two directories with the same weights have the same
    digest, whatever else they hold. ValueError when the directory holds no weight file."""
    root = Path(model_dir)
    files = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".bin")) if root.is_dir() else []
    if not files:
        raise ValueError(f"{root}: no weight files (*.safetensors, *.bin); is it a saved model directory?")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        _feed(digest, path)
    return digest.hexdigest()


def _feed(digest: Any, path: PathLike) -> None:
    """Update `digest` with the file's bytes, read in `_CHUNK_BYTES` pieces."""
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
