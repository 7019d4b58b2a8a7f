"""mempo.model.loading: loading a model runs no code from its files (issue 47). Weights are read
from safetensors; a directory with only a pickled ``pytorch_model.bin`` is refused by name unless
``model.allow_pickle_weights`` admits it, and then torch's weights-only unpickler reads it, so a
planted payload runs in no loader (the marker file never appears); no model's own code is run,
not even when transformers would have asked and the answer were yes."""
import builtins
import json
import shutil

import pytest
import torch

import mempo.apps.cli
from mempo.config import ConfigError, ModelConfig
from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
from mempo.model.export import save_model_dir
from mempo.model.loading import build_causal_lm, load_model_dir
from support.checkpoints import torch_payload
from support.paths import REPO

TINY = REPO / "configs" / "tiny.yaml"
SMALL = ["synthetic.world_entities=40", "eval.episodes=2", "trainer.tensorboard=false", "trainer.progress=false"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny model directory (safetensors) and its weights."""
    tokenizer = train_tokenizer(default_corpus_texts(None), vocab_size=300)
    model = tiny_model(tokenizer, seed=0)
    directory = tmp_path_factory.mktemp("models") / "safe"
    save_model_dir(directory, model, tokenizer)
    return directory, {k: v.clone() for k, v in model.state_dict().items()}


def _pickled(saved, tmp_path, weights):
    """The saved directory with its safetensors file replaced by a pickled ``pytorch_model.bin``."""
    directory = tmp_path / "pickled"
    shutil.copytree(saved[0], directory)
    (directory / "model.safetensors").unlink()
    if isinstance(weights, bytes):
        (directory / "pytorch_model.bin").write_bytes(weights)
    else:
        torch.save(weights, directory / "pytorch_model.bin")
    return directory


def test_a_pickled_payload_is_refused_by_every_load_and_runs_nowhere(saved, tmp_path):
    marker = tmp_path / "PWNED"
    directory = _pickled(saved, tmp_path, torch_payload(marker))
    with pytest.raises(ConfigError, match=r"^--model: .*pickled holds pickled weights only \(pytorch_model\.bin\); "
                                          r"mempo reads safetensors.*model\.allow_pickle_weights=true"):
        load_model_dir(directory)
    with pytest.raises(ConfigError, match=r"^model\.path: .*holds pickled weights only \(pytorch_model\.bin\)"):
        build_causal_lm(ModelConfig(path=str(directory)))
    # admitted, the pickle is still read by the weights-only unpickler: refused, naming the global
    with pytest.raises(ConfigError, match=r"^--model: cannot load the model .*\(UnpicklingError: it names getattr, "
                                          r"which torch's weights-only loader refuses"):
        load_model_dir(directory, allow_pickle_weights=True)
    with pytest.raises(ConfigError, match=r"^model\.path: cannot load the model .*weights-only loader refuses"):
        build_causal_lm(ModelConfig(path=str(directory), allow_pickle_weights=True))
    assert not marker.exists()
    torch.load(directory / "pytorch_model.bin", weights_only=False)  # the payload is live
    assert marker.exists()


def test_pickled_weights_load_only_when_allowed(saved, tmp_path):
    directory = _pickled(saved, tmp_path, saved[1])
    with pytest.raises(ConfigError, match="holds pickled weights only"):
        load_model_dir(directory)
    model, _ = load_model_dir(directory, allow_pickle_weights=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved[1].items())
    model = build_causal_lm(ModelConfig(path=str(directory), allow_pickle_weights=True))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved[1].items())
    model, _ = load_model_dir(saved[0])  # safetensors: as always
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved[1].items())


def _cli_cases(directory, tmp_path):
    config = ["--config", str(TINY)]
    return {
        "eval": ["eval", "--model", str(directory), "--out", str(tmp_path / "eval"), *config, *SMALL],
        "ask": ["ask", "who?", *SMALL, "--model", str(directory), *config],  # positionals together
        "serve": ["serve", "--model", str(directory), "--port", "0", *config, *SMALL],
        "train": ["train", *config, "--out", str(tmp_path / "train"), f"model.path={directory}", *SMALL],
        "sft": ["sft", *config, "--out", str(tmp_path / "sft"), f"model.path={directory}", *SMALL],
    }


@pytest.mark.parametrize("command", ["eval", "ask", "serve", "train", "sft"])
def test_every_command_refuses_a_pickled_model_in_one_line(saved, tmp_path, capsys, command):
    """`mempo eval / ask / serve` (--model) and `mempo train / sft` (model.path) on a directory whose
    weights are a planted pickle: one line naming the setting, exit 2, and no code ran; with
    ``model.allow_pickle_weights=true`` too (the weights-only unpickler refuses it)."""
    marker = tmp_path / "PWNED"
    directory = _pickled(saved, tmp_path, torch_payload(marker))
    argv = _cli_cases(directory, tmp_path)[command]
    field = "--model" if command in ("eval", "ask", "serve") else "model.path"
    for extra, said in (([], "holds pickled weights only (pytorch_model.bin)"),
                        (["model.allow_pickle_weights=true"], "which torch's weights-only loader refuses")):
        capsys.readouterr()
        at = argv.index("--model") if command == "ask" else len(argv)  # ask: after the question
        assert mempo.apps.cli.main(argv[:at] + extra + argv[at:]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mempo ")]
        assert len(err) == 1 and err[0].startswith(f"mempo {command}: {field}: ") and said in err[0], err
        assert not marker.exists()


def _with_own_code(saved, tmp_path, marker):
    """The saved directory claiming a model type of its own, whose code (configuration_evil.py,
    named in config.json's auto_map) makes `marker` when imported."""
    directory = tmp_path / "own_code"
    shutil.copytree(saved[0], directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(model_type="evil_qwen", auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                   "AutoModelForCausalLM": "configuration_evil.EvilModel"})
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "configuration_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n"
        "class EvilConfig(Qwen2Config):\n    model_type = 'evil_qwen'\n"
        "class EvilModel(Qwen2ForCausalLM):\n    config_class = EvilConfig\n")
    return directory


def test_a_models_own_code_is_never_run_even_if_the_answer_were_yes(saved, tmp_path, monkeypatch):
    """transformers asks on a terminal whether to run a model's own code when trust_remote_code is
    left unset; mempo sets it off, so nothing asks and nothing runs (here every question would be
    answered "y")."""
    marker = tmp_path / "PWNED"
    directory = _with_own_code(saved, tmp_path, marker)
    asked = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "y")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    for load in (lambda: load_model_dir(directory), lambda: build_causal_lm(ModelConfig(path=str(directory))),
                 lambda: build_causal_lm(ModelConfig(path=str(directory)), on_meta=True)):
        with pytest.raises(ConfigError, match="custom code"):
            load()
    assert asked == [] and not marker.exists()
