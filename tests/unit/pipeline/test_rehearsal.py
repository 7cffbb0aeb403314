"""The rehearsal at reduced depth: PCL-Reasoner-V1.5's own training steps at Qwen2.5-32B's real
widths on 64 fake processes, 2 decoder layers, rows of 8,192 tokens (a few seconds each), and
the plan held to it line by line (issue 52). The full-scale rehearsals are
`scripts/bench_rehearsal.py`'s (minutes each)."""

from pathlib import Path

import pytest
import yaml

from reasoner.config import OfflineConfig, SFTConfig
from reasoner.models import footprint
from reasoner.pipeline import rehearsal, rehearsal_report

REPO = Path(__file__).resolve().parents[3]
PCL = REPO / "configs" / "pcl_reasoner_v1_5"
MODEL = "Qwen/Qwen2.5-32B"
LAYERS, ROW = 2, 8192


def stage_config(stage: str):
    if stage == "sft":
        return SFTConfig.model_validate(yaml.safe_load((PCL / "sft.yaml").read_text()))
    return OfflineConfig.model_validate(yaml.safe_load((PCL / "train_offline.yaml").read_text()))


_done: dict = {}


def rehearsed(stage: str, kind: str, row: int = ROW) -> rehearsal.Rehearsal:
    """One reduced rehearsal per case for the whole module (each runs the step 3 times)."""
    if (stage, kind, row) not in _done:
        _done[stage, kind, row] = rehearsal.rehearse(stage, stage_config(stage), MODEL, 64,
                                                     kind, LAYERS, row)
    return _done[stage, kind, row]


# (stage, kind, tokens a row); sft's whole 32K row puts the peak in the last layer's backward;
# train-offline's 8,192-token rows are one log-prob chunk a process at the recipe's SP 2, its
# 32K rows several (the lm-head backward's two regimes, models.footprint._lm_head_backward)
CASES = [("sft", "h100", ROW), ("sft", "h100", 32_768), ("train-offline", "h100", ROW),
         ("train-offline", "910b", ROW), ("train-offline", "h100", 32_768)]


@pytest.mark.parametrize("stage, kind, row", CASES)
def test_the_plan_s_time_per_step_counts_what_the_rehearsal_counts(stage, kind, row):
    """The plan's time per step is its FLOPs at an assumed MFU plus its collectives' bytes at an
    assumed link bandwidth: the bytes it reckons per micro-batch (`models.traffic`: FSDP2's
    gathers and reduce-scatters, Ulysses' all-to-alls) are the ones the rehearsal's step sent
    on its fake process group, to 1%; its FLOPs within 12% of the ones counted (the matmuls by
    torch's flop counter, attention by the kernel stand-ins): the plan scores every token of a
    row with the lm-head, the step only the response's, 6% of an 8,192-token row's tokens and
    at 2 layers half the model's FLOPs (2-6% at full depth)."""
    from reasoner.models.traffic import micro_batch_traffic
    from reasoner.pipeline.plan import _dtype_bytes
    from reasoner.pipeline.step_time import step_flops

    r = rehearsed(stage, kind, row)
    c = r.config
    traffic = micro_batch_traffic(r.shape, r.devices, c.run.sequence_parallel,
                                  c.micro_batch_tokens, _dtype_bytes(c, kind),
                                  c.run.vocab_layout, c.run.gradient_checkpointing)
    counted = sum(r.collectives.values()) / rehearsal.MICRO_BATCHES
    assert sum(traffic.values()) == pytest.approx(counted, rel=0.01)
    assert ("all-to-all" in traffic) == (c.run.sequence_parallel > 1)
    flops = step_flops(r.shape, row, row, c.run.gradient_checkpointing) / c.run.sequence_parallel
    assert flops == pytest.approx(r.flops / rehearsal.MICRO_BATCHES, rel=0.12)


@pytest.mark.parametrize("stage", ["sft", "train-offline"])
def test_one_node_s_vocabulary_parallel_step_is_rehearsed_and_planned_alike(stage):
    """One node of 8 H100s, where `auto` picks the vocabulary-parallel embedding and lm-head:
    its counts come from the host (`packing.pass_peers`), so the step runs on fake tensors too.
    Its rows (DTensors FSDP2 leaves alone) count as weight and gradient shards, their AdamW
    state at this process's size; the peak is a layer's backward with the layer above it
    still reduce-scattering its fp32 gradient (4 layers: the next one's all-gather beside), and
    one MLP matrix's weight gradient in fp16 among its temporaries (most of them at train-
    offline's 4,096 tokens a process: SP 2 of 8,192-token rows)."""
    cfg = stage_config(stage)
    r = rehearsal.rehearse(stage, cfg, MODEL, 8, "h100", 4, ROW)
    assert r.config.run.vocab_layout == "vocab-parallel"
    rows = rehearsal_report.compare(r, "h100")
    assert rehearsal_report.mismatched(rows) == []
    assert r.peak["AdamW state"] == pytest.approx(2 * r.peak["weight shards"], rel=1e-6)
    assert r.load == pytest.approx(r.peak["weight shards"])
    assert r.by_kind["Reduce Scatter"] == pytest.approx(4 * r.shape.layer_params, rel=1e-3)
    assert r.collectives["broadcast"] > 0 and r.collectives["reduce"] > 0
    from reasoner.models.traffic import micro_batch_traffic

    c = r.config  # the activations every process sends every other, as the plan reckons them
    traffic = micro_batch_traffic(r.shape, 8, c.run.sequence_parallel, c.micro_batch_tokens, 2,
                                  "vocab-parallel", True)
    sent = (r.collectives["broadcast"] + r.collectives["reduce"]) / rehearsal.MICRO_BATCHES
    # within 4%: the plan's formula sends the lm-head's hidden states, targets and gradients for
    # every token of a row, the step for its scored tokens only (7,680 of 8,192 here)
    assert traffic["broadcast + reduce"] == pytest.approx(sent, rel=0.04)


@pytest.mark.parametrize("stage, kind, row", CASES)
def test_the_plan_is_the_rehearsal_line_by_line_at_reduced_depth(stage, kind, row):
    """Each plan line within 10% of what the tracker saw at the peak, the total too. The peak
    is the lm-head's backward (its fp32 copy and gradient sum, a chunk of logits, with the
    gathered lm-head, the next layer's all-gather buffer and every checkpointed input), or with
    sft's 32K tokens a process the last layer's (its activations recomputed, the lm-head's fp32
    gradient reduce-scattering)."""
    r = rehearsed(stage, kind, row)
    rows = rehearsal_report.compare(r, kind)
    assert [line for line, _, _ in rows] == [*rehearsal.LINES, "total"]
    assert rehearsal_report.mismatched(rows) == []
    assert r.where.startswith("backward, FSDPPolicyLogprobs.model." + (
        f"model.layers.{LAYERS - 1}." if (stage, row) == ("sft", 32_768) else "lm_head"))
    assert r.config.run.vocab_layout == "fsdp"  # what the whole recipe runs with at 64 devices
    assert r.shape.layers == LAYERS and r.shape.hidden == 5120  # real widths, reduced depth
    assert r.load == pytest.approx(r.peak["weight shards"])  # the shards, before a step


@pytest.mark.parametrize("stage, kind, row", CASES)
@pytest.mark.parametrize("line", list(rehearsal.LINES))
def test_any_plan_line_moved_by_20_percent_is_caught(monkeypatch, stage, kind, row, line):
    """The check above fails when one line of the plan's arithmetic moves by 20% either way."""
    r = rehearsed(stage, kind, row)
    real = footprint.sharded_bytes
    for factor in (1.2, 0.8):
        def moved(*args, factor=factor, **kwargs):
            parts = real(*args, **kwargs)
            return {**parts, line: parts[line] * factor}

        monkeypatch.setattr(footprint, "sharded_bytes", moved)
        off = rehearsal_report.mismatched(rehearsal_report.compare(r, kind))
        assert any(said.startswith(f"{line}:") for said in off), (line, factor, off)


def test_the_rehearsal_runs_the_trainers_own_step_and_the_kernels_stand_in(monkeypatch):
    """sft's `step_loss` is what runs, once per micro-batch of every step (2 measured, 1
    counted), the update through the loop's `unscale_and_clip`; attention through the flash
    varlen stand-in (its FLOPs counted), and every collective's bytes counted."""
    from reasoner import sft, training
    from reasoner.models import stand_ins

    calls = {"step_loss": 0, "unscale_and_clip": 0, "attention": 0}
    for module, name in ((sft, "step_loss"), (training, "unscale_and_clip")):
        def counted(*args, real=getattr(module, name), name=name, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    real_attention = stand_ins.attention

    def attention(kernel):
        inner = real_attention(kernel)

        def forward(*args, **kwargs):
            calls["attention"] += 1
            return inner(*args, **kwargs)
        return forward

    monkeypatch.setattr(stand_ins, "attention", attention)
    # an entry of transformers' attention table left in its instance (restoring an item of it
    # writes one there: CI's rehearsals all ran transformers' own flash-attn forward after a
    # test that had patched it): the stand-in still runs, and the entry is back afterwards
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def left_over(*args, **kwargs):
        raise AssertionError("transformers' own flash_attention_2 ran, not the stand-in")

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, stand_ins.FLASH, left_over)
    r = rehearsal.rehearse("sft", stage_config("sft"), MODEL, 64, "h100", LAYERS, ROW)
    assert ALL_ATTENTION_FUNCTIONS[stand_ins.FLASH] is left_over
    steps = rehearsal.STEPS + 1
    assert calls["step_loss"] == steps * rehearsal.MICRO_BATCHES
    assert calls["unscale_and_clip"] == steps
    # each layer's attention once forward, once more recomputed in backward (checkpointing)
    assert calls["attention"] == steps * rehearsal.MICRO_BATCHES * LAYERS * 2
    # 6 x (params but the embedding's) x target tokens at least (the flop counter sees the
    # matmuls; the recompute and attention come on top)
    matmuls = r.shape.params - r.shape.vocab * r.shape.hidden
    assert r.flops > 6 * matmuls * (ROW - rehearsal.PROMPT) * rehearsal.MICRO_BATCHES
    assert r.collectives["allgather_base"] > 0 and r.collectives["reduce_scatter_base"] > 0


def test_what_cannot_be_rehearsed_yet_is_said_not_run():
    """A LoRA moving reference and LoRA over several processes are refused with the reason,
    before any work; the CLI prints the reason in the stage's place. Either vocabulary layout
    is rehearsed (the vocab-parallel one since its counts come from the host), and OREAL's
    token RM beside the policy."""
    sft_cfg = stage_config("sft")
    tight = rehearsal.recipe_layout(sft_cfg, MODEL, 64, "npu")  # 64 GiB: the FSDP2 units fit
    assert tight == "fsdp" and rehearsal.not_rehearsed(sft_cfg, 64, tight) == ""
    assert rehearsal.not_rehearsed(sft_cfg, 64, "vocab-parallel") == ""
    oreal = with_objective({"name": "oreal"})
    assert rehearsal.not_rehearsed(oreal, 64, "fsdp") == ""
    lora = one_gpu_config("train_offline_lora.yaml", "Qwen/Qwen2.5-7B-Instruct")
    assert rehearsal.not_rehearsed(lora, 1, "whole") == ""
    assert "LoRA" in rehearsal.not_rehearsed(lora, 8, "fsdp")
    moving = lora.model_copy(update={"objective": with_objective(
        {"name": "prorl", "kl_coef": 1e-4, "reset_every": 2}).objective})
    assert "LoRA moving reference" in rehearsal.not_rehearsed(moving, 1, "whole")
    with pytest.raises(Exception, match="not rehearsed: LoRA adapters on several processes"):
        rehearsal.rehearse("train-offline", lora, "Qwen/Qwen2.5-7B-Instruct", 8, "h100", LAYERS,
                           ROW)


def with_objective(objective: dict) -> OfflineConfig:
    """PCL's train-offline stage with another objective."""
    raw = yaml.safe_load((PCL / "train_offline.yaml").read_text())
    return OfflineConfig.model_validate({**raw, "objective": objective})


@pytest.mark.parametrize("objective", [
    {"name": "prorl", "kl_coef": 1e-4, "reset_every": 2},  # ProRL's resets: at step 2
    {"name": "discounted", "kl_coef": 1e-3, "ref_update_every": 1}])  # averaged every step
def test_a_moving_reference_is_rehearsed_beside_the_policy(monkeypatch, objective):
    """An objective whose reference moves keeps a second model, loaded and sharded as the
    policy is (fp32 shards: 4 bytes a parameter over the processes), scored in every
    micro-batch and moved after the update by the trainer's own `move_reference` (a reset or
    an average, both run here); the plan's `reference / token RM` line and every other line
    within 10% of the rehearsal."""
    cfg = with_objective(objective)
    assert cfg.objective.resident_reference
    r = rehearsal.rehearse("train-offline", cfg, MODEL, 64, "h100", LAYERS, ROW)
    rows = rehearsal_report.compare(r, "h100")
    assert [line for line, _, _ in rows] == [*rehearsal.LINES, "reference / token RM", "total"]
    assert rehearsal_report.mismatched(rows) == []
    assert r.peak["reference / token RM"] == pytest.approx(4 * r.shape.params / 64, rel=1e-3)
    assert r.load == pytest.approx(r.peak["weight shards"] + r.peak["reference / token RM"])
    assert sent_as_planned(r, "h100")  # its forward gathers its shards once more
    plain = rehearsed("train-offline", "h100")  # its forward adds FLOPs, not held memory
    assert r.flops > plain.flops
    assert r.total - r.peak["reference / token RM"] == pytest.approx(plain.total, rel=0.02)
    real = footprint.sharded_bytes
    for factor in (1.2, 0.8):  # the reference's line of the plan moved by 20%: caught
        def moved(*args, factor=factor, **kwargs):
            parts = real(*args, **kwargs)
            return {**parts, "reference / token RM": parts["reference / token RM"] * factor}

        monkeypatch.setattr(footprint, "sharded_bytes", moved)
        off = rehearsal_report.mismatched(rehearsal_report.compare(r, "h100"))
        assert [said.split(":")[0] for said in off] == ["reference / token RM"]


def test_oreal_s_token_rm_is_rehearsed_beside_the_policy():
    """OREAL's recipe (its own config: 32 devices, two 16K rows a micro-batch shared by SP 2;
    rows of 8,192 here) keeps a token RM beside the policy: a third model built and sharded as
    `token_rm.load_token_rm` builds it (the trunk and a scalar head), trained in every
    micro-batch by `MicroStep` and stepped after the policy. Through the policy's peak it holds
    its fp32 weight shards, a gradient shard and AdamW's two moments for every trained one
    (16 bytes a parameter over the processes; its untied lm-head frozen: 4), the plan's
    `reference / token RM` line exactly; every other line within 10%."""
    cfg = OfflineConfig.model_validate(yaml.safe_load(
        (REPO / "configs" / "oreal" / "train_offline.yaml").read_text()))
    assert cfg.objective.uses_token_rm and cfg.run.micro_batch == 2
    r = rehearsal.rehearse("train-offline", cfg, MODEL, 32, "h100", LAYERS, ROW)
    rows = rehearsal_report.compare(r, "h100")
    assert rehearsal_report.mismatched(rows) == []
    head = r.shape.vocab * r.shape.hidden
    assert r.peak["reference / token RM"] == pytest.approx(
        (16 * r.shape.params - 12 * head) / 32, rel=1e-3)
    assert dict((line, plan) for line, plan, _ in rows)["reference / token RM"] == \
        pytest.approx(r.peak["reference / token RM"], rel=1e-3)
    assert r.load == pytest.approx(r.peak["weight shards"] + 4 * r.shape.params / 32, rel=1e-3)
    assert sent_as_planned(r, "h100")  # its trunk gathered twice and reduced, all-to-alls too


def sent_as_planned(r: rehearsal.Rehearsal, kind: str) -> bool:
    """The bytes the plan reckons a micro-batch sends (models.traffic, with the models beside
    the policy) are those the rehearsal's step sent, to 1%."""
    from reasoner.models.traffic import micro_batch_traffic
    from reasoner.pipeline.plan import _dtype_bytes

    c, obj = r.config, r.config.objective
    planned = micro_batch_traffic(r.shape, r.devices, c.run.sequence_parallel,
                                  c.micro_batch_tokens, _dtype_bytes(c, kind), c.run.vocab_layout,
                                  c.run.gradient_checkpointing, 0, obj.resident_reference,
                                  obj.uses_token_rm)
    counted = sum(r.collectives.values()) / rehearsal.MICRO_BATCHES
    return sum(planned.values()) == pytest.approx(counted, rel=0.01)


ONE_GPU = REPO / "configs" / "gsm8k_1gpu"


def one_gpu_config(name: str, model: str) -> OfflineConfig:
    raw = yaml.safe_load((ONE_GPU / name).read_text())
    raw["model"]["name_or_path"] = model
    return OfflineConfig.model_validate(raw)


def test_one_process_is_rehearsed_with_the_whole_model_line_by_line():
    """The one-GPU recipe's train-offline (Qwen2.5-0.5B widths, 2 layers, its 8,192-token rows)
    on an L4: one process holds the whole model (fp32 masters under bf16 autocast, no FSDP2),
    tracked by torch's MemTracker; each of the plan's lines within 10%."""
    cfg = one_gpu_config("train_offline.yaml", "Qwen/Qwen2.5-0.5B-Instruct")
    r = rehearsal.rehearse("rl", cfg, "Qwen/Qwen2.5-0.5B-Instruct", 1, "l4", LAYERS)
    rows = rehearsal_report.compare(r, "l4")
    assert [line for line, _, _ in rows] == [*rehearsal.LINES_WHOLE, "total"]
    assert rehearsal_report.mismatched(rows) == []
    assert r.peak["weights"] == pytest.approx(4 * r.shape.params)  # fp32 masters, whole


def test_the_plan_command_prints_each_stage_beside_its_rehearsal(monkeypatch):
    """`reasoner plan RECIPE --rehearse`: after the plan's table, each training stage's
    rehearsal (shrunk to 2 layers and 8,192-token rows here), line by line beside the plan,
    with its peak, loading, FLOPs, bytes and time per step; a stage that cannot be rehearsed
    says why in its place."""
    from tests_helpers import reasoner

    real = rehearsal.rehearse
    monkeypatch.setattr(rehearsal, "rehearse",
                        lambda *args, **kwargs: real(*args, LAYERS, ROW, **kwargs))
    out = reasoner("plan", PCL / "recipe.yaml", "--devices", "64", "--kind", "h100",
                   "--rehearse")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for stage in ("sft", "train-offline"):
        assert f"{stage}: rehearsed on 64 fake processes ({LAYERS} layers, rows of 8,192" in text
    assert text.count("  weight shards ") == 2 and "peak in backward" in text
    assert "TFLOP/s x MFU 0.35" in text and "collectives (GB): allgather_base" in text
    lora = reasoner("plan", PCL / "recipe.yaml", "--devices", "64", "--kind", "h100",
                    "--rehearse", "train-offline.model.lora={r: 16}")
    assert "train-offline: not rehearsed: LoRA adapters on several processes" in lora.stdout
