"""`reasoner ls`, `reasoner cp` and recipes named where a path is expected, run from an empty
folder outside the repository (the installed wheel's own run: test_wheel.py)."""

from pathlib import Path

from test_recipes import hub_holding_everything
from tests_helpers import reasoner

from reasoner import shipped


def test_ls_lists_every_recipe_with_its_purpose_and_hardware():
    out = reasoner("ls")
    assert out.returncode == 0, out.stderr
    for name, recipe in shipped.RECIPES.items():
        row = next(line for line in out.stdout.splitlines() if line.startswith(f"│ {name} "))
        assert recipe.purpose in row and recipe.hardware in row, row
    assert "configs/judge/pcl_prompt.txt" in out.stdout and "reasoner cp" in out.stdout


def test_every_shipped_recipe_runs_by_name_from_an_empty_folder(tmp_path, monkeypatch):
    """The pcl recipe's judge reads `configs/judge/pcl_prompt.txt`: the package's, found."""
    hub_holding_everything(monkeypatch)
    for name in shipped.RECIPES:
        out = reasoner("run", name, "run_dir=run", "--dry-run", cwd=tmp_path)
        if name in ("quickstart/recipe_vllm", "smollm2_cpu"):  # read another run's folders
            assert out.returncode == 2 and "=runs/" in out.stderr, (name, out.stderr)
            continue
        assert out.returncode == 0, (name, out.stderr)
        assert f"reasoner run {shipped.recipe_file(name)}" not in out.stderr  # a plan, no table
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
    out = reasoner("plan", "pcl_reasoner_v1_5", "--devices", "64", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pcl_reasoner_v1_5/recipe.yaml: 64 x 80 GiB" in out.stdout


def test_an_unknown_name_says_which_ones_there_are(tmp_path):
    out = reasoner("run", "quickstrat", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "(did you mean 'quickstart'?)" in out.stderr and "reasoner ls" in out.stderr


def test_a_copied_recipe_runs_from_its_new_place(tmp_path):
    out = reasoner("cp", "lengths", "mine", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "mine/quickstart/sft.yaml" in out.stdout.splitlines()
    assert "copied lengths into mine/ (8 files); run it: reasoner run mine/recipe.yaml" in out.stderr
    out = reasoner("run", "mine", "--dry-run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "reasoner sft mine/quickstart/sft.yaml " in out.stderr  # the copy, not the package
    assert str(shipped.CONFIGS) not in out.stderr
    sft = tmp_path / "mine/quickstart/sft.yaml"
    sft.write_text(sft.read_text().replace("seq_len: 256", "seq_len: 128"))  # an edit, read
    out = reasoner("run", "mine", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "mine/quickstart/sft.yaml: max_tokens (256) is larger than " \
        "seq_len (128)" in out.stderr
    again = reasoner("cp", "quickstart", "mine", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_a_documented_configs_path_works_outside_a_clone(tmp_path):
    """`reasoner data synth configs/quickstart/data_synth.yaml`, as docs/configs.md writes it."""
    out = reasoner("data", "synth", "configs/quickstart/data_synth.yaml", "output_dir=data",
                   "num_train=5", "num_test=2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "data/sft/manifest.json").is_file()
    assert not Path(tmp_path / "configs").exists()
