"""The package as a user installs it: the wheel `pip wheel .` builds holds every shipped config and
the metadata a package index shows, and that wheel alone (not this checkout's src/) runs the
quickstart from an empty folder outside the repository, writing runs/ there."""

import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from conftest import QUICKSTART_CI_SCALE
from tests_helpers import SUBPROCESS_ENV

REPO = Path(__file__).resolve().parents[2]
BUILT_FROM = ("pyproject.toml", "README.md", "LICENSE", "src", "configs")
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tree (the checkout gets no build/ folder) with the
    installed setuptools: no build isolation, no index, so no network."""
    root = tmp_path_factory.mktemp("wheel")
    tree = root / "tree"
    tree.mkdir()
    for name in BUILT_FROM:
        if (REPO / name).is_dir():  # links kept: src/reasoner/configs is one to configs/
            shutil.copytree(REPO / name, tree / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, tree / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "--no-index", "-q", "-w", str(root / "dist"), str(tree)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (built,) = (root / "dist").glob("*.whl")
    assert built.name == f"reasoner-{VERSION}-py3-none-any.whl"
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_shipped_config_and_the_index_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"reasoner-{VERSION}.dist-info/METADATA").decode()
    configs = {f"reasoner/configs/{p.relative_to(REPO / 'configs').as_posix()}"
               for p in (REPO / "configs").rglob("*") if p.is_file()}
    assert len(configs) >= 40 and "reasoner/configs/judge/pcl_prompt.txt" in configs
    assert sorted(configs - names) == []
    meta = email.parser.Parser().parsestr(metadata)
    assert meta["Summary"].startswith("Offline-RL pipeline for math reasoning LLMs")
    assert meta["Requires-Python"] == ">=3.10" and meta["License-Expression"] == "Apache-2.0"
    assert "torch>=2.8" in meta.get_all("Requires-Dist")
    assert {"Programming Language :: Python :: 3.10", "Operating System :: POSIX :: Linux",
            "Topic :: Scientific/Engineering :: Artificial Intelligence"} <= set(
                meta.get_all("Classifier"))
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload() == (REPO / "README.md").read_text()
    assert f"reasoner-{VERSION}.dist-info/licenses/LICENSE" in names


@pytest.mark.slow
def test_the_installed_wheel_runs_the_quickstart_from_an_empty_folder(wheel, tmp_path):
    """Installed beside the environment's packages (no dependencies: they are those), first on
    the path; every command runs in an empty folder that is not the repository."""
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                          "--target", str(site), str(wheel)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**SUBPROCESS_ENV, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1",
           "PATH": f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in args], cwd=empty, env=env, capture_output=True,
                              text=True, timeout=900)

    out = run(sys.executable, "-c", "import reasoner; print(reasoner.__file__)")
    assert Path(out.stdout.strip()).is_relative_to(site), out  # the wheel's, not src/
    assert run("reasoner", "--version").stdout == f"reasoner {VERSION}\n"
    assert "pcl_reasoner_v1_5" in run("reasoner", "ls").stdout
    out = run("reasoner", "run", "quickstart", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"reasoner sft {site}/reasoner/configs/quickstart/sft.yaml " in out.stderr
    out = run("reasoner", "plan", "pcl_reasoner_v1_5", "--devices", "64")
    assert out.returncode == 0, out.stderr
    assert list(empty.iterdir()) == []
    # the quickstart script at smoke scale: its first stages, up to a 2-step SFT
    out = run("bash", REPO / "scripts/quickstart.sh", "runs/smoke", *QUICKSTART_CI_SCALE,
              "sft.run.max_steps=2", "--until", "sft")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [p.name for p in empty.iterdir()] == ["runs"]
    assert (empty / "runs/smoke/sft/final/model.safetensors").is_file()
    assert not (empty / "runs/smoke/eval-sft").exists()
