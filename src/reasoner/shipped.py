"""The recipes, stage configs and judge prompts shipped inside the package (`reasoner ls`, `cp`).

They are the repository's `configs/` folder, installed as `reasoner/configs/` (in a clone that
folder is a link to `configs/`, so an editable install and a wheel read the same files). A
recipe is named where a path is expected: `reasoner run quickstart` is the package's
`configs/quickstart/recipe.yaml`, `quickstart/recipe_oreal` its `recipe_oreal.yaml`. A path
still works as before; and a relative path under `configs/` that does not exist where the
command runs (a judge's `prompt_file: configs/judge/prompt.txt`, `reasoner sft
configs/quickstart/sft.yaml` outside a clone) is read from the package, so every documented
command works after `pip install` too. `copy` copies a recipe's folder out for editing, with
the files it takes from other folders, so the copy runs from its new place.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import yaml

from reasoner.errors import ConfigError

CONFIGS = (Path(__file__).parent / "configs").resolve()  # resolved: in a clone, a link


class Recipe(NamedTuple):
    """One shipped recipe: what it is for and what it needs to run."""

    purpose: str
    hardware: str


# Every recipe file under configs/, named as `reasoner run` takes it: the folder for its
# recipe.yaml, folder/file for another (a test holds this table to the files).
RECIPES: dict[str, Recipe] = {
    "quickstart": Recipe("the whole pipeline on a tiny model built from scratch, synthetic "
                         "arithmetic problems", "CPU: ~6 min on 2 cores"),
    "quickstart/recipe_rft": Recipe("the quickstart's RL stage as rft (SFT on the positives)",
                                    "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_gspo": Recipe("the quickstart's RL stage as gspo", "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_cispo": Recipe("the quickstart's RL stage as cispo", "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_oapl": Recipe("the quickstart's RL stage as oapl", "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_oreal": Recipe("the quickstart's RL stage as oreal",
                                      "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_dapo": Recipe("the quickstart's RL stage as dapo",
                                     "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_discounted": Recipe("the quickstart's RL stage as discounted",
                                           "CPU, after the quickstart (reuses its run folder)"),
    "quickstart/recipe_prorl": Recipe("ProRL in miniature: four rounds from the quickstart's "
                                      "SFT model", "CPU, after the quickstart"),
    "quickstart/recipe_vllm": Recipe("the quickstart model's generation stages on vLLM",
                                     "CPU with vLLM installed, after the quickstart"),
    "smollm2_cpu": Recipe("a pretrained SmolLM2-135M-Instruct learns one-step arithmetic",
                          "CPU: ~15 min on 2 cores, its weights imported first "
                          "(start_model=)"),
    "lengths": Recipe("does the discounted objective shorten answers at the same accuracy",
                      "CPU: ~26 min on 2 cores"),
    "gsm8k_1gpu": Recipe("Qwen2.5-0.5B-Instruct on GSM8K, every input by hub id",
                         "1 GPU of 24 GiB (L4, A10G)"),
    "gsm8k_1gpu/recipe_1p5b": Recipe("the one-GPU recipe on Qwen2.5-1.5B-Instruct",
                                     "1 GPU of 80 GiB"),
    "gsm8k_1gpu/recipe_7b_lora": Recipe("the one-GPU recipe on Qwen2.5-7B-Instruct, LoRA RL",
                                        "1 GPU of 24 GiB (L4, A10G) or 48 GiB; '.[lora]'"),
    "pcl_reasoner_v1_5": Recipe("PCL-Reasoner-V1.5: Qwen2.5-32B SFT, judge, pcl, AIME 24/25",
                                "3 nodes of 8 x 80 GiB GPUs (SFT), 8 nodes for every stage"),
    "oreal": Recipe("OREAL at 32B from OREAL-32B-SFT", "4 nodes of 8 x 80 GiB GPUs"),
    "prorl": Recipe("ProRL at 1.5B from DeepSeek-R1-Distill-Qwen-1.5B", "1 node of 8 GPUs"),
    "discounted": Recipe("discounted (length-efficient) RL from any SFT'd reasoner",
                         "1 node of 8 GPUs"),
}


def recipe_file(name: str) -> Path:
    """The package's file of a recipe name (`quickstart`, `quickstart/recipe_oreal`)."""
    folder, _, file = name.removesuffix(".yaml").partition("/")
    return CONFIGS / folder / f"{file or 'recipe'}.yaml"


def find_file(path: Path) -> Path:
    """`path` itself, or the package's file when `path` is `configs/...` and absent here."""
    path = Path(path)
    if path.exists() or path.is_absolute() or path.parts[:1] != ("configs",):
        return path
    ours = CONFIGS.joinpath(*path.parts[1:])
    return ours if ours.exists() else path


def find_recipe(given: Path) -> Path:
    """The recipe file `given` names: a file, a folder holding recipe.yaml (a copied recipe), a
    `configs/...` path (the package's when absent here) or a shipped recipe's name."""
    given = Path(given)
    if given.is_dir():
        if (given / "recipe.yaml").is_file():
            return given / "recipe.yaml"
    elif find_file(given).is_file():
        return find_file(given)
    name = given.as_posix().removesuffix(".yaml").removesuffix("/recipe")
    if name in RECIPES:
        return recipe_file(name)
    close = difflib.get_close_matches(name, RECIPES, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    what = "a folder without recipe.yaml" if given.is_dir() else "no such file"
    raise ConfigError(f"recipe {given}: {what}, and no shipped recipe of that name{hint}; the "
                      f"shipped ones: {', '.join(RECIPES)} (`reasoner ls` says what each is for)")


def folders() -> list[str]:
    """The shipped folders `copy` takes: every recipe's, and judge (the judge prompts)."""
    return sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())


# A recipe's reference to another file, as written: `config: x.yaml` of a stage, `extends: x.yaml`.
_REFERENCE = re.compile(r"^(\s*(?:-\s+)?(?:config|extends):\s*)([^\s#]+)", re.MULTILINE)


def _references(path: Path) -> list[Path]:
    """The files a recipe reads (its stages' configs, `extends`); none for any other file."""
    raw = yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else None
    if not isinstance(raw, dict) or "stages" not in raw:
        return []
    names = [s["config"] for s in raw["stages"] or [] if isinstance(s, dict) and s.get("config")]
    names += [raw["extends"]] if raw.get("extends") else []
    return [Path(os.path.normpath(path.parent / n)) for n in names]


def _needs(folder: Path) -> set[Path]:
    """Every file of the folder, and each file of another folder its recipes read."""
    found: set[Path] = set()
    todo = [p for p in folder.iterdir() if p.is_file()]
    while todo:
        path = todo.pop()
        if path not in found:
            found.add(path)
            todo += _references(path)
    return found


def copy(name: str, dest: Path) -> list[Path]:
    """Copy the shipped folder `name` into `dest` (new or empty), for editing; returns the files
    written. A file it takes from another folder (lengths: `../quickstart/sft.yaml`) is copied
    into `dest/<that folder>/` and the reference rewritten to it, so the copy runs on its own."""
    folder = name.partition("/")[0]
    if folder not in folders():
        close = difflib.get_close_matches(folder, folders(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"no shipped folder {name!r}{hint}; one of: {', '.join(folders())}")
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest} already exists and is not an empty folder; copy into a new "
                          "one (nothing was written)")
    source = CONFIGS / folder
    needs = _needs(source)
    target = {p: dest / (p.name if p.parent == source else Path(p.parent.name, p.name))
              for p in needs}

    def moved(path: Path, match: re.Match) -> str:
        ref = Path(os.path.normpath(path.parent / match.group(2)))
        if ref not in target:  # text that only looks like a reference: as written
            return match.group(0)
        return match.group(1) + os.path.relpath(target[ref], target[path].parent)

    for path in sorted(needs):
        target[path].parent.mkdir(parents=True, exist_ok=True)
        if _references(path):
            text = path.read_text()
            target[path].write_text(_REFERENCE.sub(lambda m, p=path: moved(p, m), text))
        else:
            shutil.copyfile(path, target[path])
    return sorted(target.values())
