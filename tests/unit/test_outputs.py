"""A stage's output folder: identity, refusal naming what differs, the writer lock, inputs."""

import pytest

from reasoner import outputs, shards
from reasoner.config import Input
from reasoner.errors import ConfigError, ShardError


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
