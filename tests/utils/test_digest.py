"""mempo.utils.digest: file and model-weights digests."""
import hashlib

import pytest

from mempo.utils.digest import sha256_file, weights_digest


def test_sha256_file_is_the_bytes_sha256(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"mempo" * 100_000)  # several read chunks
    assert sha256_file(path) == hashlib.sha256(b"mempo" * 100_000).hexdigest()


def test_weights_digest_names_the_weights_only(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for root in (one, two):
        root.mkdir()
        (root / "model.safetensors").write_bytes(b"weights")
    (two / "config.json").write_text("{}")  # other files do not count
    assert weights_digest(one) == weights_digest(two)
    assert len(weights_digest(one)) == 64 and int(weights_digest(one), 16) >= 0
    (two / "model.safetensors").write_bytes(b"weightz")
    assert weights_digest(one) != weights_digest(two)
    # the file name is part of it: the same bytes under another weight file name are another model layout
    (two / "model.safetensors").rename(two / "pytorch_model.bin")
    (two / "pytorch_model.bin").write_bytes(b"weights")
    assert weights_digest(one) != weights_digest(two)


@pytest.mark.parametrize("make", ["empty", "missing", "file"])
def test_weights_digest_refuses_what_is_no_model_directory(tmp_path, make):
    target = tmp_path / "model"
    if make == "empty":
        target.mkdir()
        (target / "config.json").write_text("{}")
    elif make == "file":
        target.write_text("not a directory")
    with pytest.raises(ValueError, match="no weight files"):
        weights_digest(target)
