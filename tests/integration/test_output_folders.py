"""An output folder holds the user's files safely (issue 51): a folder of the user's is refused
before any work, `overwrite=true` too; `overwrite=true` always redoes the work and removes only
what the stage wrote; an output_dir that is a file, or a disk that fills up mid-checkpoint or
mid-shard, is one paragraph and exit 2, and a rerun resumes. Every stage that writes a folder,
through the real CLI on the tiny model."""

import errno
import json
from pathlib import Path

import pytest
from tests_helpers import reasoner

from reasoner import outputs, shards

QS = Path(__file__).resolve().parents[2] / "configs" / "quickstart"
STAGES = ["data synth", "sft", "infer", "verify", "train-offline", "eval"]
USERS = ["a.jsonl", "b.jsonl", "notes.md", "scores.jsonl", "todo.txt"]  # issue 51: five
MADE = {"data synth": "sft/part-00000.jsonl", "sft": "final/model.safetensors",  # what a redo
        "infer": "part-00000.jsonl", "verify": "part-00000.jsonl",  # writes again
        "train-offline": "final/model.safetensors", "eval": "report.json"}


@pytest.fixture
def args(tiny_model_dir, synth_dir, verified_dir):
    """stage, output folder, more values -> the command line of a tiny run of that stage."""
    samples = verified_dir.parent / "samples"  # a complete Sample shard (conftest)

    def line(stage: str, out: Path, *extra: str) -> list:
        model = f"model.name_or_path={tiny_model_dir}"
        return {
            "data synth": ["data", "synth", QS / "data_synth.yaml", f"output_dir={out}",
                           "num_train=20", "num_test=5"],
            "sft": ["sft", QS / "sft.yaml", model, f"data.path={synth_dir}/sft",
                    f"output_dir={out}", "data.limit=16", "run.max_steps=1",
                    "run.progress=false"],
            "infer": ["infer", QS / "infer.yaml", model, f"data.path={synth_dir}/test_problems",
                      f"output_dir={out}", "data.limit=2", "sampling.n=2",
                      "sampling.max_tokens=4"],
            "verify": ["verify", QS / "verify.yaml", f"input_dir={samples}", f"output_dir={out}",
                       "filters.drop_zero_variance=false"],
            "train-offline": ["train-offline", QS / "train_offline.yaml", model,
                              f"input_dir={verified_dir}", f"output_dir={out}",
                              "run.max_steps=1", "run.progress=false"],
            "eval": ["eval", "bench", QS / "eval.yaml", model,
                     f"data=[{{path: {synth_dir}/test_problems, limit: 2}}]", "sampling.n=1",
                     "sampling.max_tokens=4", "bootstrap=100", "--out", out],
        }[stage] + list(extra)

    return line


def plant(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"the user's {name}\n")


def own(stage: str) -> tuple[str, ...]:
    return (*outputs.EVERY_STAGE, *outputs.WRITES[stage])


def stamps(folder: Path) -> dict[str, int]:
    """Every file under `folder` with its modification time (what a redo changes)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


@pytest.mark.parametrize("stage", STAGES)
def test_1_2_a_folder_of_the_users_files_is_refused_before_any_work_overwrite_or_not(
        tmp_path, args, stage):
    """Issue 51, 1: a verify wrote its shard beside five of the user's files; 2: overwrite=true
    then deleted them all."""
    out = tmp_path / "out"
    plant(out, USERS)
    for extra in ((), ("overwrite=true",)):
        r = reasoner(*args(stage, out, *extra))
        assert r.returncode == 2, r.stderr
        said = " ".join(r.stderr.split())
        assert (f"holds 5 entries that `reasoner {stage}` did not write (a.jsonl, b.jsonl, "
                "notes.md, scores.jsonl and 1 more)") in said
        assert "Traceback" not in r.stderr
        assert sorted(p.name for p in out.iterdir()) == USERS  # nothing written, nothing gone
    assert all((out / name).read_text() == f"the user's {name}\n" for name in USERS)


def test_2_overwrite_with_another_config_removes_only_what_verify_wrote(tmp_path, args):
    """Issue 51, 2: overwrite=true deleted everything in the folder but its locks."""
    out = tmp_path / "verified"
    assert reasoner(*args("verify", out)).returncode == 0
    plant(out, USERS)
    r = reasoner(*args("verify", out, "filters.truncated=drop", "overwrite=true"))
    assert r.returncode == 0, r.stderr
    assert all((out / name).read_text() == f"the user's {name}\n" for name in USERS)
    assert ("kept a.jsonl, b.jsonl, notes.md, scores.jsonl and 1 more in "
            f"{out}: not written by `reasoner verify`") in " ".join(r.stderr.split())
    assert shards.read_manifest(out)["config"]["filters"]["truncated"] == "drop"


@pytest.mark.parametrize("stage", STAGES)
def test_3_overwrite_redoes_a_finished_run_and_keeps_the_users_files(tmp_path, args, stage):
    """Issue 51, 3: overwrite=true on a finished run of the same identity did nothing. It
    redoes the work now; the user's files in the folder stay, named in one line."""
    out = tmp_path / "out"
    first = reasoner(*args(stage, out))
    assert first.returncode == 0, first.stderr
    made = sorted(p.name for p in out.iterdir())
    plant(out, ["notes.md", "data.jsonl"])
    before = stamps(out)
    again = reasoner(*args(stage, out))
    assert again.returncode == 0, again.stderr
    assert stamps(out) == before  # no overwrite: finished, nothing done
    redone = reasoner(*args(stage, out, "overwrite=true"))
    assert redone.returncode == 0, redone.stderr
    assert "already complete" not in redone.stderr
    assert stamps(out)[MADE[stage]] != before[MADE[stage]]
    assert all((out / name).read_text() == f"the user's {name}\n"
               for name in ("notes.md", "data.jsonl"))
    assert f"kept data.jsonl, notes.md in {out}" in " ".join(redone.stderr.split())
    # outputs.WRITES names every entry the stage wrote: only the user's two are left over
    assert outputs.users_entries(out, own(stage)) == ["data.jsonl", "notes.md"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*made, "data.jsonl", "notes.md"])


def test_3_sharded_workers_with_overwrite_each_redo_their_own_part(tmp_path, args):
    """A second worker's redo never removes the part the first one has just written."""
    out = tmp_path / "samples"
    for shard in ("0", "1"):
        r = reasoner(*args("infer", out, "--shard", shard, "--num-shards", "2"))
        assert r.returncode == 0, r.stderr
    before = stamps(out)
    for shard in ("0", "1"):  # one after the other: the second must not undo the first
        r = reasoner(*args("infer", out, "overwrite=true", "--shard", shard, "--num-shards", "2"))
        assert r.returncode == 0, r.stderr
    assert shards.is_complete(out) and len(list(shards.iter_rows(out))) == 4
    assert all(stamps(out)[p.name] != before[p.name] for p in shards.part_files(out))


@pytest.mark.parametrize("stage", STAGES)
def test_6_an_output_dir_that_is_a_file_is_one_paragraph(tmp_path, args, stage):
    """Issue 51, 6: FileExistsError in verify, infer and sft."""
    a_file = tmp_path / "out"
    a_file.write_text("the user's file\n")
    r = reasoner(*args(stage, a_file))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"output_dir={a_file} is a file, not a folder" in " ".join(r.stderr.split())
    assert a_file.read_text() == "the user's file\n"


def test_7_a_full_disk_while_a_checkpoint_is_written_is_one_paragraph_and_a_rerun_resumes(
        tmp_path, args, monkeypatch):
    """Issue 51, 7: safetensors_rust.SafetensorError ... No space left on device."""
    import transformers.modeling_utils as hf
    from safetensors import SafetensorError

    real, calls = hf.safe_save_file, []

    def full(tensors, filename, metadata=None):  # the disk fills during the second checkpoint
        calls.append(filename)
        if len(calls) == 2:
            raise SafetensorError("Error while serializing: I/O error: No space left on device "
                                  f'(os error 28) at path "{filename}"')
        return real(tensors, filename, metadata=metadata)

    out = tmp_path / "sft"
    line = args("sft", out, "run.max_steps=2", "run.save_every=1")
    monkeypatch.setattr(hf, "safe_save_file", full)
    r = reasoner(*line)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    said = " ".join(r.stderr.split())
    assert f"{out}: No space left on device; the disk is full" in said
    monkeypatch.setattr(hf, "safe_save_file", real)
    resumed = reasoner(*line)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "manifest.json").read_text())["counts"]["resumed_from"] == 1


def test_7_a_full_disk_while_verify_writes_its_shard_is_one_paragraph_naming_the_folder(
        tmp_path, args, monkeypatch):
    real = shards.PartWriter.write

    def full(self, row):  # as a write to an open file fails: an OSError naming no file
        if self.path.parent == out:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, row)

    out = tmp_path / "verified"
    monkeypatch.setattr(shards.PartWriter, "write", full)
    r = reasoner(*args("verify", out))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{out}: No space left on device; the disk is full" in " ".join(r.stderr.split())
    monkeypatch.setattr(shards.PartWriter, "write", real)
    resumed = reasoner(*args("verify", out))
    assert resumed.returncode == 0, resumed.stderr
    assert shards.is_complete(out)


def test_model_tiny_never_deletes_a_folder_of_the_users_files(tmp_path, synth_dir):
    out = tmp_path / "model"
    plant(out, USERS)
    r = reasoner("model", "tiny", QS / "tiny_model.yaml", f"output_dir={out}",
                 f"corpus=[{synth_dir}/sft]")  # the shipped overwrite: false
    assert r.returncode == 2 and sorted(p.name for p in out.iterdir()) == USERS
