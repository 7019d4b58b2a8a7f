"""mempo.train.sharded: sharded (DCP) checkpoints that reshard. A checkpoint written by 1 process
loads exactly on 2 FSDP2 ranks (gloo), one written by 2 ranks loads exactly in 1 process and on 4
ranks (marked slow): the same parameters and AdamW state (moments, step, hyperparameters), bit
for bit. A background checkpoint started on 2 ranks before an update (its writes overlapping the
update's collectives) holds the state of its start. Also:
each rank hashes its own shard files into the manifest; streaming reads of a few tensors; format-2
(full-state model.pt) checkpoints still load."""
import json
import re
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from support.dist import torchrun  # noqa: E402
from support.paths import SUPPORT  # noqa: E402
from support.reshard_worker import run  # noqa: E402

from mempo.train import checkpoint as ckpt  # noqa: E402
from mempo.train.sharded import owner_rank, read_tensors, tensor_specs  # noqa: E402

WORKER = SUPPORT / "reshard_worker.py"


def _job(directory, **job):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "job.json").write_text(json.dumps({k: str(v) if v is not None else None for k, v in job.items()}))
    return directory


def _compared(directory, world):
    result = json.loads((directory / "compare.json").read_text())
    assert result["world"] == world and result["compared"] > 20
    assert result["different"] == []


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory):
    """1 process: one update, saved (world size 1), its full state kept; then 2 ranks load it,
    compare (1 -> 2), start a background checkpoint (``ckpt_background``), take one more update,
    publish that one and save (world size 2): (directory, its full state)."""
    tmp_path = tmp_path_factory.mktemp("reshard")
    one = _job(tmp_path / "one", train=True, save=tmp_path / "ckpt1", save_full=tmp_path / "full1.pt")
    run(one)
    two = _job(tmp_path / "two", load=tmp_path / "ckpt1", expect=tmp_path / "full1.pt",
               save_background=tmp_path / "ckpt_background", train=True, save=tmp_path / "ckpt2",
               save_full=tmp_path / "full2.pt")
    torchrun(WORKER, two, nproc=2, what="the 2-rank load-train-save leg")
    return two, tmp_path / "ckpt2", tmp_path / "full2.pt"


def test_a_checkpoint_reshards_1_to_2_and_2_to_1_exactly(two_rank_checkpoint, tmp_path):
    two, ckpt2, full2 = two_rank_checkpoint
    initial = json.loads((two / "initial.json").read_text())  # built on meta, shards from rank 0: exact
    assert initial["same"] == initial["of"] > 10 and initial["buffers"] == 2  # the rotary inv_freq pair
    _compared(two, 2)  # 1 -> 2
    manifest = json.loads((ckpt2 / "step_00000001" / "COMPLETE").read_text())
    assert manifest["world_size"] == 2
    for folder in ("model", "optimizer"):  # one shard file per rank, each in the manifest
        assert {f"{folder}/__0_0.distcp", f"{folder}/__1_0.distcp", f"{folder}/.metadata"} <= set(manifest["files"])
    assert {"rng/rank_00000.pt", "rng/rank_00001.pt"} <= set(manifest["files"])
    back = _job(tmp_path / "back", load=ckpt2, expect=full2)  # 2 -> 1
    run(back)
    _compared(back, 1)


def test_a_background_checkpoint_on_2_ranks_holds_the_state_of_its_start(two_rank_checkpoint, tmp_path):
    two, _, _ = two_rank_checkpoint
    background = two.parent / "ckpt_background"
    manifest = json.loads((background / "step_00000001" / "COMPLETE").read_text())
    assert manifest["world_size"] == 2 and {"model/__1_0.distcp", "optimizer/__1_0.distcp"} <= set(manifest["files"])
    ckpt.verify_checkpoint(background / "step_00000001")
    # the state it was started from (the loaded step-1 checkpoint), not the one after the update
    start = _job(tmp_path / "start", load=background, expect=two.parent / "full1.pt")
    run(start)
    _compared(start, 1)


@pytest.mark.slow  # 4 torch processes on the 2-core machine: ~40 s
def test_a_2_rank_checkpoint_loads_exactly_on_4_ranks(two_rank_checkpoint, tmp_path):
    _, ckpt2, full2 = two_rank_checkpoint
    four = _job(tmp_path / "four", load=ckpt2, expect=full2)
    torchrun(WORKER, four, nproc=4, timeout=240, what="the 4-rank load leg")
    _compared(four, 4)


def test_each_rank_owns_its_shard_and_rng_files():
    assert owner_rank("model/__3_0.distcp") == 3 and owner_rank("optimizer/__12_0.distcp") == 12
    assert owner_rank("rng/rank_00005.pt") == 5
    assert owner_rank("model/.metadata") == 0 and owner_rank("state.json") == 0
    assert owner_rank("rank_00005.pt") == 0  # only under rng/


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 6)).square().mean().backward()
    optimizer.step()
    return model, optimizer


def test_read_tensors_reads_the_keys_asked_for(tmp_path):
    model, optimizer = _trained()
    path = ckpt.save_checkpoint(tmp_path, 1, model, optimizer)
    specs = tensor_specs(path / "model")
    assert {k: (v.shape, v.dtype) for k, v in specs.items()} == {
        k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    part = read_tensors(path / "model", ["2.weight"], dtype=torch.bfloat16)
    assert list(part) == ["2.weight"] and part["2.weight"].dtype == torch.bfloat16
    assert torch.equal(part["2.weight"], model[2].weight.detach().to(torch.bfloat16))
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        read_tensors(path / "model", ["nope"])


def test_a_format_2_full_state_checkpoint_still_loads(tmp_path):
    """Checkpoints written before the sharded format (model.pt / optimizer.pt, manifest format 2)."""
    from mempo.utils.digest import sha256_file

    model, optimizer = _trained()
    path = tmp_path / "step_00000004"
    (path / "rng").mkdir(parents=True)
    torch.save(model.state_dict(), path / "model.pt")
    full_optim = ckpt.optimizer_state_dict(model, optimizer)
    torch.save(full_optim, path / "optimizer.pt")
    torch.save(ckpt.capture_rng_state(), path / "rng" / "rank_00000.pt")
    (path / "state.json").write_text(json.dumps({"format": 2, "step": 4, "world_size": 1, "data_state": None,
                                                 "extra": None}))
    files = {name: {"bytes": (path / name).stat().st_size, "sha256": sha256_file(path / name)}
             for name in ("model.pt", "optimizer.pt", "rng/rank_00000.pt", "state.json")}
    (path / "COMPLETE").write_text(json.dumps({"format": 2, "step": 4, "world_size": 1, "time": 0.0, "files": files}))
    torch.manual_seed(5)
    fresh = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    assert ckpt.load_checkpoint(tmp_path, fresh, fresh_optimizer).step == 4
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"],
                       optimizer.state_dict()["state"][0]["exp_avg"])
    torch.save({"0.weight": model[0].weight}, path / "model.pt")  # keys checked against the file as before
    files["model.pt"] = {"bytes": (path / "model.pt").stat().st_size, "sha256": sha256_file(path / "model.pt")}
    (path / "COMPLETE").write_text(json.dumps({"format": 2, "step": 4, "world_size": 1, "time": 0.0, "files": files}))
    with pytest.raises(ckpt.CheckpointError, match=r"model.pt: does not fit this model \(missing key"):
        ckpt.load_checkpoint(path, fresh)


def test_resume_verification_is_spread_over_the_ranks(two_rank_checkpoint, tmp_path):
    """2 ranks look for the newest intact checkpoint of a 2-rank checkpoint: each hashes the files
    it owns (rank 1 its shard and RNG files, rank 0 the rest), every file is hashed once; a damaged
    shard of rank 1 is found by rank 1 and both ranks raise the same error naming it."""
    _, root, _ = two_rank_checkpoint
    intact, damaged = tmp_path / "intact", tmp_path / "damaged"
    shutil.copytree(root, intact)
    shutil.copytree(root, damaged)
    step = ckpt.latest_checkpoint(damaged)
    shard = step / ckpt.MODEL_DIR / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = _job(tmp_path / "verify")
    (out / "job.json").write_text(json.dumps({"roots": {"intact": str(intact), "damaged": str(damaged)}}))
    torchrun(SUPPORT / "verify_worker.py", out, nproc=2, what="the 2-rank verification")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    manifest = json.loads((ckpt.latest_checkpoint(intact) / ckpt.COMPLETE_MARKER).read_text())
    for rank, result in enumerate(ranks):
        assert result["intact"]["found"] == str(ckpt.latest_checkpoint(intact)) and result["intact"]["error"] is None
        assert result["intact"]["hashed"] == sorted(f for f in manifest["files"] if owner_rank(f) % 2 == rank)
        assert result["intact"]["hashed"], rank
    assert sorted(ranks[0]["intact"]["hashed"] + ranks[1]["intact"]["hashed"]) == sorted(manifest["files"])
    errors = [result["damaged"]["error"] for result in ranks]
    assert errors[0] == errors[1] and "__1_0.distcp: damaged" in errors[0]
    assert "model/__1_0.distcp" in ranks[1]["damaged"]["hashed"]
    assert "model/__1_0.distcp" not in ranks[0]["damaged"]["hashed"]


# ------------------------------------------------------------------------------------------------
# the index is data: every reader of .metadata unpickles it restricted (issue 47, K18)
# ------------------------------------------------------------------------------------------------
def _qwen_shards(tmp_path):
    """A tiny Qwen2 in bfloat16 and its stepped AdamW saved as DCP directories (model/, optimizer/):
    tensors of two dtypes and the optimizer's non-tensor hyperparameters."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mempo.train.sharded import save_model_shards, save_optimizer_shards

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.float().square().mean().backward()
    optimizer.step()
    save_model_shards(tmp_path / "model", model)
    save_optimizer_shards(tmp_path / "optimizer", model, optimizer)
    return model, optimizer


def _unrestricted(file):
    import pickle

    return pickle.loads(file.read_bytes())  # a file this test wrote


def test_the_restricted_reader_reads_every_index_dcp_writes(tmp_path, two_rank_checkpoint):
    """What DCP writes (1 process: bfloat16 model, fp32 AdamW with its hyperparameters; 2 FSDP2
    ranks: DTensor chunks) reads back through `read_index` exactly as unrestricted pickle reads it."""
    from mempo.train.sharded import read_index

    _qwen_shards(tmp_path)
    _, root, _ = two_rank_checkpoint
    files = [tmp_path / "model" / ".metadata", tmp_path / "optimizer" / ".metadata"]
    files += [root / "step_00000001" / folder / ".metadata" for folder in ("model", "optimizer")]
    for file in files:
        assert read_index(file) == _unrestricted(file), file
    assert {torch.bfloat16, torch.float32} <= {entry.properties.dtype for file in files[:2]
                                               for entry in read_index(file).state_dict_metadata.values()
                                               if hasattr(entry, "properties")}


def _plant_index(directory, payload, marker):
    from support.checkpoints import index_with_payload, touch_payload

    file = directory / ".metadata"
    file.write_bytes(touch_payload(marker) if payload == "bare" else index_with_payload(file, marker))
    return file


def _readers(directory, model, optimizer):
    """Every way mempo reads a DCP directory's index, by name: (name, call)."""
    from mempo.train import sharded

    return {
        "tensor_specs": lambda: sharded.tensor_specs(directory),
        "read_tensors": lambda: sharded.read_tensors(directory, ["lm_head.weight"]),
        "check_model_shards": lambda: sharded.check_model_shards(directory, model),
        "load_model_shards": lambda: sharded.load_model_shards(directory, model),
        "load_model_shards(strict=False)": lambda: sharded.load_model_shards(directory, model, strict=False),
        "index_files": lambda: sharded.index_files(directory),
    }


@pytest.mark.parametrize("payload", ["bare", "hidden"])
def test_a_planted_index_runs_no_code_in_any_reader(tmp_path, payload):
    """A `.metadata` whose unpickling would make a marker file (bare, or hidden inside a working
    index: unpickled unrestricted it still loads, so nothing else would tell): every reader refuses
    it naming the file and the global, before anything it names is called; the marker never appears."""
    model, optimizer = _qwen_shards(tmp_path)
    marker = tmp_path / "PWNED"
    file = _plant_index(tmp_path / "model", payload, marker)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for name, read in _readers(tmp_path / "model", model, optimizer).items():
        with pytest.raises(ckpt.CheckpointError) as error:
            read()
        assert str(error.value).startswith(f"{file}: refused: it names pathlib.Path.touch"), name
        assert not marker.exists(), name
    _plant_index(tmp_path / "optimizer", payload, marker)
    for read in (lambda: ckpt.check_optimizer_shards(tmp_path / "optimizer", model, optimizer),
                 lambda: ckpt.load_optimizer_shards(tmp_path / "optimizer", model, optimizer)):
        with pytest.raises(ckpt.CheckpointError, match=r"optimizer/\.metadata: refused: it names pathlib\.Path\.touch"):
            read()
    assert not marker.exists()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_dcps_own_load_reads_the_index_restricted(tmp_path):
    """The gap between mempo's check and DCP's load is closed: DCP's stock FileSystemReader would run
    the planted index (the payload is live), mempo's `IndexReader` refuses it inside DCP's load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException

    from mempo.train.sharded import IndexReader

    model, _ = _qwen_shards(tmp_path)
    marker = tmp_path / "PWNED"
    _plant_index(tmp_path / "model", "hidden", marker)
    state = {k: torch.empty_like(v) for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointException) as error:
        dcp.load(state, storage_reader=IndexReader(tmp_path / "model"), no_dist=True)
    assert "refused: it names pathlib.Path.touch" in str(error.value) and not marker.exists()
    dcp.load(state, storage_reader=FileSystemReader(tmp_path / "model"), no_dist=True)
    assert marker.exists()  # what every load did before


def test_an_index_setting_state_on_a_class_is_refused(tmp_path):
    """An index may set state only on the records it makes: a BUILD on an admitted class itself
    (which would change that class for the whole process) is refused."""
    from torch.distributed.checkpoint.metadata import Metadata

    from mempo.train.sharded import read_index

    file = tmp_path / ".metadata"  # GLOBAL Metadata; BUILD (None, {"injected": 1}); STOP
    file.write_bytes(b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\nN}X\x08\x00\x00\x00injectedK\x01s"
                     b"\x86b.")
    with pytest.raises(ckpt.CheckpointError, match=r"\.metadata: cannot be loaded \(UnpicklingError: state set on "
                                                   r"type"):
        read_index(file)
    assert not hasattr(Metadata, "injected")


@pytest.mark.parametrize("path", ["../step_00000001/model/__0_0.distcp", "/etc/passwd", "sub/__0_0.distcp"])
def test_an_index_naming_a_file_outside_its_directory_is_refused(tmp_path, path):
    import pickle

    from mempo.train.sharded import read_index

    _qwen_shards(tmp_path)
    file = tmp_path / "model" / ".metadata"
    index = _unrestricted(file)
    next(iter(index.storage_data.values())).relative_path = path
    file.write_bytes(pickle.dumps(index))
    with pytest.raises(ckpt.CheckpointError, match=r"\.metadata: damaged \(not a torch.distributed.checkpoint index: "
                                                   r"storage entry naming"):
        read_index(file)


def test_a_fifo_index_is_refused_at_once(tmp_path):
    import os

    from mempo.train.sharded import read_index

    os.mkfifo(tmp_path / ".metadata")
    with pytest.raises(ckpt.CheckpointError, match=r"\.metadata: a FIFO, not a regular file \(shard index\)$"):
        read_index(tmp_path / ".metadata")


def test_a_planted_value_in_a_shard_runs_no_code(tmp_path):
    """The optimizer's hyperparameters are pickled values inside its shard file, which DCP's default
    planner unpickles unrestricted on load: one pointed at a payload (the index rewritten to match)
    is refused by `read_values` and by every optimizer load, naming the shard and the key."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from mempo.train.sharded import read_values
    from support.checkpoints import value_with_payload

    model, optimizer = _qwen_shards(tmp_path)
    assert read_values(tmp_path / "optimizer")["param_groups.lm_head.weight.lr"] == 1e-3
    marker = tmp_path / "PWNED"
    key = value_with_payload(tmp_path / "optimizer", marker)
    said = re.escape(f"{tmp_path / 'optimizer' / '__0_0.distcp'}: the value of {key} cannot be loaded (it names ")
    with pytest.raises(ckpt.CheckpointError, match=said):
        read_values(tmp_path / "optimizer")
    fresh = torch.optim.AdamW(model.parameters(), lr=0.5)
    with pytest.raises(ckpt.CheckpointError, match=said):
        ckpt.load_optimizer_shards(tmp_path / "optimizer", model, fresh)
    assert not marker.exists() and {g["lr"] for g in fresh.param_groups} == {0.5}
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    dcp.load(get_optimizer_state_dict(model, fresh, options=options), checkpoint_id=tmp_path / "optimizer",
             no_dist=True)  # DCP's own planner: the payload is live
    assert marker.exists()
