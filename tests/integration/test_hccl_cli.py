"""HCCL's time-out reaches a trainer's environment before `import torch` loads the device
backends (torch_npu reads it then), seen by a stand-in backend torch loads as it would
torch_npu: through the `torch.backends` entry points (TORCH_DEVICE_BACKEND_AUTOLOAD)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests_helpers import SUBPROCESS_ENV

REPO = Path(__file__).resolve().parents[2]

STAND_IN = '''"""A device backend as torch_npu registers itself: each process that loads it
adds a line, the HCCL_EXEC_TIMEOUT it sees at import."""
import os

with open(os.environ["FAKE_NPU_RECORD"], "a") as f:
    f.write(repr(os.environ.get("HCCL_EXEC_TIMEOUT")) + "\\n")


def autoload():
    """What torch calls once the module is imported (torch_npu's `_autoload`)."""
'''


def stand_in_backend(root: Path) -> Path:
    """`fake_npu_backend`, installed in `root` as a package with its dist-info; returns where
    it writes the HCCL_EXEC_TIMEOUT each process saw (a line each, repr: None when unset)."""
    (root / "fake_npu_backend").mkdir()
    (root / "fake_npu_backend" / "__init__.py").write_text(STAND_IN)
    info = root / "fake_npu_backend-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake_npu_backend\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nfake = fake_npu_backend:autoload\n")
    return root / "record"


def env_with(backends: Path, record: Path) -> dict[str, str]:
    env = {k: v for k, v in SUBPROCESS_ENV.items()
           if k not in ("HCCL_EXEC_TIMEOUT", "HCCL_OP_EXPANSION_MODE")}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="1", FAKE_NPU_RECORD=str(record),
               PYTHONPATH=os.pathsep.join([str(backends), *sys.path]))
    return env


def test_the_stand_in_is_loaded_by_import_torch(tmp_path):
    """The premise: this torch imports a registered backend at `import torch`, as it would
    torch_npu, and the backend sees the environment of that moment."""
    record = stand_in_backend(tmp_path)
    env = env_with(tmp_path, record) | {"HCCL_EXEC_TIMEOUT": "77"}
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
    assert record.read_text().splitlines() == ["'77'"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "train-offline"])
def test_a_trainer_sets_hccl_timeout_before_torch_loads_the_backends(tmp_path, tiny_model_dir,
                                                                      stage):
    """`reasoner sft | train-offline` on an NPU: the backends torch loads at import see
    HCCL_EXEC_TIMEOUT = run.dist_timeout_min in seconds. (The run then stops where it picks
    the NPU: torch_npu is absent here.)"""
    record = stand_in_backend(tmp_path)
    config = {"sft": ["configs/quickstart/sft.yaml", f"data.path={tmp_path}/no-data"],
              "train-offline": ["configs/quickstart/train_offline.yaml",
                                f"input_dir={tmp_path}/no-rollouts"]}[stage]
    done = subprocess.run(
        [sys.executable, "-m", "reasoner", stage, str(REPO / config[0]), config[1],
         f"model.name_or_path={tiny_model_dir}", "model.device=npu", f"output_dir={tmp_path}/out",
         "run.dist_timeout_min=45", "run.progress=false"],
        env=env_with(tmp_path, record), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "torch_npu is missing" in done.stderr, done.stderr
    assert record.exists(), f"torch did not load the stand-in backend: {done.stderr}"
    assert record.read_text().splitlines() == ["'2700'"], done.stderr  # 45 min


@pytest.mark.slow
def test_a_trainer_off_ascend_leaves_hccl_alone(tmp_path, tiny_model_dir):
    """On a GPU or CPU (no torch_npu, model.device not npu) no HCCL_EXEC_TIMEOUT is set: its
    cap (17,340 s) must not refuse a long time-out that NCCL or gloo take."""
    record = stand_in_backend(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "reasoner", "sft", str(REPO / "configs/quickstart/sft.yaml"),
         f"data.path={tmp_path}/no-data", f"model.name_or_path={tiny_model_dir}",
         "model.device=auto", f"output_dir={tmp_path}/out", "run.dist_timeout_min=600"],
        env=env_with(tmp_path, record), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "above the" not in done.stderr, done.stderr
    assert record.read_text().splitlines() == ["None"]


@pytest.mark.slow
def test_a_recipe_starts_an_ascend_trainer_in_a_process_that_sets_it_first(tmp_path, synth_dir,
                                                                           tiny_model_dir):
    """`reasoner run`: the recipe's own process imports torch (its memory plan, its device
    check) with no HCCL_EXEC_TIMEOUT; a trainer on an NPU is never run in it but started as
    `reasoner sft` (or under its launcher, torchrun), which sets it before its torch loads."""
    import yaml

    record = stand_in_backend(tmp_path)
    recipe = {"run_dir": str(tmp_path / "run"), "stages": [
        {"name": "sft", "command": "sft", "config": str(REPO / "configs/quickstart/sft.yaml"),
         "set": {"model.name_or_path": str(tiny_model_dir), "data.path": f"{synth_dir}/sft",
                 "model.device": "npu", "run.dist_timeout_min": 45}}]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    done = subprocess.run([sys.executable, "-m", "reasoner", "run", str(path), "--no-plan"],
                          env=env_with(tmp_path, record), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2 and "torch_npu is missing" in done.stderr, done.stderr
    assert record.read_text().splitlines() == ["None", "'2700'"], done.stderr
