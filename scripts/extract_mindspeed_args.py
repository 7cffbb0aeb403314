"""Record the command-line flags a MindSpeed-LLM release accepts, read from its source.

    python scripts/extract_mindspeed_args.py MINDSPEED_GIT_DIR v2.2.0 MEGATRON_GIT_DIR core_v0.12.1 \
        > tests/fixtures/mindspeed/args-v2.2.0.json
    python scripts/extract_mindspeed_args.py PCL_V1_5_GIT_DIR f0626fd PCL_V1_5_GIT_DIR f0626fd \
        --prefix MindSpeed-LLM/ > tests/fixtures/mindspeed/args-pcl-f0626fd.json

`--prefix` names the folder that holds the MindSpeed-LLM checkout inside a larger repository
(PCL-Reasoner/V1.5 vendors its fork, with Megatron copied into it, under `MindSpeed-LLM/`);
it applies to both repositories' paths and is recorded.

Every `add_argument(...)` call is read with `ast` (nothing is imported: the code needs
torch_npu), with its option strings, `type` (int / float / str / bool-ish), `choices`,
`action` and `nargs`, per program: `preprocess_data.py` (the script and the preprocess
package), `convert_ckpt.py` (the script and its checkpoint loader / saver plugins) and the
training entry `posttrain_gpt.py` (Megatron's arguments at the pinned core version plus
every MindSpeed-LLM module that adds training arguments). Both commits are recorded.
`tests/unit/export/test_mindspeed.py` parses each generated command line against it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

PROGRAMS = {
    "preprocess_data.py": ("preprocess_data.py", "mindspeed_llm/tasks/preprocess/"),
    "convert_ckpt.py": ("convert_ckpt.py", "mindspeed_llm/tasks/checkpoint/"),
    "posttrain_gpt.py": ("posttrain_gpt.py", "mindspeed_llm/training/", "mindspeed_llm/features_manager/",
                         "mindspeed_llm/core/", "mindspeed_llm/tasks/posttrain/",
                         "mindspeed_llm/tasks/megatron_adaptor.py", "mindspeed_llm/legacy/"),
}
MEGATRON_FILES = ("megatron/training/arguments.py",)


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return None


def type_name(node: ast.AST | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Name) and node.id in ("int", "float", "str"):
        return node.id
    return "other"  # a function (str2bool, a lambda): not checked beyond presence


def arguments(source: str, where: str) -> list[dict]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str) and a.value.startswith("-")]
        if not flags:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        choices = literal(kw["choices"]) if "choices" in kw else None
        found.append({"flags": flags, "type": type_name(kw.get("type")),
                      "choices": list(choices) if isinstance(choices, list | tuple) else None,
                      "action": literal(kw["action"]) if "action" in kw else None,
                      "nargs": literal(kw["nargs"]) if "nargs" in kw else None,
                      "where": where})
    return found


def main() -> None:
    argv = sys.argv[1:]
    prefix = ""
    if "--prefix" in argv:
        at = argv.index("--prefix")
        prefix = argv[at + 1]
        del argv[at:at + 2]
    if len(argv) != 4:
        sys.exit("usage: extract_mindspeed_args.py MINDSPEED_GIT_DIR REF MEGATRON_GIT_DIR REF "
                 "[--prefix FOLDER/]")
    ms_repo, ms_ref, mg_repo, mg_ref = argv
    ms_files = git(ms_repo, "ls-tree", "-r", "--name-only", ms_ref).split()
    out = {"mindspeed_llm": {"ref": ms_ref, "commit": git(ms_repo, "rev-parse", ms_ref).strip()},
           "megatron": {"ref": mg_ref, "commit": git(mg_repo, "rev-parse", mg_ref).strip()},
           "prefix": prefix, "programs": {}}
    for program, prefixes in PROGRAMS.items():
        args = []
        for path in ms_files:
            if path.endswith(".py") and any(path == prefix + p or path.startswith(prefix + p)
                                            for p in prefixes):
                args += arguments(git(ms_repo, "show", f"{ms_ref}:{path}"), path)
        if program == "posttrain_gpt.py":
            for path in MEGATRON_FILES:
                args += arguments(git(mg_repo, "show", f"{mg_ref}:{prefix}{path}"),
                                  f"megatron:{prefix}{path}")
        out["programs"][program] = args
    write(out)


def write(out: dict) -> None:
    """JSON with one argument per line (diffs between releases stay readable)."""
    lines = ["{", f' "mindspeed_llm": {json.dumps(out["mindspeed_llm"])},',
             f' "megatron": {json.dumps(out["megatron"])},',
             *([f' "prefix": {json.dumps(out["prefix"])},'] if out["prefix"] else []),
             ' "programs": {']
    programs = list(out["programs"].items())
    for i, (program, args) in enumerate(programs):
        lines.append(f"  {json.dumps(program)}: [")
        lines += ["   " + json.dumps(a) + ("," if j < len(args) - 1 else "")
                  for j, a in enumerate(args)]
        lines.append("  ]" + ("," if i < len(programs) - 1 else ""))
    sys.stdout.write("\n".join([*lines, " }", "}"]) + "\n")


if __name__ == "__main__":
    main()
