"""mempo.train.export and `mempo export`: a Hugging Face directory streamed from a sharded
checkpoint, one safetensors file at a time, that `from_pretrained` loads with the checkpoint's
exact weights (tied or untied head; several files with an index; bf16 on request)."""
import json

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from mempo.apps.cli import main  # noqa: E402
from mempo.config import dump_config, load_config  # noqa: E402
from mempo.model.loading import build_causal_lm  # noqa: E402
from mempo.train.checkpoint import save_checkpoint  # noqa: E402
from mempo.train.export import export_checkpoint  # noqa: E402
from mempo.train.sharded import CheckpointError  # noqa: E402
from support.paths import REPO  # noqa: E402


def _saved(tmp_path, *overrides):
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["model.vocab_size=300", *overrides])
    torch.manual_seed(0)
    model = build_causal_lm(cfg.model)
    save_checkpoint(tmp_path / "run" / "checkpoints", 3, model)
    dump_config(cfg, tmp_path / "run" / "config.yaml")
    return cfg, model


def test_a_multi_file_export_loads_the_exact_weights(tmp_path):
    cfg, model = _saved(tmp_path)
    out = export_checkpoint(tmp_path / "run" / "checkpoints", tmp_path / "hf", cfg, max_shard_bytes=40_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and all((out / f).is_file() for f in files)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    half = export_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000003", tmp_path / "hf16", cfg,
                             dtype="bfloat16")
    assert (half / "model.safetensors").is_file() and not (half / "model.safetensors.index.json").exists()
    loaded16 = AutoModelForCausalLM.from_pretrained(half)
    assert loaded16.dtype == torch.bfloat16
    assert torch.equal(loaded16.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))


def test_the_command_exports_a_run_with_its_config(tmp_path, capsys):
    _, model = _saved(tmp_path)
    assert main(["export", "--checkpoint", str(tmp_path / "run" / "checkpoints"), "--out", str(tmp_path / "m")]) == 0
    assert "wrote" in capsys.readouterr().out
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert main(["export", "--checkpoint", str(tmp_path / "nowhere" / "checkpoints"),
                 "--out", str(tmp_path / "x")]) == 2


def test_another_architecture_is_refused(tmp_path):
    cfg, _ = _saved(tmp_path)
    wider = load_config(REPO / "configs" / "tiny.yaml", ["model.vocab_size=300", "model.hidden_size=128"])
    with pytest.raises(CheckpointError, match=r"has shape .*model.path is builtin-tiny: give the config of the model"):
        export_checkpoint(tmp_path / "run" / "checkpoints", tmp_path / "bad", wider)
    assert not (tmp_path / "bad").exists()


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_out_never_deletes_what_export_did_not_write(tmp_path, capsys, monkeypatch):
    """Issue 47 (E02-E05, E15): ``--out`` the run directory, its checkpoints, a folder inside the
    checkpoint, a user's folder, an existing file, ``.`` or a path under a file: one line, exit 2,
    nothing touched. The old command exited 0 after deleting the run directory or every checkpoint,
    turned the file into a directory, and raised tracebacks for the last two."""
    _saved(tmp_path)
    run = tmp_path / "run"
    (run / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "afile.txt").write_text("keep me")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me too")
    before = _listing(tmp_path)
    checkpoints = run / "checkpoints"
    step = checkpoints / "step_00000003"
    monkeypatch.chdir(tmp_path)
    cases = [(checkpoints, run, "holds"), (step, checkpoints, "is"), (step, step / "hf", "lies inside"),
             (checkpoints, tmp_path / "mine", "is a directory mempo did not write"),
             (checkpoints, tmp_path / "afile.txt", "exists and is not a directory"),
             (checkpoints, ".", "is the working directory"),
             (checkpoints, run / "config.yaml" / "model", "cannot be made")]
    for checkpoint, out, expected in cases:
        assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out)]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mempo export: --out: ") and expected in err[0], (out, err)
    assert _listing(tmp_path) == before
    assert (tmp_path / "afile.txt").read_text() == "keep me"


def test_out_replaces_an_earlier_export_and_bounds_the_shard_size(tmp_path, capsys):
    _saved(tmp_path)
    checkpoint = str(tmp_path / "run" / "checkpoints")
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", checkpoint, "--out", str(out), "--dtype", "bfloat16"]) == 0
    assert main(["export", "--checkpoint", checkpoint, "--out", str(out)]) == 0  # its own: replaced
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.float32
    (out / "notes.txt").write_text("added by hand")
    assert main(["export", "--checkpoint", checkpoint, "--out", str(out)]) == 2
    assert "notes.txt, which mempo did not write there" in capsys.readouterr().err
    assert main(["export", "--checkpoint", checkpoint, "--out", str(tmp_path / "hf2"), "--max-shard-size",
                 "1e400GB"]) == 2  # E10: int(inf) raised OverflowError
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mempo export: --max-shard-size: '1e400GB' is larger than"), err
