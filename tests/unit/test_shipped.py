"""The shipped recipes: every recipe file named in the table, a name or a `configs/...` path found
in the package from any folder, and a copied folder that is the same recipe from its new place."""

from pathlib import Path

import pytest

from reasoner import shipped
from reasoner.config import dump
from reasoner.errors import ConfigError
from reasoner.pipeline.recipe import load_recipe
from reasoner.pipeline.resolve import resolve

REPO = Path(__file__).resolve().parents[2]


def test_the_package_configs_are_the_repository_configs():
    """In a clone src/reasoner/configs is a link to configs/: one copy, which the wheel ships."""
    assert shipped.CONFIGS == (REPO / "configs").resolve()


def test_every_recipe_file_has_a_name_purpose_and_hardware():
    files = {p.relative_to(REPO / "configs").with_suffix("").as_posix().removesuffix("/recipe")
             for p in (REPO / "configs").rglob("recipe*.yaml")}
    assert set(shipped.RECIPES) == files
    assert {"quickstart", "smollm2_cpu", "gsm8k_1gpu", "pcl_reasoner_v1_5", "oreal", "prorl",
            "discounted", "lengths"} <= files
    for name, recipe in shipped.RECIPES.items():
        assert shipped.recipe_file(name).is_file(), name
        assert recipe.purpose and recipe.hardware, name


def test_a_configs_path_absent_here_is_the_packages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    judge = Path("configs/judge/prompt.txt")
    assert shipped.find_file(judge) == shipped.CONFIGS / "judge/prompt.txt"
    (tmp_path / "configs/judge").mkdir(parents=True)
    (tmp_path / judge).write_text("mine {reference} {candidate}")
    assert shipped.find_file(judge) == judge  # one here wins: the user's own
    for as_given in (Path("configs/judge/none.txt"), Path("judge/prompt.txt"),
                     tmp_path / "configs/none.yaml"):
        assert shipped.find_file(as_given) == as_given  # the caller says it is missing


@pytest.mark.parametrize("given, found", [
    ("quickstart", "quickstart/recipe.yaml"),
    ("quickstart/recipe_oreal", "quickstart/recipe_oreal.yaml"),
    ("quickstart/recipe_oreal.yaml", "quickstart/recipe_oreal.yaml"),
    ("pcl_reasoner_v1_5/recipe.yaml", "pcl_reasoner_v1_5/recipe.yaml"),
    ("configs/lengths/recipe.yaml", "lengths/recipe.yaml"),
])
def test_a_recipe_is_named_from_any_folder(tmp_path, monkeypatch, given, found):
    monkeypatch.chdir(tmp_path)
    assert shipped.find_recipe(Path(given)) == shipped.CONFIGS / found


def test_a_path_still_wins_and_a_folder_means_its_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").mkdir()
    (tmp_path / "quickstart/recipe.yaml").write_text("run_dir: x\n")
    assert shipped.find_recipe(Path("quickstart")) == Path("quickstart/recipe.yaml")
    (tmp_path / "mine.yaml").write_text("run_dir: x\n")
    assert shipped.find_recipe(Path("mine.yaml")) == Path("mine.yaml")
    (tmp_path / "lengths").mkdir()  # a folder of other things: the name still means the recipe
    assert shipped.find_recipe(Path("lengths")) == shipped.CONFIGS / "lengths/recipe.yaml"
    (tmp_path / "notes").mkdir()
    with pytest.raises(ConfigError, match="recipe notes: a folder without recipe.yaml, and no "):
        shipped.find_recipe(Path("notes"))


def test_an_unknown_recipe_names_the_close_one_and_the_list(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"recipe quikstart: no such file, and no shipped "
                       r"recipe of that name \(did you mean 'quickstart'\?\); the shipped ones: "
                       r"quickstart, .*pcl_reasoner_v1_5.*`reasoner ls`"):
        shipped.find_recipe(Path("quikstart"))


def resolved(recipe: Path, run_dir: Path) -> list[tuple[str, dict]]:
    """Each stage's name and resolved config: what the recipe runs."""
    stages = resolve(load_recipe(recipe, [f"run_dir={run_dir}"]), recipe.parent)
    return [(s.name, s.config if isinstance(s.config, dict) else dump(s.config)) for s in stages]


@pytest.mark.parametrize("name", ["quickstart", "quickstart/recipe_oreal", "lengths", "oreal",
                                  "gsm8k_1gpu/recipe_7b_lora"])
def test_a_copied_recipe_is_the_same_recipe_from_its_new_place(tmp_path, monkeypatch, name):
    """lengths and oreal take stage configs from other folders: those come along, into
    DEST/quickstart/ and DEST/pcl_reasoner_v1_5/, and the references point there."""
    monkeypatch.chdir(tmp_path)
    written = shipped.copy(name, Path("mine"))
    assert all(p.is_file() for p in written)
    copied = shipped.find_recipe(Path("mine") / f"{name.partition('/')[2] or 'recipe'}.yaml")
    assert resolved(copied, tmp_path / "run") == resolved(shipped.recipe_file(name),
                                                          tmp_path / "run")
    for stage in load_recipe(copied, []).stages:  # every config read from the copy
        assert stage.config is None or (copied.parent / stage.config).resolve().is_relative_to(
            tmp_path / "mine")


def test_a_copy_rewrites_only_the_references_that_leave_the_folder(tmp_path):
    shipped.copy("lengths", tmp_path / "mine")
    original = (shipped.CONFIGS / "lengths/recipe.yaml").read_text()
    assert (tmp_path / "mine/recipe.yaml").read_text() == original.replace(
        "config: ../quickstart/", "config: quickstart/")
    shipped.copy("quickstart", tmp_path / "q")
    for path in (shipped.CONFIGS / "quickstart").iterdir():
        assert (tmp_path / "q" / path.name).read_bytes() == path.read_bytes(), path.name


def test_a_copy_never_writes_over_a_folder_in_use(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists and is not an empty folder"):
        shipped.copy("quickstart", tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    with pytest.raises(ConfigError, match=r"no shipped folder 'quikstart' \(did you mean "
                       r"'quickstart'\?\); one of: discounted, .*judge"):
        shipped.copy("quikstart", tmp_path / "new")
    shipped.copy("judge", tmp_path / "judge")  # the judge prompts too
    assert sorted(p.name for p in (tmp_path / "judge").iterdir()) == ["pcl_prompt.txt",
                                                                      "prompt.txt"]
