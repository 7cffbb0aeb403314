"""`reasoner sft` end to end through the CLI: resume after SIGKILL, torchrun, bad input."""

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
from tests_helpers import (
    SUBPROCESS_ENV,
    reasoner,
    reasoner_on_two_processes,
    run_jobs_on_two_processes,
    why,
)

REPO = Path(__file__).resolve().parents[2]


def args(synth_dir, model_dir, out, *extra):
    return ["sft", str(REPO / "configs/quickstart/sft.yaml"), f"model.name_or_path={model_dir}",
            f"data.path={synth_dir}/sft", f"output_dir={out}", "data.limit=64", "seq_len=600", "max_tokens=600",
            "run.global_batch=2", "run.micro_batch=1", "run.epochs=1", "run.max_steps=8",
            "run.progress=false", "optim.lr=1e-3", *extra]


def weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def same(a: dict, b: dict, atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


@pytest.mark.slow
def test_resume_after_sigkill_gives_same_weights(tmp_path, synth_dir, tiny_model_dir):
    ref = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    from reasoner import outputs
    from reasoner.config import SFTConfig
    from reasoner.config.files import load

    out = tmp_path / "killed"
    line = args(synth_dir, tiny_model_dir, out, "run.save_every=2", "run.keep_last=5")
    cfg = load(SFTConfig, line[1], line[2:])
    # a run killed before its first checkpoint left its manifest (written first) and these
    # rows: a fresh start drops them
    outputs.begin(out, outputs.Identity.of("sft", cfg.result_config(), cfg.inputs()), "new")
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "loss": 99.0}) + "\n"
                                               for k in range(1, 76)))
    cmd = [sys.executable, "-m", "reasoner", *line]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=SUBPROCESS_ENV)
    deadline = time.time() + 300
    while not (out / "checkpoint-4").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before checkpoint-4"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "final").exists()
    again = reasoner(*args(synth_dir, tiny_model_dir, out, "run.save_every=2", "run.keep_last=5"))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["resumed_from"] >= 4
    assert same(weights(out / "final"), weights(tmp_path / "ref" / "final"), atol=1e-6)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]  # the resumed run continues the file, no step twice
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] == manifest["counts"]["steps"]
    assert all(r["loss"] != 99.0 for r in rows)


# final/ in fp32: by default an fp16 run publishes fp16 weights (run.save_dtype: the training
# dtype), and these tests compare the fp32 master weights of runs
FP16 = ["model.dtype=float16", "run.log_every=1", "run.save_dtype=float32"]
# AdamW eps 1e-3 (as test_train_offline_cli's OREAL case): at 1e-8 it turns fp16 gradient
# components that round to zero in one run and not the other (the vocab-parallel softmax sums
# in another order than one process) into lr-sized steps: 1e-3 apart after 6 steps
FP16_BACKOFF = [*FP16, "optim.loss_scale=1048576", "run.max_steps=6", "optim.eps=1e-3"]
SHARDED = ["run.max_steps=4", "run.save_every=2", "run.keep_last=5"]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory, synth_dir, tiny_model_dir):
    """This module's 2-process runs, one after another in one torchrun (the processes' start
    is most of each run's time on a slow machine): 4 steps saving sharded checkpoints, and 6
    fp16 steps with loss scaling. Returns the folder holding `whole` and `fp16`."""
    def jobs(root: Path) -> list[list]:
        return [args(synth_dir, tiny_model_dir, root / "whole", *SHARDED),
                args(synth_dir, tiny_model_dir, root / "fp16", *FP16_BACKOFF),
                # sequence parallel, activations recomputed (the all-to-alls run again in backward)
                args(synth_dir, tiny_model_dir, root / "sp", *SHARDED, "run.sequence_parallel=2",
                     "run.gradient_checkpointing=true")]

    return run_jobs_on_two_processes(jobs, lambda: tmp_path_factory.mktemp("sft_two_process"))


@pytest.mark.slow
@pytest.mark.xdist_group("sft-two-processes")  # one worker makes the fixture's runs
def test_two_processes_match_one(tmp_path, synth_dir, tiny_model_dir, two_process_runs):
    one = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "one", *SHARDED))
    assert one.returncode == 0, one.stderr
    # data-parallel (each process its rows), and sequence-parallel (both share every row)
    for two in (two_process_runs / "whole", two_process_runs / "sp"):
        assert same(weights(tmp_path / "one" / "final"), weights(two / "final"), atol=1e-5)
        # Adam hides a gradient off by a constant factor from the weights; the norm does not
        norms = [[r["grad_norm"] for r in metrics_rows(f)] for f in (tmp_path / "one", two)]
        assert norms[1] == pytest.approx(norms[0], rel=1e-4)
        # the loss and token counts are the global batch's, once, however the work was split
        losses = [[r["loss"] for r in metrics_rows(f)] for f in (tmp_path / "one", two)]
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)


@pytest.mark.slow
def test_saved_folder_loads_with_auto_classes(tmp_path, synth_dir, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    done = reasoner(*args(synth_dir, tiny_model_dir, out, "run.max_steps=2"))
    assert done.returncode == 0, done.stderr
    assert "final model" in done.stdout and "steps" in done.stdout
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tok = AutoTokenizer.from_pretrained(out / "final")
    assert tok.chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    gen = json.loads((out / "final" / "generation_config.json").read_text())
    assert tok.eos_token_id in gen["eos_token_id"]
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]
    rerun = reasoner(*args(synth_dir, tiny_model_dir, out, "run.max_steps=2"))
    assert rerun.returncode == 0  # finished with the same config: nothing to do


def test_a_sequence_parallel_size_that_cannot_run_is_refused_at_start(tmp_path, synth_dir,
                                                                     tiny_model_dir):
    """The tiny model's 4 query heads do not split into 3; 2 processes per row need a multiple
    of 2 processes; padded rows cannot be split: each a one-paragraph error before any work."""
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "a", "run.sequence_parallel=3"))
    assert r.returncode == 2 and "it has 4 query heads and 2 key/value heads" in r.stderr
    assert "Sizes this model allows: 2, 4" in r.stderr
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "b", "run.sequence_parallel=2"))
    assert r.returncode == 2 and "does not divide the 1 processes into whole groups" in r.stderr
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "c", "run.sequence_parallel=2",
                       "packing=false"))
    assert r.returncode == 2 and "splits packed rows: set packing=true" in r.stderr
    assert not any((tmp_path / n).exists() for n in "abc")


def test_bad_inputs_give_clear_errors(tmp_path, synth_dir, tiny_model_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "a", f"data.path={empty}"))
    assert r.returncode == 2 and "holds no examples" in r.stderr
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "b", "max_tokens=5"))
    assert r.returncode == 2 and "longer than max_tokens=5" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "only"}\n')
    r = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "c", f"data.path={bad}"))
    assert r.returncode == 2 and f"{bad}:2: needs 'prompt' and 'response', or 'messages'" in r.stderr
    for name in ("a", "b", "c"):
        assert not (tmp_path / name / "final").exists()


def test_non_finite_loss_stops_and_names_the_step(tmp_path, synth_dir, tiny_model_dir):
    out = tmp_path / "nan"
    r = reasoner(*args(synth_dir, tiny_model_dir, out, "optim.lr=1e30", "optim.grad_clip=null",
                       "optim.warmup_ratio=0", "run.save_every=1", "run.keep_last=10"))
    assert r.returncode == 2, r.stderr
    assert "non-finite loss" in r.stderr and "no update was applied" in r.stderr
    step = int(r.stderr.split("at step ")[1].split(";")[0])
    assert step >= 2
    assert f"checkpoint-{step - 1}" in r.stderr
    assert not (out / "final").exists()
    assert not json.loads((out / "manifest.json").read_text())["complete"]


def metrics_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("sft-two-processes")
def test_fp16_loss_scaling_skips_overflowing_steps_on_every_rank(tmp_path, synth_dir, tiny_model_dir,
                                                                  two_process_runs):
    """fp16 autocast (on CPU too): a loss scale of 2^60 overflows every gradient, so no update is
    applied and the scale halves; from 2^20 the scale backs off until steps apply. Two FSDP2
    processes (ShardedGradScaler) gather fp16 parameters, as a 32B run does, where one process
    keeps fp32 weights under fp16 autocast: they skip exactly the same steps and end within
    1e-4 of each other."""
    never = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "never", *FP16,
                           "optim.loss_scale=1.152921504606847e18", "run.max_steps=2"))
    assert never.returncode == 0, never.stderr
    rows = metrics_rows(tmp_path / "never")
    assert [r["overflow_skipped"] for r in rows] == [1.0, 1.0]
    assert [r["loss_scale"] for r in rows] == [2.0 ** 60, 2.0 ** 59]
    start = load_file(next(tiny_model_dir.glob("*.safetensors")))
    final = weights(tmp_path / "never" / "final")
    assert all(torch.equal(final[k], start[k]) for k in final if k in start)

    one = reasoner(*args(synth_dir, tiny_model_dir, tmp_path / "one", *FP16_BACKOFF))
    assert one.returncode == 0, one.stderr
    rows = metrics_rows(tmp_path / "one")
    skipped = [r["overflow_skipped"] for r in rows]
    assert skipped[0] == 1.0 and 0.0 in skipped  # backs off, then trains
    for a, b in zip(rows, rows[1:], strict=False):  # halves after a skip, else holds
        assert b["loss_scale"] == a["loss_scale"] * (0.5 if a["overflow_skipped"] else 1.0)
    assert not same(weights(tmp_path / "one" / "final"), start, atol=0)
    two = two_process_runs / "fp16"
    assert [r["loss_scale"] for r in metrics_rows(two)] == [r["loss_scale"] for r in rows]
    assert same(weights(tmp_path / "one" / "final"), weights(two / "final"), atol=1e-4)


@pytest.mark.slow
@pytest.mark.xdist_group("sft-two-processes")
def test_two_processes_resume_from_a_sharded_checkpoint(tmp_path, synth_dir, tiny_model_dir,
                                                        two_process_runs):
    """Two processes save checkpoints without gathering anything whole: weights streamed one
    tensor at a time into safetensors files, each process's optimiser shards under optimizer/.
    Resuming from checkpoint-2 ends with the weights of the uninterrupted run."""
    whole = two_process_runs / "whole"
    ckpt = whole / "checkpoint-2"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "optimizer" / ".metadata").exists()
    assert len(list((ckpt / "optimizer").glob("*.distcp"))) == 2  # one file per process
    assert not (whole / "final" / "optimizer").exists()
    # an interrupted run: only checkpoint-2 survived
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for extra in ("checkpoint-4", "final"):
        shutil.rmtree(cut / extra)
    manifest = json.loads((cut / "manifest.json").read_text())
    (cut / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    done = subprocess.run(
        reasoner_on_two_processes(*args(synth_dir, tiny_model_dir, cut, *SHARDED)),
        capture_output=True, text=True, timeout=600, env=SUBPROCESS_ENV)
    assert done.returncode == 0, why(done)
    manifest = json.loads((cut / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["resumed_from"] == 2
    assert same(weights(cut / "final"), weights(whole / "final"), atol=1e-6)
