"""The contributor docs held to the tree: every path, module and `module.name` that
docs/design.md and docs/where-to-change.md name exists, and design.md's layout lists every
module of the package. A doc that tells a newcomer to edit a file that moved, or leaves a module
out of the map, fails here instead of misleading them. The site itself (links, anchors, the nav)
is `test_site_builds_strict`."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PKG = ROOT / "src" / "reasoner"
CHECKED = ["docs/design.md", "docs/where-to-change.md"]  # the contributor docs: every name
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
ROOTS = {"src/", "tests/", "scripts/", "configs/", "docs/", ".ci/"}
FILE_EXT = r"\.(?:py|md|yaml|yml|json|sh|txt|jinja|toml)"
IDENT = r"[A-Za-z_]\w*"


def module_path(path: Path) -> str:
    """src/reasoner/a/b.py -> "a.b"; src/reasoner/a/__init__.py -> "a"."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def package_modules() -> dict[str, Path]:
    return {module_path(p): p for p in sorted(PKG.rglob("*.py")) if module_path(p)}


@cache
def defined(path: Path) -> dict[str, set[str]]:
    """A module's top-level names, each with its members (a class's methods and attributes);
    what it re-exports in `__all__`, and what a package's `__init__` imports, count too (their
    public names)."""
    tree = ast.parse(path.read_text())
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = set()
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    members.add(sub.target.id)
                elif isinstance(sub, ast.Assign):
                    members |= {t.id for t in sub.targets if isinstance(t, ast.Name)}
            names[node.name] = members
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names.update({n: set() for n in ast.literal_eval(node.value) if n not in names})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
        elif isinstance(node, ast.ImportFrom) and path.name == "__init__.py":
            names.update({a.asname or a.name: set() for a in node.names})
    return names


def has(path: Path, dotted: str) -> bool:
    """Whether `dotted` ("fn", "Class", "Class.method") is defined in the module at `path`."""
    head, _, member = dotted.partition(".")
    names = defined(path)
    return head in names and (not member or member in names[head])


@cache
def config_keys() -> set[str]:
    """Every field name of every config model (a span like `run.save_dtype` is a config key)."""
    import pydantic

    import reasoner.config as config

    keys: set[str] = set()
    for name in dir(config):
        obj = getattr(config, name)
        if isinstance(obj, type) and issubclass(obj, pydantic.BaseModel):
            keys |= set(obj.model_fields)
    for sub in ("sections", "generation", "objectives", "corrections", "stages"):
        mod = importlib.import_module(f"reasoner.config.{sub}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, pydantic.BaseModel):
                keys |= set(obj.model_fields)
    return keys


def spans(text: str) -> list[str]:
    """The inline code of a markdown text (fenced blocks left out)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def expand(span: str) -> list[str]:
    """`tests/integration/test_{sft,train_offline}_cli.py` -> both paths."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", span)
    if not m:
        return [span]
    return [x for alt in m.group(1).split(",")
            for x in expand(span[:m.start()] + alt + span[m.end():])]


def check_path(span: str) -> str | None:
    """None when the path (optionally `path::name`) exists, else what is wrong."""
    path, _, name = span.partition("::")
    folder = path.endswith("/")
    candidates = [ROOT / path, PKG / path, ROOT / "src" / path, ROOT / "tests" / path]
    if "/" not in path.rstrip("/"):
        if not path.endswith(".py"):
            return None  # manifest.json, final/: what a stage writes, not a file of the tree
        candidates += [*PKG.rglob(path), *(ROOT / "tests").rglob(path)]  # a module, a test
    found = [p for p in candidates if (p.is_dir() if folder else p.is_file())]
    if not found:
        return f"{span}: no such {'folder' if folder else 'file'}"
    if name and not any(has(p, name) for p in found if p.suffix == ".py"):
        return f"{span}: {path} defines no {name}"
    return None


def check_dotted(span: str) -> str | None:
    """None when `a.b.name` is a module and a name it defines, a class and its member, or a
    config key (`run.save_dtype`); else what is wrong. Unknown first words (torch.cuda) pass."""
    parts = span.removeprefix("reasoner.").split(".")
    mods = package_modules()
    if span.startswith("reasoner.") and ".".join(parts) in mods:
        return None  # a module itself
    for cut in range(len(parts) - 1, 0, -1):  # the longest module prefix first
        prefix, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
        hits = [p for m, p in mods.items() if m == prefix or m.endswith("." + prefix)]
        if hits and len(parts) - cut <= 2:
            if any(has(p, rest) for p in hits):
                return None
            if prefix in config_keys() and parts[-1] in config_keys():
                return None
            return f"{span}: {prefix} defines no {rest}"
    classes = [p for p in mods.values() if parts[0] in defined(p)]
    if classes and parts[0][0].isupper():
        return None if len(parts) == 2 and any(has(p, span) for p in classes) else \
            f"{span}: {parts[0]} has no {'.'.join(parts[1:])}"
    if span.startswith("reasoner."):
        return f"{span}: no such module"
    if parts[0] in config_keys() and parts[-1] not in config_keys():
        return f"{span}: no config key {parts[-1]!r}"
    return None


def ours(path: str) -> bool:
    """A path into this repository (not an output folder's file, not another project's)."""
    first = path.split("/")[0] + "/"
    return first in ROOTS or (PKG / first).is_dir() and first != "__pycache__/"


def problems(doc: str, strict: bool = True) -> list[str]:
    """What `doc` names that the tree lacks. strict (the contributor docs): every path, bare
    module name and `module.name`; otherwise paths into the repository and `reasoner.` names."""
    wrong = []
    for span in spans((ROOT / doc).read_text()):
        for s in expand(span.strip()):
            if "<" in s or " " in s or s.startswith(("-", "http")):
                continue  # a placeholder, a command line, an option
            if re.fullmatch(rf"[\w./-]+(?:{FILE_EXT}|/)(?:::{IDENT}(?:\.{IDENT})?)?", s) \
                    and ("/" in s or re.search(FILE_EXT + "(::|$)", s)):
                if not strict and not ours(s):
                    continue
                err = check_path(s)
            elif re.fullmatch(rf"{IDENT}(?:\.{IDENT})+", s) and not re.search(r"\.(jsonl?|md|png)$", s):
                if not strict and not s.startswith("reasoner."):
                    continue
                err = check_dotted(s)
            else:
                continue
            if err:
                wrong.append(f"{doc}: {err}")
    return wrong


@pytest.mark.parametrize("doc", CHECKED)
def test_every_path_and_name_the_doc_gives_exists(doc):
    assert not problems(doc)


@pytest.mark.parametrize("page", PAGES)
def test_every_repository_path_a_page_gives_exists(page):
    assert not problems(page, strict=False)


def layout_block() -> str:
    text = (ROOT / "docs/design.md").read_text()
    m = re.search(r"^## Layout\n.*?```\n(.*?)```", text, flags=re.S | re.M)
    assert m, "docs/design.md has no '## Layout' section with the package's tree"
    return m.group(1)


def listed_modules(block: str) -> set[str]:
    """Module paths of the tree under `src/reasoner/`: one module per line, its file name first;
    a line `  folder/` holds the lines indented under it; a deeper line continues the one above."""
    folder, found, inside = "", set(), False
    for line in block.splitlines():
        words, indent = line.split(), len(line) - len(line.lstrip())
        if not words:
            continue
        if words[0] == "src/reasoner/":
            inside = True
            continue
        if not inside or indent == 0:
            inside = inside and indent > 0
            continue
        if indent <= 2:
            folder = words[0] if words[0].endswith("/") else ""
        if re.fullmatch(r"\w+\.py", words[0]) and words[0] != "__init__.py" \
                and indent == (4 if folder else 2):
            found.add(module_path(PKG / folder / words[0]))
    return found


def test_design_layout_lists_every_module_and_no_other():
    listed = listed_modules(layout_block())
    tree = {m for m, p in package_modules().items() if p.name != "__init__.py"}
    assert not sorted(tree - listed), "modules missing from docs/design.md's layout"
    assert not sorted(listed - tree), "docs/design.md's layout names modules the tree lacks"


def test_backend_row_names_the_generator_protocol():
    """where-to-change tells a new backend what to implement: exactly `Generator`'s members."""
    text = (ROOT / "docs/where-to-change.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| **a generation backend**"))
    said = set(re.findall(r"`(\w+)`", row.split("infer/base.py", 1)[1].split(")")[0]))
    protocol = defined(PKG / "infer" / "base.py")["Generator"]
    assert said == protocol


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and the site, mkdocs.yml's slugify) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_readme_links_resolve():
    """The README is not part of the site, so --strict does not see its links: each file it
    links exists, and each anchor is a heading of that file."""
    wrong = []
    for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        path = path or "README.md"  # "#heading": one of the README's own
        if not (ROOT / path).exists():
            wrong.append(f"{target}: no such file")
        elif anchor and anchor not in {github_anchor(h) for h in re.findall(
                r"^#+ (.*)$", (ROOT / path).read_text(), flags=re.M)}:
            wrong.append(f"{target}: no heading with that anchor")
    assert not wrong


def test_readme_test_command_is_what_ci_runs():
    """The README's second command is the one `.ci/run` ends with, word for word."""
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"\*\*Run the tests:\*\*\n\n```bash\n(.*?)\n```", readme, flags=re.S)
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert said and said.group(1).strip() == ci[-1].strip()


def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict` over docs/: a broken link, anchor or nav entry fails it."""
    for module, package in (("mkdocs", "mkdocs"), ("material", "mkdocs-material")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{package} is not installed (it is in the dev extra: pip install -e '.[dev]')")
    # not -q: it drops the warnings that --strict counts, and the build passes whatever is broken
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr


if __name__ == "__main__":
    print("\n".join([*(p for doc in CHECKED for p in problems(doc)),
                     *(p for page in PAGES for p in problems(page, strict=False))]))
