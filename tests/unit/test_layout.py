"""The package's architecture, checked: no import cycle, modules of a readable size, every module
path written as a string importable, every module with its test module (or a named home)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

SRC = Path(__file__).parents[2] / "src"
TESTS = Path(__file__).parents[1]
MAX_LINES = 400  # a module past ~400 lines holds two ideas: split it where they part

# Modules whose tests live in a test module of another name: module -> that test file.
HOMES = {
    "reasoner.errors": "integration/test_cli_foundation.py",
    "reasoner.cli": "integration/test_cli_foundation.py",
    "reasoner.cli.common": "integration/test_cli_foundation.py",
    "reasoner.cli.stage_commands": "integration/test_sft_cli.py",
    "reasoner.cli.eval_commands": "integration/test_eval_cli.py",
    "reasoner.cli.recipe_commands": "integration/test_run_cli.py",
    "reasoner.cli.export_commands": "unit/export/test_mindspeed.py",
    "reasoner.cli.config_commands": "integration/test_user_mistakes.py",
    "reasoner.pipeline.inputs": "integration/test_recipes.py",
    "reasoner.pipeline.rehearsal_step": "unit/pipeline/test_rehearsal.py",
    "reasoner.config.generation": "unit/config/test_stages.py",
    "reasoner.data.answers": "unit/verify/test_extract.py",
    "reasoner.models.load": "unit/models/test_models.py",
    "reasoner.models.tiny": "unit/models/test_models.py",
    "reasoner.models.lm_head": "unit/models/test_logprobs.py",
    "reasoner.models.stand_ins": "unit/pipeline/test_rehearsal.py",
    "reasoner.pipeline.rehearsal_report": "unit/pipeline/test_rehearsal.py",
    "reasoner.pipeline.rehearsal_tracking": "unit/pipeline/test_rehearsal.py",
    "reasoner.training.loop": "unit/training/test_training.py",
    "reasoner.training.schedule": "unit/training/test_training.py",
    "reasoner.training.policy": "unit/training/test_training.py",
    "reasoner.training.precision": "unit/training/test_training.py",
    "reasoner.training.final": "unit/training/test_checkpoints.py",
    "reasoner.train_offline.auxiliary": "unit/train_offline/test_train_offline.py",
    "reasoner.train_offline.rollouts": "unit/train_offline/test_train_offline.py",
    "reasoner.pipeline.recipe": "integration/test_run_cli.py",
    "reasoner.pipeline.resolve": "unit/pipeline/test_run.py",
    "reasoner.infer.base": "unit/infer/test_infer.py",
    "reasoner.infer.engines": "unit/pipeline/test_run.py",
    "reasoner.infer.hf": "unit/infer/test_infer.py",
    "reasoner.infer.kv_cache": "unit/infer/test_decode.py",
    "reasoner.infer.vllm": "integration/test_vllm.py",
    "reasoner.verify": "unit/verify/test_verify_stage.py",
    "reasoner.verify.warm": "unit/verify/test_rules.py",
    "reasoner.verify.decontam": "unit/verify/test_filters.py",
    "reasoner.eval": "integration/test_eval_cli.py",
    "reasoner.eval.benchmarks": "integration/test_eval_cli.py",
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "reasoner").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(module: str, path: Path, names: set[str]) -> set[str]:
    """The reasoner modules `module` imports anywhere in its file (inside functions too)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target.startswith("reasoner") and target != module:
                found.add(target)
    return found


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_cycle_finder_sees_a_package_and_its_module_importing_each_other(tmp_path):
    """The shape issue #30 found (infer <-> infer.raygen, both inside functions) is a cycle."""
    (tmp_path / "reasoner" / "infer").mkdir(parents=True)
    (tmp_path / "reasoner" / "__init__.py").write_text("")
    (tmp_path / "reasoner" / "infer" / "__init__.py").write_text(
        "def make():\n    from reasoner.infer.raygen import Ray\n")
    (tmp_path / "reasoner" / "infer" / "raygen.py").write_text(
        "class Ray:\n    def f(self):\n        from reasoner.infer import make\n")
    files = {"reasoner": tmp_path / "reasoner" / "__init__.py",
             "reasoner.infer": tmp_path / "reasoner" / "infer" / "__init__.py",
             "reasoner.infer.raygen": tmp_path / "reasoner" / "infer" / "raygen.py"}
    graph = {m: imports(m, p, set(files)) for m, p in files.items()}
    assert cycle(graph) == ["reasoner.infer", "reasoner.infer.raygen", "reasoner.infer"]


def test_no_module_imports_one_that_imports_it_back():
    found = modules()
    graph = {m: imports(m, p, set(found)) for m, p in found.items()}
    assert graph["reasoner.cli"] >= {"reasoner.cli.stage_commands", "reasoner.cli.eval_commands"}
    assert cycle(graph) is None, " -> ".join(cycle(graph))


# The layers, lowest first (docs/design.md): a module imports its own layer or one below it,
# never one above, imports inside functions included. The stages share a layer (eval runs an
# inner infer and verify); `reasoner.__main__` is the entry point and may start the app.
LAYERS = [
    ("base", ["reasoner", "reasoner.errors", "reasoner.records", "reasoner.shards",
              "reasoner.runlog", "reasoner.cpu", "reasoner.hccl", "reasoner.device", "reasoner.hub",
              "reasoner.shipped"]),
    ("config", ["reasoner.config"]),
    ("data", ["reasoner.data"]),
    ("models", ["reasoner.models"]),
    ("training", ["reasoner.training"]),
    ("stages", ["reasoner.sft", "reasoner.train_offline", "reasoner.infer", "reasoner.verify",
                "reasoner.eval", "reasoner.export"]),
    ("pipeline", ["reasoner.pipeline"]),
    ("cli", ["reasoner.cli", "reasoner.__main__"]),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix naming `module` or a package above it."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    assert found is not None, f"{module}: in no layer of LAYERS; add it where it belongs"
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`module -> target` for every import of a higher layer (the entry point excepted)."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if m != "reasoner.__main__"
                  for t in targets if layer_of(t) > layer_of(m))


def test_the_layer_check_sees_an_upward_import_inside_a_function(tmp_path):
    """A loss importing the CLI inside a function is caught (the cycle test would not see it:
    nothing imports back)."""
    (tmp_path / "reasoner" / "rl").mkdir(parents=True)
    for f in ("__init__.py", "rl/__init__.py", "cli.py"):
        (tmp_path / "reasoner" / f).write_text("")
    (tmp_path / "reasoner" / "rl" / "losses.py").write_text(
        "def loss():\n    from reasoner.cli import app\n")
    files = {"reasoner": tmp_path / "reasoner" / "__init__.py",
             "reasoner.rl": tmp_path / "reasoner" / "rl" / "__init__.py",
             "reasoner.train_offline.losses": tmp_path / "reasoner" / "rl" / "losses.py",
             "reasoner.cli": tmp_path / "reasoner" / "cli.py"}
    graph = {m: imports(m, p, set(files)) for m, p in files.items()}
    assert upward_imports(graph) == ["reasoner.train_offline.losses -> reasoner.cli"]


def test_every_module_imports_only_its_own_layer_or_below():
    found = modules()
    graph = {m: imports(m, p, set(found)) for m, p in found.items()}
    assert upward_imports(graph) == []


def test_command_modules_never_import_the_app():
    found = modules()
    for m in [m for m in found if m.startswith("reasoner.cli.")]:
        assert "reasoner.cli" not in imports(m, found[m], set(found)), m


@pytest.mark.parametrize("module", sorted(modules()))
def test_modules_stay_readable(module):
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines; split it where it holds two ideas"


def module_strings() -> list[str]:
    """String constants in src that name a reasoner module ("reasoner.x.y" or "...:function")."""
    pattern = re.compile(r"reasoner(\.[a-z_]+)+(:[a-z_]+)?")
    found = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and pattern.fullmatch(node.value) and not node.value.endswith(".json"):
                found.add(node.value)
    return sorted(found)


def test_module_paths_written_as_strings_exist():
    """The stage registry's runners and the verifier's fork-server preload name modules as
    strings: a moved module would fail only when that stage runs or a worker starts."""
    found = module_strings()
    assert "reasoner.verify.warm" in found and "reasoner.sft:run" in found
    for name in found:
        module, _, function = name.partition(":")
        imported = importlib.import_module(module)
        assert not function or callable(getattr(imported, function)), name


def has_code(path: Path) -> bool:
    """Defines something (a package that only re-exports needs no tests of its own)."""
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in ast.parse(path.read_text()).body)


def test_every_module_has_its_test_module_or_a_named_home():
    missing = []
    for module, path in modules().items():
        if not has_code(path) or module == "reasoner.__main__":
            continue
        parts = module.split(".")[1:]
        if path.name == "__init__.py":
            own = TESTS / "unit" / Path(*parts) / f"test_{parts[-1]}.py"
        else:
            own = TESTS / "unit" / Path(*parts[:-1]) / f"test_{parts[-1]}.py"
        home = TESTS / HOMES[module] if module in HOMES else None
        if own.exists():
            assert home is None, f"{module}: has {own.name}; drop its entry in HOMES"
        elif home is None or not home.exists():
            missing.append(f"{module} (expected {own.relative_to(TESTS)})")
    assert not missing, "modules without tests: " + ", ".join(missing)
