"""The CLI as a user runs it: the entry point and a crash in real processes, the rest through
the same command line inside the test process."""

import json
import subprocess
import sys
from pathlib import Path

from tests_helpers import reasoner

REPO = Path(__file__).resolve().parents[2]


def entry_point(*args: str) -> subprocess.CompletedProcess:
    """`python -m reasoner *args` in a new process."""
    return subprocess.run([sys.executable, "-m", "reasoner", *args], capture_output=True,
                          text=True, timeout=300)


def test_version_and_help_list_commands():
    out = entry_point("--version")
    assert out.returncode == 0 and out.stdout.strip() == "reasoner 0.1.0"
    help_text = entry_point("--help").stdout
    assert "data" in help_text and "model" in help_text
    assert "synth" in reasoner("data", "--help").stdout


def test_data_synth_and_model_tiny_from_shipped_configs(tmp_path):
    out = reasoner("data", "synth", str(REPO / "configs/quickstart/data_synth.yaml"),
                   f"output_dir={tmp_path}/data", "num_train=50", "num_test=10")
    assert out.returncode == 0, out.stderr
    assert "examples=50" in out.stdout
    for name, count in (("train_problems", 50), ("test_problems", 10), ("sft", 50)):
        manifest = json.loads((tmp_path / "data" / name / "manifest.json").read_text())
        assert manifest["complete"] and manifest["config"]["num_train"] == 50
        assert len((tmp_path / "data" / name / "part-00000.jsonl").read_text().splitlines()) == count
    out = reasoner("model", "tiny", str(REPO / "configs/quickstart/tiny_model.yaml"),
                   f"output_dir={tmp_path}/model", f"corpus=[{tmp_path}/data/sft]",
                   "model.num_hidden_layers=1")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "model" / "model.safetensors").exists()
    assert "Qwen2ForCausalLM, 1 layers" in out.stdout


def test_bad_config_stops_before_work_with_exit_2(tmp_path):
    out = reasoner("data", "synth", str(REPO / "configs/quickstart/data_synth.yaml"),
                   f"output_dir={tmp_path}/data", "num_trian=5")
    assert out.returncode == 2
    assert "did you mean 'num_train'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists()


def test_user_errors_are_one_paragraph_and_bugs_keep_their_traceback(tmp_path):
    """A user error (here: an empty corpus) exits 2 with its message alone; any other exception
    raised inside a stage (here: a RuntimeError, as a CUDA OOM or NCCL failure would be) keeps its
    traceback and is not dressed up as a user error."""
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    out = reasoner("model", "tiny", str(REPO / "configs/quickstart/tiny_model.yaml"),
                   f"output_dir={tmp_path}/m", f"corpus=[{data}]")
    assert out.returncode == 2 and "holds no text" in out.stderr and "Traceback" not in out.stderr
    crash = ("import sys, reasoner.models.tiny as m\n"
             "def boom(cfg): raise RuntimeError('CUDA out of memory (simulated)')\n"
             "m.build_tiny = boom\n"
             "from reasoner.cli import app\n"
             "sys.argv = ['reasoner', *sys.argv[1:]]\n"
             "app()\n")
    out = subprocess.run([sys.executable, "-c", crash, "model", "tiny",
                          str(REPO / "configs/quickstart/tiny_model.yaml"), f"output_dir={tmp_path}/m"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "RuntimeError: CUDA out of memory (simulated)" in out.stderr
