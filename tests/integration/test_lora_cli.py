"""LoRA through the CLI on 2 processes (FSDP2, adapters sharded like every parameter) against
1: sft, its resume, and train-offline with a fixed, a reset and a moving reference."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests_helpers import reasoner, run_jobs_on_two_processes

pytest.importorskip("peft")

REPO = Path(__file__).resolve().parents[2]
LORA = "model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj, o_proj, up_proj, down_proj]}"


def sft_args(synth_dir, model_dir, out, *extra):
    return ["sft", str(REPO / "configs/quickstart/sft.yaml"), f"model.name_or_path={model_dir}",
            f"data.path={synth_dir}/sft", f"output_dir={out}", "data.limit=32", "seq_len=600",
            "max_tokens=600", "run.global_batch=4", "run.micro_batch=1", "run.epochs=1",
            "run.max_steps=4", "run.save_every=2", "run.keep_last=5", "run.progress=false",
            "optim.lr=1e-2", LORA, *extra]


def offline_args(model_dir, verified, out, objective, *extra):
    return ["train-offline", str(REPO / "configs/quickstart/train_offline.yaml"),
            f"model.name_or_path={model_dir}", f"input_dir={verified}", f"output_dir={out}",
            "packing=true", "seq_len=256", "max_tokens=256", "run.global_batch=6",
            "run.max_steps=3", "run.progress=false", "optim.lr=1e-2", "optim.eps=1e-3",
            f"objective={objective}", LORA, *extra]


OBJECTIVES = {
    "pcl": "{name: pcl}",
    "dapo": "{name: dapo, kl_coef: 0.01}",  # the KL's reference is the base (B = 0 at start)
    "oreal": "{name: oreal}",  # its token RM is a whole model beside the LoRA policy
    "prorl": "{name: prorl, kl_coef: 0.01, reset_every: 2}",  # a second adapter set, reset
    "discounted": "{name: discounted, kl_coef: 0.01, ref_update_every: 1}",  # ... averaged
}


def same(a: Path, b: Path, atol: float, file: str = "model.safetensors") -> bool:
    x, y = load_file(a / file), load_file(b / file)
    return x.keys() == y.keys() and all(torch.allclose(x[k], y[k], atol=atol, rtol=0) for k in x)


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory, synth_dir, tiny_model_dir, verified_dir):
    """Every 2-process LoRA run of this module in one torchrun."""
    def jobs(root: Path) -> list[list]:
        return [sft_args(synth_dir, tiny_model_dir, root / "sft"),
                ["--cut", root / "sft", root / "sft-cut", 2],
                sft_args(synth_dir, tiny_model_dir, root / "sft-cut"),
                *[offline_args(tiny_model_dir, verified_dir, root / name, objective)
                  for name, objective in OBJECTIVES.items()]]

    return run_jobs_on_two_processes(jobs, lambda: tmp_path_factory.mktemp("lora_two_process"))


@pytest.mark.slow
@pytest.mark.xdist_group("lora-two-processes")
def test_lora_sft_on_two_processes_matches_one_and_resumes(tmp_path, synth_dir, tiny_model_dir,
                                                           two_process_runs):
    one = reasoner(*sft_args(synth_dir, tiny_model_dir, tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    two = two_process_runs / "sft"
    for file in ("model.safetensors", "adapter/adapter_model.safetensors"):
        assert same(tmp_path / "one" / "final", two / "final", 1e-5, file), file
    # every process wrote its shards of the adapters' optimiser state; the merged weights and
    # the adapters were gathered once
    assert (two / "checkpoint-2" / "optimizer" / ".metadata").exists()
    cut = two_process_runs / "sft-cut"
    assert json.loads((cut / "manifest.json").read_text())["counts"]["resumed_from"] == 2
    for file in ("model.safetensors", "adapter/adapter_model.safetensors"):
        assert same(two / "final", cut / "final", 1e-6, file), file


@pytest.mark.slow
@pytest.mark.xdist_group("lora-two-processes")
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_lora_train_offline_on_two_processes_matches_one(tmp_path, tiny_model_dir, verified_dir,
                                                         two_process_runs, name):
    one = reasoner(*offline_args(tiny_model_dir, verified_dir, tmp_path / "one",
                                 OBJECTIVES[name]))
    assert one.returncode == 0, one.stderr
    two = two_process_runs / name
    assert same(tmp_path / "one" / "final", two / "final", 1e-5)
    assert same(tmp_path / "one" / "final", two / "final", 1e-5,
                "adapter/adapter_model.safetensors")
    # no second policy model anywhere: only OREAL's token RM has shards of its own
    assert (two / "checkpoint-3" / "aux").exists() == (name == "oreal")
    moving = name in ("prorl", "discounted")
    assert (two / "checkpoint-3" / "reference-adapter").is_dir() == moving
    if moving:
        assert same(tmp_path / "one" / "checkpoint-3", two / "checkpoint-3", 1e-5,
                    "reference-adapter/adapter_model.safetensors")
