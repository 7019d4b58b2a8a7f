"""mempo.utils.atomic: `atomic_directory` replaces only what it wrote (its marker lists every entry),
never a file, a link or a folder someone else filled; the output-path checks every command makes
before its slow work (`check_output_folder`, `check_directory_target`, `claim_directory`)."""
import json
import os

import pytest

from mempo.utils.atomic import (WRITTEN_MARKER, OutputPathError, atomic_directory, check_directory_target,
                                check_output_folder, claim_directory)


def _write(path, **files):
    with atomic_directory(path, field="--out") as staging:
        for name, text in files.items():
            (staging / name).write_text(text)


def test_a_directory_it_wrote_is_replaced_and_lists_what_it_holds(tmp_path):
    target = tmp_path / "m"
    _write(target, a="1", b="2")
    marker = json.loads((target / WRITTEN_MARKER).read_text())
    assert marker == {"written_by": "mempo", "entries": ["a", "b"]}
    _write(target, c="3")
    assert sorted(os.listdir(target)) == sorted([WRITTEN_MARKER, "c"])
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "empty", d="4")  # an empty directory holds nothing to lose
    assert (tmp_path / "empty" / "d").read_text() == "4"


def test_what_it_did_not_write_is_never_replaced(tmp_path):
    """The old `atomic_directory` renamed any existing target aside and removed it: a run directory,
    a user's folder, a file (hidden as ``.tmp-old-<name>-<pid>``, removed by the next write)."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000003").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    a_file = tmp_path / "afile.txt"
    a_file.write_text("keep me")
    mine = tmp_path / "mine"
    _write(mine, a="1")
    (mine / "added.txt").write_text("a user's file")
    os.symlink(mine, tmp_path / "link")
    cases = {run: "is a directory mempo did not write (no .mempo-written marker; it holds checkpoints, "
                  "metrics.jsonl)",
             a_file: "exists and is not a directory",
             mine: "holds added.txt, which mempo did not write there",
             tmp_path / "link": "is a symbolic link",
             a_file / "model": f"cannot be made, {a_file} is not a directory"}
    for target, expected in cases.items():
        with pytest.raises(OutputPathError, match="^--out: ") as error:
            _write(target, x="new")
        assert expected in str(error.value), str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt", "link", "mine", "run"]  # no staging left
    assert a_file.read_text() == "keep me" and (mine / "added.txt").is_file()
    assert (run / "checkpoints" / "step_00000003").is_dir() and (run / "metrics.jsonl").is_file()


def test_a_file_an_older_mempo_hid_aside_is_not_removed(tmp_path):
    """Before the marker, replacing a file left it as ``.tmp-old-<name>-<pid>`` until the next write
    of that name removed it; only what the marker proves mempo's is removed now."""
    hidden = tmp_path / ".tmp-old-m-12345"
    hidden.mkdir()
    (hidden / "notes.txt").write_text("a user's")
    stale_copy = tmp_path / ".tmp-old-m-999"  # left by a crash between the two renames: mempo's
    _write(stale_copy, a="1")
    _write(tmp_path / "m", a="2")
    assert (hidden / "notes.txt").read_text() == "a user's" and not stale_copy.exists()


def test_the_working_directory_and_what_a_command_reads_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    keep = [tmp_path / "run" / "checkpoints"]
    for out, expected in ((".", ". is the working directory"), (str(tmp_path.parent), "or above it"),
                          (str(tmp_path / "run"), "holds"), (str(keep[0]), "is " + str(keep[0])),
                          (str(keep[0] / "step_00000003" / "hf"), "lies inside")):
        with pytest.raises(OutputPathError, match="^--out: ") as error:
            check_directory_target(out, "--out", keep=keep)
        assert expected in str(error.value), str(error.value)
    assert check_directory_target("hf", "--out", keep=keep) == tmp_path / "hf"


def test_an_output_folder_is_a_folder_and_its_files_are_not_folders(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "out" / "train.parquet").mkdir(parents=True)
    for folder, expected in ((tmp_path / "a_file", "exists and is not a directory"),
                             (tmp_path / "a_file" / "sub", "cannot be made"),
                             (tmp_path / "out", "train.parquet is a directory; a file is written there")):
        with pytest.raises(OutputPathError, match=expected):
            check_output_folder(folder, "--out", ["train.parquet"])
    assert check_output_folder(tmp_path / "new" / "deeper", "--out", ["train.parquet"]) == tmp_path / "new" / "deeper"


def test_a_claimed_directory_is_reused_by_its_owner_only(tmp_path):
    out = claim_directory(tmp_path / "demo_out", "--out", "mempo demo")
    (out / "report.md").write_text("an earlier demo's")
    assert claim_directory(out, "--out", "mempo demo") == out  # a re-run
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "rl").mkdir()
    _write(tmp_path / "model", a="1")
    for path in (tmp_path / "home", tmp_path / "model"):
        with pytest.raises(OutputPathError, match="did not write"):
            claim_directory(path, "--out", "mempo demo")
    with pytest.raises(OutputPathError, match="did not write"):
        claim_directory(out, "--out", "mempo other")
    assert (tmp_path / "home" / "rl").is_dir() and not (tmp_path / "home" / WRITTEN_MARKER).exists()
