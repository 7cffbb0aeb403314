"""A stage run by hand never silently does nothing, never reuses stale output, never destroys
work: reruns with the same or another config, changed and unfinished inputs, two writers,
outputs over inputs, model folders that are not whole, errors of the operating system, quiet
losses, and a scheduler's stop signal. Each test is one case of what a user tried."""

import errno
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests_helpers import SUBPROCESS_ENV, reasoner

from reasoner import outputs, shards

REPO = Path(__file__).resolve().parents[2]
QS = REPO / "configs" / "quickstart"


def offline(model, verified, out, *extra):
    return ["train-offline", QS / "train_offline.yaml", f"model.name_or_path={model}",
            f"input_dir={verified}", f"output_dir={out}", "run.max_steps=2", "run.progress=false",
            "max_tokens=256", *extra]


def sft(synth_dir, model, out, *extra):
    return ["sft", QS / "sft.yaml", f"model.name_or_path={model}", f"data.path={synth_dir}/sft",
            f"output_dir={out}", "data.limit=32", "run.max_steps=2", "run.progress=false",
            *extra]


def infer(model, problems, out, *extra):
    return ["infer", QS / "infer.yaml", f"model.name_or_path={model}", f"data.path={problems}",
            f"output_dir={out}", "data.limit=4", "sampling.n=2", "sampling.max_tokens=8",
            "backend=hf", *extra]


def weights(folder: Path) -> dict:
    return load_file(folder / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synth_dir, tiny_model_dir):
    """A tiny SFT model (2 steps): its final/ records the template it was trained with."""
    out = tmp_path_factory.mktemp("reruns") / "sft"
    done = reasoner(*sft(synth_dir, tiny_model_dir, out))
    assert done.returncode == 0, done.stderr
    return out


def test_1_a_changed_key_is_refused_and_the_same_command_says_it_has_nothing_to_do(
        tmp_path, tiny_model_dir, verified_dir, synth_dir, trained):
    out = tmp_path / "rl"
    assert reasoner(*offline(tiny_model_dir, verified_dir, out)).returncode == 0
    before, manifest = weights(out), (out / "manifest.json").read_text()
    again = reasoner(*offline(tiny_model_dir, verified_dir, out))
    assert again.returncode == 0 and "is already complete with this config" in again.stderr
    changed = reasoner(*offline(tiny_model_dir, verified_dir, out, "optim.lr=1e-5"))
    assert changed.returncode == 2
    assert "optim.lr: 3e-05 then, 1e-05 now" in changed.stderr and "overwrite=true" in changed.stderr
    assert (out / "manifest.json").read_text() == manifest  # the change is not recorded
    assert all(torch.equal(before[k], v) for k, v in weights(out).items())
    replaced = reasoner(*offline(tiny_model_dir, verified_dir, out, "optim.lr=1e-5",
                                 "overwrite=true"))
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads((out / "manifest.json").read_text())["config"]["optim"]["lr"] == 1e-5
    # sft alike: its checkpoints never resume a run of another config
    sft_changed = reasoner(*sft(synth_dir, tiny_model_dir, trained, "optim.lr=1e-2"))
    assert sft_changed.returncode == 2 and "optim.lr" in sft_changed.stderr


def test_2_an_eval_into_an_eval_folder_of_another_config_is_refused(tmp_path, trained,
                                                                     synth_dir):
    out = tmp_path / "eval"
    args = ["eval", "bench", QS / "eval.yaml", f"model.name_or_path={trained}/final",
            f"data=[{{path: {synth_dir}/test_problems, limit: 6}}]", "sampling.n=2",
            "sampling.max_tokens=8", "backend=hf", "--out", out]
    assert reasoner(*args).returncode == 0
    report = (out / "report.json").read_text()
    other = [*args[:4], f"data=[{{path: {synth_dir}/test_problems, limit: 3}}]", "sampling.n=1",
             *args[6:]]
    refused = reasoner(*other)
    assert refused.returncode == 2 and "sampling.n: 2 then, 1 now" in refused.stderr
    assert (out / "report.json").read_text() == report
    assert len(list(shards.iter_rows(out / "samples"))) == 12  # its samples are all there
    redone = reasoner(*other, "overwrite=true")
    assert redone.returncode == 0, redone.stderr
    fresh = json.loads((out / "report.json").read_text())
    assert (fresh["problems"], fresh["k"]) == (3, 1)


def test_3_a_regenerated_input_makes_the_same_command_refuse_instead_of_skip(
        tmp_path, tiny_model_dir, verified_dir):
    verified = tmp_path / "verified"
    shutil.copytree(verified_dir, verified)
    out = tmp_path / "rl"
    assert reasoner(*offline(tiny_model_dir, verified, out)).returncode == 0
    rows = list(shards.iter_rows(verified))
    shards.reset(verified, "verify", {"regenerated": True})
    shards.write_rows(verified, rows[:8])
    shards.finish(verified, {"samples": 8})
    again = reasoner(*offline(tiny_model_dir, verified, out))
    assert again.returncode == 2
    assert f"input input_dir={verified} has changed since" in again.stderr


def test_4_an_unfinished_input_is_refused_naming_the_command_that_finishes_it(
        tmp_path, tiny_model_dir, verified_dir, synth_dir):
    verified = tmp_path / "verified"
    shutil.copytree(verified_dir, verified)
    shards.update_manifest(verified, complete=False)
    with open(shards.part_path(verified, 0), "a") as fh:
        fh.write('{"id": "torn')
    r = reasoner(*offline(tiny_model_dir, verified, tmp_path / "rl"))
    assert r.returncode == 2 and "is not complete" in r.stderr and "reasoner verify" in r.stderr
    assert not (tmp_path / "rl").exists()
    sft_data = tmp_path / "sft-data"
    shutil.copytree(synth_dir / "sft", sft_data)
    shards.update_manifest(sft_data, complete=False)
    r = reasoner("sft", QS / "sft.yaml", f"model.name_or_path={tiny_model_dir}",
                 f"data.path={sft_data}", f"output_dir={tmp_path / 'sft'}")
    assert r.returncode == 2 and f"data.path={sft_data} is not complete" in r.stderr


def test_5_a_second_writer_stops_at_once(tmp_path, tiny_model_dir, synth_dir):
    out = tmp_path / "samples"
    with outputs.writer_lock(out, "writer-0"):
        r = reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", out))
        assert r.returncode == 2 and "another reasoner process, pid" in r.stderr
        other_shard = reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", out),
                               "--shard", "1", "--num-shards", "2")
        assert other_shard.returncode == 0, other_shard.stderr  # its own part, its own lock
    with outputs.writer_lock(tmp_path / "sft"):
        r = reasoner(*sft(synth_dir, tiny_model_dir, tmp_path / "sft"))
        assert r.returncode == 2 and "is writing" in r.stderr


def test_6_outputs_never_go_over_inputs_nor_take_over_another_stage(
        tmp_path, tiny_model_dir, synth_dir, trained):
    samples = tmp_path / "samples"
    assert reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", samples)).returncode == 0
    count = len(list(shards.iter_rows(samples)))
    r = reasoner("verify", QS / "verify.yaml", f"input_dir={samples}", f"output_dir={samples}")
    assert r.returncode == 2 and f"output_dir={samples} is the stage's input" in r.stderr
    r = reasoner(*offline(tiny_model_dir, samples, tmp_path / "x" / ".." / "samples"))
    assert r.returncode == 2
    r = reasoner(*offline(tiny_model_dir, tmp_path / "nowhere", samples))
    assert r.returncode == 2 and "written by `reasoner infer`" in r.stderr
    assert len(list(shards.iter_rows(samples))) == count  # the samples are intact
    final = trained / "final"
    before = (final / "model.safetensors").read_bytes()
    r = reasoner("model", "tiny", QS / "tiny_model.yaml", f"output_dir={final}",
                 f"corpus=[{synth_dir}/sft]")
    assert r.returncode == 2 and "already holds a model" in r.stderr  # shipped overwrite: false
    assert (final / "model.safetensors").read_bytes() == before


def test_7_a_model_folder_that_is_not_whole_is_named_before_anything_is_written(
        tmp_path, tiny_model_dir, synth_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    out = tmp_path / "samples"
    r = reasoner(*infer(model, synth_dir / "test_problems", out))
    assert r.returncode == 2 and "has no tokenizer" in r.stderr and len(r.stderr) < 600
    assert not out.exists()
    (tmp_path / "tokenizer.json").rename(model / "tokenizer.json")
    assert reasoner(*infer(model, synth_dir / "test_problems", out)).returncode == 0  # no
    # overwrite needed: the failed run wrote nothing
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    r = reasoner(*offline(model, tmp_path / "v", tmp_path / "rl"))
    assert r.returncode == 2 and "model.safetensors is cut short" in r.stderr


def test_8_errors_of_the_operating_system_on_a_users_path_are_one_paragraph(
        tmp_path, tiny_model_dir, synth_dir, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    r = reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", a_file / "out"))
    assert r.returncode == 2 and "Not a directory" in r.stderr and "Traceback" not in r.stderr

    out = tmp_path / "samples"
    real = shards.PartWriter.write
    calls = {"n": 0}

    def full(self, row):  # the disk fills after three samples
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return real(self, row)

    monkeypatch.setattr(shards.PartWriter, "write", full)
    r = reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", out))
    assert r.returncode == 2 and "the disk is full" in r.stderr and "Traceback" not in r.stderr
    monkeypatch.setattr(shards.PartWriter, "write", real)
    resumed = reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", out))
    assert resumed.returncode == 0, resumed.stderr  # the three written rows are kept
    assert len(list(shards.iter_rows(out))) == 8

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "ro"))

    monkeypatch.setattr(shards, "update_manifest", denied)  # root ignores a read-only mode
    r = reasoner(*infer(tiny_model_dir, synth_dir / "test_problems", tmp_path / "ro"))
    assert r.returncode == 2 and "check the permissions" in r.stderr
    monkeypatch.undo()

    missing = tmp_path / "missing.jsonl"
    r = reasoner("eval", "bench", tiny_model_dir, "--data", missing, "--out", tmp_path / "e")
    assert r.returncode == 2 and "missing.jsonl" in r.stderr and "Traceback" not in r.stderr
    r = reasoner("model", "tiny", QS / "tiny_model.yaml", f"output_dir={tmp_path / 't'}",
                 f"corpus=[{missing}]")
    assert r.returncode == 2 and "missing.jsonl" in r.stderr
    for bad, said in (("--devices 0", "--devices 0 must be at least 1"),
                      ("--mfu 0", "--mfu 0 must be above 0"),
                      ("--device-mem-gib -5", "--device-mem-gib -5 must be above 0")):
        r = reasoner("plan", QS / "recipe.yaml", *bad.split())
        assert r.returncode == 2 and said in r.stderr, (bad, r.stderr)


def test_9_losses_and_mismatches_are_said_at_the_start_and_counted(
        tmp_path, tiny_model_dir, verified_dir, synth_dir, trained):
    r = reasoner(*offline(tiny_model_dir, verified_dir, tmp_path / "rl", "max_tokens=150",
                          "seq_len=256"))
    assert r.returncode == 0, r.stderr
    assert "warning: 8 of 24 samples (33.3%) are longer than max_tokens=150" in r.stderr
    counts = json.loads((tmp_path / "rl" / "manifest.json").read_text())["counts"]
    assert counts["dropped_over_max_tokens"] == 8

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"id": f"p{i}", "problem": "1 + 1?",
                                            "answer": "" if i == 0 else "2"}) + "\n"
                                for i in range(3)))
    samples = tmp_path / "samples"
    assert reasoner(*infer(tiny_model_dir, problems, samples)).returncode == 0
    r = reasoner("verify", QS / "verify.yaml", f"input_dir={samples}",
                 f"output_dir={tmp_path / 'v'}", "filters.drop_zero_variance=false")
    assert r.returncode == 0 and "1 problems have an empty reference answer (p0)" in r.stderr
    assert shards.read_manifest(tmp_path / "v")["counts"]["empty_references"] == 1

    # the trained model's final/ records its template (no instruction); eval bench MODEL
    # --data FILE, which sets no template, prompts with it, and a mismatch is warned about
    recorded = json.loads((trained / "final" / "reasoner.json").read_text())["template"]
    assert recorded["instruction"] == ""
    r = reasoner("eval", "bench", f"{trained}/final", "--data", problems, "--out",
                 tmp_path / "e1", "sampling.n=1", "sampling.max_tokens=8", "backend=hf")
    assert r.returncode == 0, r.stderr
    assert "prompting as" in r.stderr
    report = json.loads((tmp_path / "e1" / "report.json").read_text())
    assert report["config"]["template"]["instruction"] == ""
    r = reasoner("eval", "bench", f"{trained}/final", "--data", problems, "--out",
                 tmp_path / "e2", "sampling.n=2", "sampling.max_tokens=8", "backend=hf",
                 "template.instruction='Answer.'")
    assert r.returncode == 0 and "warning: template.instruction differ" in r.stderr
    r = reasoner("eval", "compare", tmp_path / "e1", tmp_path / "e2")
    assert r.returncode == 0
    assert "k (samples per problem) differs" in r.stderr and "template differs" in r.stderr


@pytest.mark.slow
def test_9_a_stop_signal_ends_the_step_saves_and_says_how_to_resume(tmp_path, synth_dir,
                                                                    tiny_model_dir):
    """SIGTERM (a scheduler's stop) and SIGHUP: the step in progress ends, a checkpoint is
    saved when one was due within 3 steps, the run says where it stopped and that a rerun
    resumes; the rerun ends with the weights of a run that was never stopped."""
    whole = reasoner(*sft(synth_dir, tiny_model_dir, tmp_path / "whole", "run.max_steps=40",
                          "run.save_every=10", "run.keep_last=10"))
    assert whole.returncode == 0, whole.stderr
    for number, out in ((signal.SIGTERM, tmp_path / "term"), (signal.SIGHUP, tmp_path / "hup")):
        args = sft(synth_dir, tiny_model_dir, out, "run.max_steps=40", "run.save_every=10",
                   "run.keep_last=10", "run.log_every=1")
        proc = subprocess.Popen([sys.executable, "-m", "reasoner", *map(str, args)],
                                stderr=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)
        deadline = time.time() + 300
        while not (out / "metrics.jsonl").exists() or sum(
                1 for _ in open(out / "metrics.jsonl")) < 8:
            assert proc.poll() is None and time.time() < deadline, "ended before step 8"
            time.sleep(0.01)
        proc.send_signal(number)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 128 + number, err[-2000:]
        name = signal.Signals(number).name
        assert f"stopped by {name} after step" in err and "rerun the same command to resume" in err
        step = int(err.split("after step ")[1].split()[0])
        if 10 - step % 10 <= 3:  # a save was due within 3 steps: made at the stop
            assert (out / f"checkpoint-{step}").exists()
        again = reasoner(*args)
        assert again.returncode == 0, again.stderr
        assert all(torch.allclose(v, weights(tmp_path / "whole")[k], atol=1e-6)
                   for k, v in weights(out).items())
