"""A stage's output folder: identity, refusal naming what differs, the writer lock, inputs,
the user's entries (never deleted), overwrite=true (always redoes), errors of the disk."""

import errno

import pytest

from reasoner import outputs, shards
from reasoner.config import Input
from reasoner.errors import ConfigError, InputError, ShardError


def identity(lr=1e-5, data_digest_from=None, stage="sft"):
    inputs = [Input("data.path", str(data_digest_from), "shard folder")] if data_digest_from \
        else []
    return outputs.Identity.of(stage, {"optim": {"lr": lr}, "seed": 0}, inputs)


def test_a_folder_is_new_then_resumed_then_complete_and_another_identity_is_refused(tmp_path):
    out = tmp_path / "out"
    first = identity()
    assert outputs.decide(out, first) == "new"
    outputs.begin(out, first, "new")
    assert outputs.decide(out, first) == "resume"
    (out / "checkpoint-2").mkdir()  # work a rerun must not lose
    shards.finish(out, {"steps": 2})
    assert outputs.decide(out, first) == "complete"
    with pytest.raises(ShardError) as err:
        outputs.decide(out, identity(lr=3e-5))
    said = str(err.value)
    assert "optim.lr: 1e-05 then, 3e-05 now" in said and "overwrite=true" in said
    assert outputs.decide(out, identity(lr=3e-5), overwrite=True) == "replace"
    outputs.begin(out, identity(lr=3e-5), "replace")
    assert not (out / "checkpoint-2").exists()
    assert shards.read_manifest(out)["identity"] == identity(lr=3e-5).digest


def test_a_changed_input_changes_the_identity_and_is_named(tmp_path):
    data = tmp_path / "data"
    shards.write_rows(data, [{"prompt": "a", "response": "b"}])
    shards.finish(data, {"rows": 1})
    out = tmp_path / "out"
    before = identity(data_digest_from=data)
    outputs.begin(out, before, "new")
    shards.finish(out, {})
    shards.update_manifest(data, counts={"rows": 2})  # regenerated since
    with pytest.raises(ShardError, match=f"input data.path={data} has changed since"):
        outputs.decide(out, identity(data_digest_from=data))


def test_a_folder_another_stage_wrote_is_never_taken_over(tmp_path):
    samples = tmp_path / "samples"
    outputs.begin(samples, outputs.Identity.of("infer", {}, []), "new")
    for overwrite in (False, True):
        with pytest.raises(ShardError, match="written by `reasoner infer`, not by `reasoner "
                                             "train-offline`"):
            outputs.decide(samples, identity(stage="train-offline"), overwrite)


def test_a_failed_run_that_made_nothing_is_taken_over_without_overwrite(tmp_path):
    out = tmp_path / "out"
    outputs.begin(out, identity(), "new")  # then it failed: no parts, no checkpoint
    assert outputs.decide(out, identity(lr=3e-5)) == "replace"


def test_a_second_writer_stops_at_once_naming_the_first(tmp_path):
    import os
    import socket

    with outputs.writer_lock(tmp_path):
        with pytest.raises(ShardError) as err, outputs.writer_lock(tmp_path):
            pass
        assert f"pid {os.getpid()} on {socket.gethostname()}" in str(err.value)
        with outputs.writer_lock(tmp_path, "writer-1"):  # another shard's part: its own lock
            pass
    with outputs.writer_lock(tmp_path):  # released
        pass


def test_an_output_is_never_an_input_nor_inside_one(tmp_path):
    samples = tmp_path / "samples"
    samples.mkdir()
    inputs = [Input("input_dir", str(samples), "shard folder")]
    outputs.check_not_an_input(tmp_path / "verified", inputs)
    for bad in (samples, samples / "verified", tmp_path):
        with pytest.raises(ConfigError, match="input_dir="):
            outputs.check_not_an_input(bad, inputs)


def test_an_unfinished_input_is_refused_naming_the_command(tmp_path):
    shards.write_rows(tmp_path / "v", [{"x": 1}])
    shards.update_manifest(tmp_path / "v", complete=False)
    with pytest.raises(ShardError, match=r"input_dir=.*/v is not complete.*reasoner verify"):
        outputs.require_complete(tmp_path / "v", "input_dir", "rerun the `reasoner verify` "
                                                              "that writes it")


def test_settings_outside_the_identity_are_left_out():
    from reasoner.config import OfflineConfig

    cfg = OfflineConfig.model_validate({"model": {"name_or_path": "m"}, "input_dir": "v",
                                        "output_dir": "o"})
    other = cfg.model_copy(update={"run": cfg.run.model_copy(update={
        "sequence_parallel": 2, "logprob_chunk": 512, "progress": False})})
    assert cfg.result_config() == other.result_config()
    moved = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"lr": 3e-5})})
    assert cfg.result_config() != moved.result_config()


def plant(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"the user's {name}\n")


def test_a_folder_of_the_users_files_is_refused_naming_them_overwrite_or_not(tmp_path):
    """Issue 51, 1 and 2: five of the user's files, one named like a part; no manifest."""
    out = tmp_path / "out"
    plant(out, ["a.jsonl", "b.jsonl", "notes.md", "part-00000.jsonl", "todo.txt"])
    for overwrite in (False, True):
        with pytest.raises(ShardError) as err:
            outputs.decide(out, identity(), overwrite)
        assert (f"{out} holds 5 entries that `reasoner sft` did not write (a.jsonl, b.jsonl, "
                "notes.md, part-00000.jsonl and 1 more)") in str(err.value)
        assert "overwrite=true neither" in str(err.value)
    assert len(list(out.iterdir())) == 5
    stopped = tmp_path / "stopped"  # a run that stopped after its lock, before its manifest
    with outputs.writer_lock(stopped):
        pass
    assert outputs.decide(stopped, identity()) == "new"


def test_overwrite_removes_only_what_the_stage_wrote_and_names_what_it_kept(tmp_path, capsys):
    out = tmp_path / "out"
    outputs.begin(out, identity(), "new")
    for made in ("checkpoint-2", "final", "token_cache", ".checkpoint-4.tmp"):
        (out / made).mkdir()
    plant(out, ["metrics.jsonl"])
    shards.finish(out, {})
    plant(out, ["notes.md", "data.jsonl", "checkpoint-notes.txt"])
    with outputs.writer_lock(out):
        pass
    assert outputs.decide(out, identity(lr=3e-5), overwrite=True) == "replace"
    outputs.begin(out, identity(lr=3e-5), "replace")
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock", ".writer.lock", "checkpoint-notes.txt", "data.jsonl", "manifest.json",
        "notes.md"]
    assert (out / "notes.md").read_text() == "the user's notes.md\n"
    assert (f"reasoner sft: kept checkpoint-notes.txt, data.jsonl, notes.md in {out}: not "
            "written by `reasoner sft`") in capsys.readouterr().err


def test_overwrite_redoes_a_complete_folder_of_the_same_identity(tmp_path):
    """Issue 51, 3: overwrite=true is never "complete"; a shard worker redoes its own part."""
    out = tmp_path / "out"
    outputs.begin(out, identity(), "new")
    (out / "checkpoint-2").mkdir()
    shards.finish(out, {"steps": 2})
    assert outputs.decide(out, identity()) == "complete"
    assert outputs.decide(out, identity(), overwrite=True) == "redo"
    outputs.begin(out, identity(), "redo")
    assert not (out / "checkpoint-2").exists() and not shards.is_complete(out)
    samples = tmp_path / "samples"
    infer = outputs.Identity.of("infer", {}, [])
    outputs.begin(samples, infer, "new")
    for part in (0, 1):
        shards.write_rows(samples, [{"id": str(part)}], part)
    shards.finish(samples, {})
    outputs.begin(samples, infer, outputs.decide(samples, infer, True), mine=("part-00001.jsonl",))
    assert [p.name for p in shards.part_files(samples)] == ["part-00000.jsonl"]


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    """Issue 51, 6 (mkdir raised FileExistsError)."""
    a_file = tmp_path / "out"
    a_file.write_text("x")
    with pytest.raises(InputError, match=f"output_dir={a_file} is a file, not a folder"):
        outputs.decide(a_file, identity(), overwrite=True)
    assert a_file.read_text() == "x"


def test_a_failure_of_the_disk_leaves_as_an_os_error_naming_the_folder(tmp_path):
    """Issue 51, 7: safetensors says a full disk as a SafetensorError; a write to an open file
    raises an OSError naming no file."""
    from safetensors import SafetensorError

    full = SafetensorError('Error while serializing: I/O error: No space left on device (os '
                           'error 28) at path "/x/.tmp0"')
    said = outputs.disk_error(full, tmp_path)
    assert (said.errno, said.filename) == (errno.ENOSPC, str(tmp_path))
    said = outputs.disk_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert (said.errno, said.filename) == (errno.ENOSPC, str(tmp_path))
    assert outputs.disk_error(OSError(errno.ENOSPC, "full", "/a/b"), tmp_path) is None
    assert outputs.disk_error(ValueError("os error 28"), tmp_path) is None
    with pytest.raises(OSError) as err, outputs.writing(tmp_path / "w", identity(), "new"):
        raise full
    assert err.value.errno == errno.ENOSPC and isinstance(err.value.__cause__, SafetensorError)


def test_a_model_folder_is_replaced_whole_only_when_it_holds_nothing_but_a_model(tmp_path):
    model = tmp_path / "model"
    plant(model, ["config.json", "model.safetensors", "tokenizer.json", "merges.txt"])
    outputs.check_model_folder(model, "model tiny")
    outputs.check_model_folder(tmp_path / "new", "model tiny")
    plant(model, ["notes.md"])
    with pytest.raises(ShardError, match="holds 1 entry that `reasoner model tiny` did not write "
                                         r"\(notes.md\)"):
        outputs.check_model_folder(model, "model tiny")
    plant(tmp_path / "data", ["train.json"])  # no config.json: not a model folder at all
    with pytest.raises(ShardError, match="train.json"):
        outputs.check_model_folder(tmp_path / "data", "model tiny")
