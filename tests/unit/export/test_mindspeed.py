"""`reasoner export mindspeed`: golden scripts for the quickstart and the 32B recipe, and only flags
that MindSpeed-LLM documents."""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reasoner.cli import app

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "tests" / "golden" / "mindspeed"
UPDATE = os.environ.get("REASONER_UPDATE_GOLDEN") == "1"

# Flags documented by MindSpeed-LLM (docs/pytorch/solutions/finetune, the data-preprocess and
# checkpoint-conversion guides, and the examples/mcore/qwen25 scripts), per program.
DOCUMENTED = {
    "preprocess_data.py": {
        "--input", "--tokenizer-name-or-path", "--tokenizer-type", "--output-prefix",
        "--handler-name", "--prompt-type", "--map-keys", "--workers", "--log-interval", "--pack",
        "--neat-pack", "--seq-length", "--append-eod", "--n-subs", "--json-keys",
        "--enable-thinking", "--overwrite-cache", "--cache-dir"},
    "convert_ckpt.py": {
        "--use-mcore-models", "--model-type", "--model-type-hf", "--load-model-type",
        "--save-model-type", "--target-tensor-parallel-size", "--target-pipeline-parallel-size",
        "--add-qkv-bias", "--params-dtype", "--load-dir", "--save-dir", "--tokenizer-model",
        "--num-layer-list", "--num-layers-per-virtual-pipeline-stage"},
    "posttrain_gpt.py": {
        "--use-mcore-models", "--num-layers", "--hidden-size", "--ffn-hidden-size",
        "--num-attention-heads", "--group-query-attention", "--num-query-groups",
        "--padded-vocab-size", "--make-vocab-size-divisible-by", "--rotary-base",
        "--position-embedding-type", "--use-rotary-position-embeddings", "--normalization",
        "--norm-epsilon", "--swiglu", "--add-qkv-bias", "--disable-bias-linear",
        "--attention-dropout", "--hidden-dropout", "--untie-embeddings-and-output-weights",
        "--tokenizer-type", "--tokenizer-name-or-path", "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size", "--sequence-parallel", "--use-distributed-optimizer",
        "--seq-length", "--max-position-embeddings", "--micro-batch-size", "--global-batch-size",
        "--train-iters", "--lr", "--min-lr", "--lr-decay-style", "--lr-warmup-fraction",
        "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps", "--clip-grad", "--bf16",
        "--use-flash-attn", "--attention-softmax-in-fp32", "--no-masked-softmax-fusion", "--seed",
        "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--finetune",
        "--stage", "--is-instruction-dataset", "--prompt-type", "--reset-attention-mask",
        "--neat-pack", "--data-path", "--split", "--load", "--save", "--save-interval",
        "--no-load-optim", "--no-load-rng", "--log-interval", "--log-throughput", "--eval-iters",
        "--distributed-backend", "--padded-samples", "--reset-position-ids"},
    "torchrun": {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port"},
}


def emitted_flags(text: str) -> dict[str, set[str]]:
    """Flags per program: the command line that starts a call and its continuation lines."""
    found: dict[str, set[str]] = {}
    program = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        words = line.split()
        if words and words[0] in ("python", "torchrun"):
            program = words[1] if words[0] == "python" else "torchrun"
            if words[0] == "torchrun":
                found.setdefault("torchrun", set()).update(w for w in words if w.startswith("--"))
                program = next(w for w in words if w.endswith(".py"))
            continue
        if program and words and words[0].startswith("--"):
            found.setdefault(program, set()).add(words[0])
        if not line.endswith("\\"):
            program = None
    return found


def export(tmp_path: Path, config: Path, *args: str) -> dict[str, str]:
    out = tmp_path / "out"
    cwd = os.getcwd()
    os.chdir(REPO)  # the scripts name the config as given: relative to the checkout
    try:
        result = CliRunner().invoke(app, ["export", "mindspeed", str(config.relative_to(REPO)),
                                          *args, "--out", str(out)])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return {p.name: p.read_text() for p in sorted(out.glob("*.sh"))}


def check_golden(name: str, scripts: dict[str, str]) -> None:
    folder = GOLDEN / name
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in scripts.items():
            (folder / file).write_text(text)
    expected = {p.name: p.read_text() for p in sorted(folder.glob("*.sh"))}
    assert list(scripts) == list(expected)
    for file, text in scripts.items():
        assert text == expected[file], f"{file} differs from {folder / file} (REASONER_UPDATE_GOLDEN=1 rewrites)"


def check_documented(scripts: dict[str, str]) -> None:
    for file, text in scripts.items():
        for program, flags in emitted_flags(text).items():
            assert program in DOCUMENTED, f"{file}: unknown program {program}"
            assert flags <= DOCUMENTED[program], f"{file}: undocumented {sorted(flags - DOCUMENTED[program])}"


def test_pcl_32b_recipe_golden(tmp_path):
    scripts = export(tmp_path, REPO / "configs/pcl_reasoner_v1_5/sft.yaml")
    check_golden("pcl_reasoner_v1_5", scripts)
    check_documented(scripts)
    train = scripts["3_train_sft.sh"]
    for flag in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
                 "--seq-length 32768", "--global-batch-size 128", "--lr 6e-05", "--min-lr 1e-07",
                 "--lr-warmup-fraction 0.05", "--num-layers 64", "--neat-pack",
                 "--reset-position-ids", "--padded-samples"):
        assert flag in train
    assert "NNODES=${NNODES:-4}" in train and "hccl" not in train  # Megatron takes nccl / gloo
    pre = scripts["1_preprocess_data.sh"]
    assert "--pack" in pre and "--append-eod" not in pre  # turns end with <|im_end|> already
    assert "--params-dtype bf16" in scripts["4_convert_mcore_to_hf.sh"]


def test_quickstart_golden(tmp_path):
    from reasoner import models
    from reasoner.config import TinyConfig, load

    tiny = load(TinyConfig, REPO / "configs/quickstart/tiny_model.yaml",
                [f"output_dir={tmp_path / 'tiny-init'}", "corpus=[]"])
    models.build_tiny(tiny)
    scripts = export(tmp_path, REPO / "configs/quickstart/sft.yaml",
                     f"model.name_or_path={tmp_path / 'tiny-init'}", "--tp", "1", "--pp", "1",
                     "--npus-per-node", "1", "--train-iters", "1075")
    scripts = {k: v.replace(str(tmp_path / "tiny-init"), "runs/quickstart/tiny-init")
               for k, v in scripts.items()}
    check_golden("quickstart", scripts)
    check_documented(scripts)
    train = scripts["3_train_sft.sh"]
    assert "--num-layers 4" in train and "--hidden-size 128" in train
    assert "--sequence-parallel" not in train  # TP 1
    assert "TRAIN_ITERS=${TRAIN_ITERS:-1075}" in train


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "TP 3 must divide"),
    (["--pp", "5"], "PP 5 must divide"),
    (["--tp", "8", "--pp", "4", "--nodes", "1"], "not a multiple of TP x PP"),
])
def test_bad_parallel_layouts(tmp_path, args, message):
    result = CliRunner().invoke(app, ["export", "mindspeed",
                                      str(REPO / "configs/pcl_reasoner_v1_5/sft.yaml"), *args,
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output


def test_unknown_model_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["export", "mindspeed",
                                      str(REPO / "configs/pcl_reasoner_v1_5/sft.yaml"),
                                      "model.name_or_path=someone/unknown-model", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "cannot read the shape" in result.output


def test_flag_scanner_sees_every_flag():
    text = "python convert_ckpt.py \\\n    --a 1 \\\n    --b\n--c\ntorchrun --x 1 posttrain_gpt.py \\\n    --d\n"
    assert emitted_flags(text) == {"convert_ckpt.py": {"--a", "--b"}, "torchrun": {"--x"},
                                   "posttrain_gpt.py": {"--d"}}


# --------------------------------------------------------------------------------------------
# Every generated command parsed by the pinned release's own argument definitions

PINNED = REPO / "tests" / "fixtures" / "mindspeed" / "args-v2.2.0.json"


def release_parser(program: str, pinned: Path = PINNED):
    """argparse rebuilt from the flags MindSpeed-LLM v2.2.0 (+ Megatron core_v0.12.1) define, or
    those of another recorded release (scripts/extract_mindspeed_args.py): names, int / float
    types, choices, actions, nargs."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=program, add_help=False, allow_abbrev=False,
                                     exit_on_error=False)
    seen: set[str] = set()
    for a in json.loads(pinned.read_text())["programs"][program]:
        flags = [f for f in a["flags"] if f not in seen]
        if not flags:
            continue
        seen.update(flags)
        kw: dict = {}
        if a["action"] in ("store_true", "store_false", "append", "count"):
            kw["action"] = a["action"]
        if a["action"] not in ("store_true", "store_false", "count"):
            if a["type"] in ("int", "float"):
                kw["type"] = {"int": int, "float": float}[a["type"]]
            if a["choices"]:
                kw["choices"] = a["choices"]
            if a["nargs"] is not None:
                kw["nargs"] = a["nargs"]
        parser.add_argument(*flags, **kw)
    return parser


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(program, its arguments) of each python / torchrun call, shell variables filled in with
    the script's defaults (or a stand-in for a required one)."""
    import re
    import shlex

    defaults = dict(re.findall(r"^(\w+)=\$\{\w+:-([^}]*)\}", text, re.M))
    required = re.findall(r"^(\w+)=\$\{\w+:\?", text, re.M)
    env = {**defaults, **dict.fromkeys(required, "100")}
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True) if line.strip() else []
        if not words or words[0] not in ("python", "torchrun"):
            continue
        words = [re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), "x"), w) for w in words]
        at = next(i for i, w in enumerate(words) if w.endswith(".py"))
        out.append((words[at], words[at + 1:]))
    return out


@pytest.mark.parametrize("recipe, args", [
    ("configs/pcl_reasoner_v1_5/sft.yaml", []),
    ("configs/pcl_reasoner_v1_5/sft.yaml", ["--tp", "4", "--pp", "2", "--train-iters", "10"]),
])
def test_every_generated_command_parses_against_the_pinned_release(tmp_path, recipe, args):
    """Names, types and choices of every flag of every command, by the release's own
    definitions (a flag name that exists with a wrong value, like --distributed-backend hccl,
    fails here)."""
    import argparse

    scripts = export(tmp_path, REPO / recipe, *args)
    checked = 0
    for file, text in scripts.items():
        for program, argv in commands(text):
            try:
                parsed, unknown = release_parser(program).parse_known_args(argv)
            except argparse.ArgumentError as exc:
                pytest.fail(f"{file}: {program} rejects {exc}")
            assert not unknown, f"{file}: {program} does not know {unknown}"
            checked += 1
    assert checked == 4


def test_mindspeed_data_rows_are_asked_as_infer_asks_and_fit(tmp_path, tiny_model_dir):
    import json

    from reasoner.config import SFTConfig, load
    from reasoner.data.template import render_prompt
    from reasoner.export.mindspeed import prepare_data

    cfg = load(SFTConfig, REPO / "configs/pcl_reasoner_v1_5/sft.yaml", [
        f"model.name_or_path={tiny_model_dir}",
        f"data.path={REPO / 'tests/fixtures/data/am_sharegpt.jsonl'}"])
    counts = prepare_data(cfg, tmp_path / "all.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert counts == {"rows": 3, "dropped_over_32768_tokens": 0} and len(rows) == 3
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == cfg.template.system_prompt  # the recipe's, not the row's
    from reasoner import models

    tok = models.load_tokenizer(str(tiny_model_dir))
    assert tok.apply_chat_template(first[:2], tokenize=False, add_generation_prompt=True) == \
        render_prompt("What is $3+4\\cdot 2$?", cfg.template, tok)
    short = cfg.model_copy(update={"max_tokens": 60})
    counts = prepare_data(short, tmp_path / "short.jsonl")
    assert counts["rows"] + counts["dropped_over_60_tokens"] == 3 and counts["dropped_over_60_tokens"]
