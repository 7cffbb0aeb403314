"""`reasoner train-offline` through the real CLI: resume after SIGKILL, 1 vs 2 processes, the
stored behaviour log-probs of real infer and verify."""

import json
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
    reasoner_jobs_on_two_processes,
    run_jobs_on_two_processes,
    why,
)

REPO = Path(__file__).resolve().parents[2]


def args(model, verified, out, *extra):
    return ["train-offline", str(REPO / "configs/quickstart/train_offline.yaml"),
            f"model.name_or_path={model}", f"input_dir={verified}", f"output_dir={out}",
            "packing=true", "seq_len=256", "max_tokens=256", "run.global_batch=6", "run.max_steps=6",
            "run.progress=false", "optim.lr=1e-3", *extra]


def same(a: Path, b: Path, atol: float) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.allclose(x[k], y[k], atol=atol, rtol=0) for k in x)


@pytest.mark.slow
def test_resume_after_sigkill_same_weights(tmp_path, tiny_model_dir, verified_dir):
    ref = reasoner(*args(tiny_model_dir, verified_dir, tmp_path / "ref", "objective={name: dapo}"))
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "reasoner", *args(tiny_model_dir, verified_dir, out,
                                                    "objective={name: dapo}", "run.save_every=2",
                                                    "run.keep_last=5")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=SUBPROCESS_ENV)
    deadline = time.time() + 300
    while not (out / "checkpoint-2").exists():
        assert proc.poll() is None and time.time() < deadline, "ended before checkpoint-2"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = reasoner(*args(tiny_model_dir, verified_dir, out, "objective={name: dapo}",
                           "run.save_every=2", "run.keep_last=5"))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["resumed_from"] >= 2
    assert same(out / "final", tmp_path / "ref" / "final", 1e-6)
    assert "objective" in again.stdout and "dapo" in again.stdout


@pytest.mark.slow
def test_dapo_takes_the_stored_logprobs_of_samples_drawn_as_scored(tmp_path, synth_dir,
                                                                   tiny_model_dir):
    """Real infer (sampling.logprobs=true, temperature 1, no top-k / top-p) and verify, then
    dapo: it follows the verified set's manifest to the samples' settings, takes the stored
    log-probs as pi_old, and the first-samples check compares them with its own."""
    samples, verified, out = tmp_path / "samples", tmp_path / "verified", tmp_path / "dapo"
    made = reasoner("infer", REPO / "configs/quickstart/infer.yaml",
                    f"model.name_or_path={tiny_model_dir}", f"output_dir={samples}",
                    f"data.path={synth_dir / 'train_problems'}", "data.limit=6", "sampling.n=4",
                    "sampling.max_tokens=16", "sampling.temperature=1.0", "sampling.top_k=0",
                    "sampling.top_p=1.0", "progress=false")
    assert made.returncode == 0, made.stderr
    made = reasoner("verify", REPO / "configs/quickstart/verify.yaml", f"input_dir={samples}",
                    f"output_dir={verified}", "filters.drop_zero_variance=false", "workers=1",
                    "progress=false")  # the random tiny model gets every problem wrong
    assert made.returncode == 0, made.stderr
    run = reasoner(*args(tiny_model_dir, verified, out, "objective={name: dapo}"))
    assert run.returncode == 0, run.stderr
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["behaviour_logprobs"].startswith(
        "stored by infer (stored vs trainer on 16 samples: mean |Δ| 0.0000, max 0.0000")
    assert counts["behaviour_max_abs_diff"] < 1e-4  # hf's sampler scores as the trainer does
    assert abs(counts["behaviour_ratio_mean"] - 1) < 1e-4
    assert "stored by infer" in run.stdout


OBJECTIVES = [
    "{name: pcl}",
    # reference log-probs: each process scores its share. (eps 1e-3, as for OREAL below: the
    # vocab-parallel softmax sums its two halves in another order than one process, and at the
    # default eps AdamW turns the rounding in near-zero gradients into lr-sized steps: 1.05e-5)
    "{name: dapo, kl_coef: 0.01} optim.eps=1e-3",
    "{name: prorl, kl_coef: 0.01, reset_every: 2} optim.eps=1e-3",  # a resident, sharded
    # reference; resets
    # moving average, shard by shard (eps 1e-3 for the sequence-parallel run: 1.8e-5 apart at
    # 1e-8, the same rounding in near-zero gradients as dapo's above)
    "{name: discounted, kl_coef: 0.01, ref_update_every: 1} optim.eps=1e-3",
    # OREAL at AdamW's default eps 1e-8 is left out: a fresh token RM's weights clip(2p - 1) ~ 0
    # leave near-zero policy gradients, which AdamW turns into lr-sized steps whose sign follows
    # float rounding, so whether 1 and 2 processes agree depends on the CPU (3e-4 apart on one
    # machine, equal on another). With eps 1e-3 the update is linear in such gradients:
    "{name: oreal} optim.eps=1e-3",
]


def overrides(objective: str) -> list[str]:
    objective, *extra = objective.split(" optim.")
    return ["run.max_steps=3", f"objective={objective}", *(f"optim.{e}" for e in extra)]


# The objectives also run with sequence parallelism (run.sequence_parallel=2: both processes
# share every packed row): the per-sample terms (pcl's geometric mean, discounted's and dapo's
# sequence-level pieces, OREAL's token RM) span the two slices. Indices into OBJECTIVES.
SEQUENCE_PARALLEL = [0, 1, 3, 4]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory, synth_dir, tiny_shape, tiny_model_dir, verified_dir):
    """Every 2-process run of this module, one after another in one torchrun (the processes'
    start is most of each run's time on a slow machine): each objective on the tied tiny model,
    and pcl on an untied one. Returns the folder holding <case>/two and the untied model."""
    from reasoner import models
    from reasoner.config import TinyConfig

    untied = models.build_tiny(TinyConfig(
        output_dir=tmp_path_factory.mktemp("untied") / "model", corpus=[synth_dir / "sft"],
        model=tiny_shape.model_copy(update={"tie_word_embeddings": False})))

    def jobs_in(root: Path) -> list[list]:
        jobs = [args(tiny_model_dir, verified_dir, root / str(k) / "two", *overrides(o))
                for k, o in enumerate(OBJECTIVES)]
        jobs += [args(tiny_model_dir, verified_dir, root / str(k) / "sp",
                      *overrides(OBJECTIVES[k]), "run.sequence_parallel=2")
                 for k in SEQUENCE_PARALLEL]

        def resumable(out):  # dapo under sequence parallelism, checkpointed every 2 of 4 steps
            return args(tiny_model_dir, verified_dir, out, *overrides(OBJECTIVES[1]),
                        "run.sequence_parallel=2", "run.max_steps=4", "run.save_every=2",
                        "run.keep_last=5")

        jobs += [resumable(root / "sp-whole"), ["--cut", root / "sp-whole", root / "sp-cut", 2],
                 resumable(root / "sp-cut")]
        jobs.append(args(tiny_model_dir, verified_dir, root / "bf16", *overrides(OBJECTIVES[2]),
                         "model.dtype=bfloat16"))  # prorl: a moving reference in aux/
        for layout in ("fsdp", "vocab-parallel"):
            jobs.append(args(untied, verified_dir, root / f"untied-{layout}" / "two",
                             *overrides("{name: pcl}"), f"run.vocab_layout={layout}"))
        return jobs

    root = run_jobs_on_two_processes(jobs_in, lambda: tmp_path_factory.mktemp("two_process"))
    return root, untied


@pytest.mark.slow
@pytest.mark.xdist_group("train-offline-two-processes")  # one worker makes the fixture's runs
@pytest.mark.parametrize("case", range(len(OBJECTIVES)), ids=[o.split(",")[0].split()[-1].strip("{}")
                                                               for o in OBJECTIVES])
def test_two_processes_match_one(tmp_path, tiny_model_dir, verified_dir, two_process_runs, case):
    """Every model of a 2-process run is FSDP2-sharded as it loads (no process holds it whole);
    the weights and the reference log-probs equal those of one process."""
    root, _ = two_process_runs
    one = reasoner(*args(tiny_model_dir, verified_dir, tmp_path / "one", *overrides(OBJECTIVES[case])))
    assert one.returncode == 0, one.stderr
    two = root / str(case) / "two"
    assert same(tmp_path / "one" / "final", two / "final", 1e-5)
    aux = two / "checkpoint-3" / "aux"  # token RM / moving reference: each process its shards
    if "oreal" in OBJECTIVES[case] or "reset_every" in OBJECTIVES[case] or "ref_update" in OBJECTIVES[case]:
        assert sorted(p.name for p in aux.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    else:
        assert not aux.exists()
    if case in SEQUENCE_PARALLEL:  # the same run with both processes sharing every row
        sp = root / str(case) / "sp"
        assert same(tmp_path / "one" / "final", sp / "final", 1e-5)
        counts = json.loads((sp / "manifest.json").read_text())["counts"]
        assert counts["processes"] == 2 and counts["sequence_parallel"] == 2
    refs = [tmp_path / "one" / "ref_logprobs", two / "ref_logprobs"]
    if refs[0].exists():
        from reasoner.shards import iter_rows, part_files

        assert len(part_files(refs[1])) == 2  # one part per process
        lp = [{(r["id"], r["sample_idx"]): r["logprobs"] for r in iter_rows(f)} for f in refs]
        assert lp[0].keys() == lp[1].keys()
        assert all(lp[1][k] == pytest.approx(lp[0][k], abs=1e-5) for k in lp[0])


@pytest.mark.slow
@pytest.mark.xdist_group("train-offline-two-processes")
def test_a_bf16_run_publishes_bf16_weights_without_the_auxiliary_models(two_process_runs):
    """ProRL in bf16 on 2 processes: the checkpoint keeps fp32 masters and the moving
    reference's shards (aux/) for the resume; `final/` holds bf16 weights and no aux/."""
    from safetensors import safe_open

    root, _ = two_process_runs
    out = root / "bf16"
    assert (out / "checkpoint-3" / "aux").is_dir() and not (out / "final" / "aux").exists()
    for folder, want in ((out / "final", "BF16"), (out / "checkpoint-3", "F32")):
        for f in folder.glob("*.safetensors"):
            with safe_open(f, "pt") as st:
                assert {st.get_slice(k).get_dtype() for k in st.keys()} == {want}
    assert json.loads((out / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["final_dtype"] == "bfloat16"


@pytest.mark.slow
@pytest.mark.xdist_group("train-offline-two-processes")
def test_a_sequence_parallel_run_resumes_to_the_uninterrupted_weights(two_process_runs):
    """dapo with both processes sharing every row, killed after checkpoint-2 of 4 and resumed:
    the same final weights as the run that was never interrupted."""
    root, _ = two_process_runs
    counts = json.loads((root / "sp-cut" / "manifest.json").read_text())["counts"]
    assert counts["resumed_from"] == 2
    assert same(root / "sp-whole" / "final", root / "sp-cut" / "final", 1e-6)


@pytest.mark.slow
def test_four_processes_two_rows_at_a_time_each_shared_by_two(tmp_path, tiny_model_dir,
                                                              verified_dir):
    """4 processes: 2 data-parallel groups of 2 sequence-parallel processes each (FSDP2 over all
    4). A global batch of 5 samples, one per 256-token row (the fixture's shortest two do not
    fit one row), gives the groups 3 and 2 micro-batches: the second runs a dummy pass. dapo
    with a KL term ends with one process's weights."""
    uneven = [*overrides(OBJECTIVES[1]), "run.global_batch=5", "run.micro_batch=1"]
    one = reasoner(*args(tiny_model_dir, verified_dir, tmp_path / "one", *uneven))
    assert one.returncode == 0, one.stderr
    four = tmp_path / "four"
    job = args(tiny_model_dir, verified_dir, four, *uneven, "run.sequence_parallel=2")
    done = subprocess.run(reasoner_jobs_on_two_processes([job], tmp_path, processes=4),
                          capture_output=True, text=True, timeout=1200, env=SUBPROCESS_ENV)
    assert done.returncode == 0, why(done)
    assert same(tmp_path / "one" / "final", four / "final", 1e-5)
    counts = json.loads((four / "manifest.json").read_text())["counts"]
    assert (counts["processes"], counts["sequence_parallel"]) == (4, 2)


@pytest.mark.slow
@pytest.mark.xdist_group("train-offline-two-processes")
@pytest.mark.parametrize("layout", ["fsdp", "vocab-parallel"])
def test_two_processes_match_one_with_an_untied_embedding(tmp_path, verified_dir, two_process_runs,
                                                          layout):
    """Untied embeddings (Qwen2.5-32B's layout), split either way (run.vocab_layout): two
    vocab-parallel matrices, or two FSDP2 units of their own (the lm-head computing its
    log-probs inside its forward); 2 processes still give 1's weights."""
    root, untied = two_process_runs
    weights = load_file(untied / "model.safetensors")
    assert not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    one = reasoner(*args(untied, verified_dir, tmp_path / "one", *overrides("{name: pcl}")))
    assert one.returncode == 0, one.stderr
    assert same(tmp_path / "one" / "final", root / f"untied-{layout}" / "two" / "final", 1e-5)
    counts = json.loads((root / f"untied-{layout}" / "two" / "manifest.json").read_text())["counts"]
    assert (counts["processes"], counts["vocab_layout"]) == (2, layout)
