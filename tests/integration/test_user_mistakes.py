"""What a user meets on a mistake or in a batch log: one paragraph and exit 2 (never a
traceback), a rerun after the fix that just runs, results on stdout and logs on stderr, help
that lists every key and choice."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests_helpers import SUBPROCESS_ENV, reasoner

REPO = Path(__file__).resolve().parents[2]
QS = REPO / "configs" / "quickstart"


def one_paragraph(out, *phrases):
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 3, out.stderr
    for phrase in phrases:
        assert phrase in out.stderr, out.stderr


def test_a_typo_in_a_model_folder_is_one_line_and_the_fixed_rerun_just_runs(tmp_path, synth_dir,
                                                                            tiny_model_dir):
    args = ["infer", QS / "infer.yaml", f"data.path={synth_dir}/test_problems", "data.limit=2",
            f"output_dir={tmp_path}/samples", "sampling.n=1", "sampling.max_tokens=4"]
    typo = f"{tiny_model_dir}l"
    out = reasoner(*args, f"model.name_or_path={typo}")
    one_paragraph(out, f"model.name_or_path={typo}: no such model folder (did you mean "
                       f"{tiny_model_dir}?)")
    assert not (tmp_path / "samples").exists()  # nothing claimed: no lock, no manifest
    fixed = reasoner(*args, f"model.name_or_path={tiny_model_dir}")  # no overwrite=true needed
    assert fixed.returncode == 0, fixed.stderr
    for command, config in (("sft", "sft.yaml"), ("eval", "eval.yaml")):
        extra = ["bench"] if command == "eval" else []
        out = reasoner(command, *extra, QS / config, f"model.name_or_path={typo}",
                       f"output_dir={tmp_path}/{command}")
        one_paragraph(out, "no such model folder")


def test_a_hub_id_offline_and_a_local_data_typo_fail_at_once(tmp_path, tiny_model_dir,
                                                             synth_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = reasoner("infer", QS / "infer.yaml", "model.name_or_path=nobody/nothing",
                   f"data.path={synth_dir}/test_problems", f"output_dir={tmp_path}/s")
    one_paragraph(out, "not in the hub cache while offline")
    out = reasoner("infer", QS / "infer.yaml", f"model.name_or_path={tiny_model_dir}",
                   f"data.path={tmp_path}/nowhere/problems", f"output_dir={tmp_path}/s")
    one_paragraph(out, f"data.path={tmp_path}/nowhere/problems: no such file or folder")


def test_eval_compare_names_a_missing_folder_and_a_file_that_is_no_report(tmp_path):
    one_paragraph(reasoner("eval", "compare", tmp_path / "eval-sft", tmp_path / "eval-rl"),
                  f"{tmp_path}/eval-sft: no such eval folder or report.json")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps({"benchmark": "x", "pass@1": 0.5}))
    one_paragraph(reasoner("eval", "compare", tmp_path / "a", tmp_path / "a"),
                  "is not an eval report: it lacks pass@1_ci95, maj@k, mean_response_tokens, "
                  "per_problem")


def test_results_go_to_stdout_unwrapped_and_logs_to_stderr(tmp_path):
    out = reasoner("data", "synth", QS / "data_synth.yaml",
                   f"output_dir={tmp_path}/a-rather-long-folder-name/for/the/data",
                   "num_train=20", "num_test=5")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if "train_problems" in line)
    assert f"{tmp_path}/a-rather-long-folder-name/for/the/data/train_problems" in row  # one line
    assert "done in" in out.stderr and "done in" not in out.stdout
    assert "train_problems" not in out.stderr


def test_help_lists_choices_accepts_h_and_config_show_lists_every_key():
    assert reasoner("sft", "-h").returncode == 0
    assert "--show-completion" in reasoner("--help").stdout
    out = reasoner("eval", "aime", "m", "--year", "2023")
    words = " ".join(out.stderr.replace("│", " ").split())
    assert out.returncode == 2 and "'2023' is not one of '2024', '2025', 'all'" in words, words
    assert "<fsdp|mindspeed>" in reasoner("plan", "--help").stdout
    shown = reasoner("config", "show", "train-offline").stdout
    assert "objective.neg_scope" in shown and "all|divergent|first" in shown
    assert "objective.gamma" in shown and "run.global_batch" in shown and "(required)" in shown
    out = reasoner("config", "show", "finetune")
    assert out.returncode == 2 and "unknown stage 'finetune'; one of:" in out.stderr


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_the_verifier_works_from_a_plain_script_and_from_stdin(tmp_path, how):
    """The verifier's workers start without the caller's main module: a plain script without a
    main guard, or code on stdin, works (re-running it in each worker ends in EOFError)."""
    code = ("from reasoner.verify.rules import is_equivalent\n"
            "print(is_equivalent('1/2', '0.5'), is_equivalent('1/2', '0.4'))\n")
    script = tmp_path / "check.py"
    script.write_text(code)
    run = ([sys.executable, str(script)] if how == "script" else [sys.executable, "-"])
    out = subprocess.run(run, input=None if how == "script" else code, capture_output=True,
                         text=True, timeout=300, env=SUBPROCESS_ENV)
    assert out.returncode == 0 and out.stdout.split() == ["True", "False"], out.stderr
