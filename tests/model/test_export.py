"""mempo.model.export: the final model directory is whole, also when written under torchrun, and a
streamed one (the SGLang server's weight versions) is written one file at a time.

Under torchrun the actor is FSDP2-sharded; `export_model` gathers the full weights and rank 0
writes them. The 2-process run (gloo) is compared with one process on all rows (the same update,
tests/train/test_actor.py): its written weights load back equal to the shards every rank trained, hold
as many elements as the model has parameters, and equal the 1-process run's weights.
"""
import json

import pytest
import torch

from support.dist import torchrun
from support.dist_export_worker import run
from support.paths import SUPPORT
from mempo.model.export import PROVENANCE_FILE, export_model, full_state_dict, save_model_dir, save_streamed_model_dir
from mempo.utils.atomic import OutputPathError

WORKER = SUPPORT / "dist_export_worker.py"


def test_two_process_export_holds_the_full_trained_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    torchrun(WORKER, tmp_path / "two", what="the 2-process export run")
    two = json.loads((tmp_path / "two" / "result.json").read_text())
    one = run(tmp_path / "one")
    assert two["world"] == 2 and one["world"] == 1
    assert two["mismatched"] == [[], []] and one["mismatched"] == [[]]
    assert two["elements"] == two["parameters"] == one["elements"]
    assert json.loads((tmp_path / "two" / "model" / PROVENANCE_FILE).read_text()) == {"rows": 6}
    a = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "model").named_parameters())
    b = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "model").named_parameters())
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=1e-4, msg=name)


def test_export_keeps_tied_weights_tied_and_replaces_only_its_own_directory(tmp_path):
    """A directory mempo wrote is replaced whole; one holding anything else (a file someone added)
    is refused and left as it was."""
    from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
    from mempo.model.loading import load_model_dir

    tok = train_tokenizer(default_corpus_texts(), 300)
    model = tiny_model(tok, seed=0, tie_word_embeddings=True)
    save_model_dir(tmp_path / "m", model, None, provenance={"from": "an older export"})
    assert export_model(model, tok, tmp_path / "m") == tmp_path / "m"
    assert not (tmp_path / "m" / PROVENANCE_FILE).exists()  # the older export was replaced whole
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(OutputPathError, match="notes.txt, which mempo did not write"):
        export_model(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"
    (tmp_path / "m" / "notes.txt").unlink()
    loaded, _ = load_model_dir(tmp_path / "m")
    assert loaded.config.tie_word_embeddings
    assert loaded.get_output_embeddings().weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    for (name, p), q in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(p, q), name
    weights = full_state_dict(model)
    assert weights.keys() == model.state_dict().keys()
    save_model_dir(tmp_path / "again", model, None, state_dict=weights)
    assert not (tmp_path / "again" / PROVENANCE_FILE).exists()


def test_a_streamed_model_dir_is_written_one_file_at_a_time_and_loads_whole(tmp_path):
    """`save_streamed_model_dir` (the SGLang server backend's weight versions): the files are written
    while the stream is still being read (never the whole state held), the tied head is left out,
    and the directory loads back to the same weights, as one file or as an index of several."""
    from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
    from mempo.model.loading import load_model_dir

    tok = train_tokenizer(default_corpus_texts(), 300)
    model = tiny_model(tok, seed=0, tie_word_embeddings=True)
    state = model.state_dict()
    total = sum(t.numel() * t.element_size() for name, t in state.items() if name != "lm_head.weight")
    on_disk, read = [], []

    def stream():
        for name, tensor in state.items():
            on_disk.append(len([p for p in tmp_path.rglob("*") if p.name.startswith("part-")]))
            read.append(name)
            yield name, tensor

    written = save_streamed_model_dir(tmp_path / "several", model, stream(), tok, max_file_bytes=total // 5)
    assert read == list(state)  # the whole stream consumed
    index = json.loads((written / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 5 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert "lm_head.weight" not in index["weight_map"] and index["metadata"]["total_size"] == total
    assert on_disk[-1] >= len(files) - 2  # by the last tensor, all but the current file were on disk
    single = save_streamed_model_dir(tmp_path / "one", model, iter(state.items()), tok)
    assert [p.name for p in single.glob("*.safetensors")] == ["model.safetensors"]
    for directory in (written, single):
        loaded, _ = load_model_dir(directory)
        assert loaded.config.tie_word_embeddings
        assert loaded.get_output_embeddings().weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
        for name, tensor in state.items():
            assert torch.equal(loaded.state_dict()[name], tensor), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind
