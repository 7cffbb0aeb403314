import math

import pytest
import torch

from reasoner import shards
from reasoner import train_offline as T
from reasoner.config import OfflineConfig
from reasoner.train_offline import behaviour, kl_reference
from reasoner.train_offline.objectives import GlobalCounts, sample_signal, token_scope
from reasoner.train_offline.rollouts import Batching, load_rollouts


def cfg_for(model_dir, verified, out, **kw):
    base = {"model": {"name_or_path": str(model_dir)}, "input_dir": str(verified),
            "output_dir": str(out), "seq_len": 256, "max_tokens": 256,
            "run": {"global_batch": 8, "max_steps": 2, "progress": False}}
    base.update(kw)
    return OfflineConfig.model_validate(base)


def grads_for(cfg, model_dir, cut):
    """Gradient of one global batch of all samples, micro-batches as `cut` says."""
    from transformers import AutoModelForCausalLM

    from reasoner.device import DistInfo, Env
    from reasoner.models import load_tokenizer
    from reasoner.models.logprobs import PolicyLogprobs

    tok = load_tokenizer(str(model_dir))
    data = load_rollouts(cfg, tok)
    obj = cfg.objective
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    policy = PolicyLogprobs(model, 64)
    lp = data.old_logp
    inputs = T.PerSample(sample_signal(obj, data).double(), token_scope(obj, data), lp, lp, "", {})
    batching = Batching.of(cfg, tok.pad_token_id)
    micro = T.MicroStep(obj, data, inputs, batching, Env(torch.device("cpu"), DistInfo(),
                                                         torch.float64))
    idx = list(range(len(data.ids)))
    counts = GlobalCounts(len(idx), sum(data.resp_len(i) for i in idx),
                          sum(data.resp_len(i) for i in idx if data.rewards[i] > 0))
    rows = [r for mb in batching.micro_batches(idx, data) for r in mb]
    for chunk in cut(rows):
        micro(policy, chunk, counts, 1.0)
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("objective", [
    {"name": "pcl"}, {"name": "rft"}, {"name": "dapo"}, {"name": "pcl", "neg_scope": "first"},
    {"name": "dapo", "agg": "seq-mean-token-mean", "kl_coef": 0.1}, {"name": "discounted"},
    {"name": "oreal", "token_weights": "uniform"}, {"name": "gspo", "eps_high": 0.3},
    {"name": "cispo"}, {"name": "oapl"}, {"name": "dapo", "correction": {"name": "seq-tis"}},
])
def test_gradient_independent_of_micro_batches_and_packing(tmp_path, tiny_model_dir, verified_dir,
                                                           objective):
    packed = cfg_for(tiny_model_dir, verified_dir, tmp_path, objective=objective, packing=True)
    padded = cfg_for(tiny_model_dir, verified_dir, tmp_path, objective=objective, packing=False)
    whole = grads_for(packed, tiny_model_dir, lambda rows: [rows])
    per_row = grads_for(packed, tiny_model_dir, lambda rows: [[r] for r in rows])
    pad_one = grads_for(padded, tiny_model_dir, lambda rows: [rows])
    pad_four = grads_for(padded, tiny_model_dir, lambda rows: [rows[i::4] for i in range(4)])
    for name, ref in whole.items():
        for other in (per_row, pad_one, pad_four):
            assert torch.allclose(other[name], ref, atol=1e-10, rtol=1e-7), name


def test_bad_inputs(tmp_path, tiny_model_dir, verified_dir, synth_dir):
    from reasoner.sft import TrainingError

    no_reward = tmp_path / "nr"
    rows = [r for r in shards.iter_rows(verified_dir)]
    shards.write_rows(no_reward, [{k: v for k, v in r.items() if k != "reward"} for r in rows])
    shards.finish(no_reward, {})
    with pytest.raises(shards.ShardError, match='missing field "reward"'):
        T.run(cfg_for(tiny_model_dir, no_reward, tmp_path / "o1"))
    no_lp = tmp_path / "nolp"
    shards.write_rows(no_lp, [{k: v for k, v in r.items() if k not in ("logprobs", "token_ids")}
                              for r in rows])
    shards.finish(no_lp, {})
    with pytest.raises(TrainingError, match="sampling.logprobs=true"):
        T.run(cfg_for(tiny_model_dir, no_lp, tmp_path / "o2",
                      objective={"name": "dapo", "allow_recompute": False}))
    out = T.run(cfg_for(tiny_model_dir, no_lp, tmp_path / "o3", objective={"name": "dapo"}))
    assert (out / "model.safetensors").exists()
    assert shards.is_complete(tmp_path / "o3" / "ref_logprobs")  # computed once, cached
    with pytest.raises(TrainingError, match="non-finite loss .* at step 2"):
        T.run(cfg_for(tiny_model_dir, verified_dir, tmp_path / "o4", optim={"lr": 1e30,
              "grad_clip": None}, objective={"name": "rft"}, run={"global_batch": 8, "max_steps": 3,
                                                               "progress": False}))


@pytest.mark.parametrize("objective, tied", [
    ({"name": "oreal", "token_weights": "rm", "rm_lr": 0.3}, True),  # the token RM resumes too
    # untied, the RM's LM head is never used: it had no optimiser state to save, yet a fresh
    # optimiser's template asked for some on resume ("Missing key" from DCP)
    ({"name": "oreal", "token_weights": "rm", "rm_lr": 0.3}, False),
    ({"name": "prorl", "reset_every": 1, "kl_coef": 50.0}, True),    # so does the reset reference
])
def test_resume_restores_token_rm_and_reference(tmp_path, tiny_model_dir, verified_dir, synth_dir,
                                                tiny_shape, objective, tied):
    import json
    import shutil

    from safetensors.torch import load_file

    from reasoner import models
    from reasoner.config import TinyConfig

    model_dir = tiny_model_dir if tied else models.build_tiny(TinyConfig(
        output_dir=tmp_path / "untied", corpus=[synth_dir / "sft"],
        model=tiny_shape.model_copy(update={"tie_word_embeddings": False})))

    def cfg(out):
        return cfg_for(model_dir, verified_dir, out, objective=objective,
                       optim={"lr": 1e-2, "min_lr": 1e-2}, run={"global_batch": 8, "max_steps": 4, "save_every": 2,
                                                "keep_last": 5, "progress": False})

    T.run(cfg(tmp_path / "whole"))
    T.run(cfg(tmp_path / "cut"))
    cut = tmp_path / "cut"  # as if killed after checkpoint-2 (of 3 steps)
    # the auxiliary model is in aux/ (torch.distributed.checkpoint, shard by shard), not
    # gathered into trainer_state.pt (which every process would load whole on resume)
    state = torch.load(cut / "checkpoint-2" / "trainer_state.pt", weights_only=False)
    assert not {"token_rm", "token_rm_optim", "reference"} & state.keys()
    assert (cut / "checkpoint-2" / "aux" / ".metadata").exists()
    shutil.rmtree(cut / "checkpoint-3")
    shutil.rmtree(cut / "final")
    manifest = json.loads((cut / "manifest.json").read_text())
    (cut / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    T.run(cfg(cut))
    assert json.loads((cut / "manifest.json").read_text())["counts"]["resumed_from"] == 2
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(cut / "final" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)


def test_validation_triggered_reset(tmp_path, tiny_model_dir, verified_dir):
    import json

    cfg = cfg_for(tiny_model_dir, verified_dir, tmp_path / "out",
                  objective={"name": "prorl", "kl_coef": 0.1, "reset_patience": 1, "val_every": 1,
                             "val_fraction": 0.34},
                  optim={"lr": 1e-12}, run={"global_batch": 4, "max_steps": 4, "progress": False})
    T.run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    margins = [r["val_margin"] for r in rows]
    # lr ~0: the margin never improves after the first check, so every later check resets
    assert [r["resets"] for r in rows] == [0, 1, 1, 2]
    assert max(margins) - min(margins) < 1e-6
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]
    assert counts["plateau_resets"] == 2 and counts["validation_samples"] == 8
    from reasoner.models import load_tokenizer

    data = load_rollouts(cfg, load_tokenizer(str(tiny_model_dir)))
    train, val = kl_reference.split_validation(data, cfg.objective, 0)
    assert not set(train) & set(val) and len(train) + len(val) == counts["samples"]


def test_rollouts_are_memory_mapped_once_and_match_the_shard(tmp_path, tiny_model_dir, verified_dir):
    """Token ids and behaviour log-probs live in an Arrow file mapped from disk (not Python
    lists of every token), written once and reread while the Verified shard is unchanged."""
    from reasoner.data.token_cache import ListColumn
    from reasoner.models import load_tokenizer
    from reasoner.records import Verified

    tok = load_tokenizer(str(tiny_model_dir))
    cfg = cfg_for(tiny_model_dir, verified_dir, tmp_path / "o", max_tokens=150)
    data = load_rollouts(cfg, tok)
    assert isinstance(data.ids, ListColumn) and isinstance(data.old_logp, ListColumn)
    assert all(not values.flags.owndata for values, _ in data.ids._chunks)
    rows = {(r["id"], r["sample_idx"]): r for r in shards.iter_rows(verified_dir, Verified)}
    for i, key in enumerate(data.keys):
        r = rows[key]
        prompt = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        assert data.ids[i] == prompt + r["token_ids"] and data.prompt_lens[i] == len(prompt)
        assert data.old_logp[i] == pytest.approx(r["logprobs"], abs=1e-6)  # stored as float32
        assert float(data.rewards[i]) == r["reward"]
    assert data.dropped == sum(len(tok(r["prompt"], add_special_tokens=False)["input_ids"])
                               + len(r["token_ids"]) > 150 for r in rows.values()) > 0
    files = sorted((tmp_path / "o" / "rollouts").iterdir())
    again = load_rollouts(cfg, tok)
    assert sorted((tmp_path / "o" / "rollouts").iterdir()) == files and again.keys == data.keys


def test_token_rm_warmup_gives_the_policy_its_first_signal(tmp_path, tiny_model_dir, verified_dir):
    """A fresh token RM scores 0, p = 0.5, so OREAL's weights clip(2p - 1) are all 0 and the
    first step leaves the policy where it was; `rm_warmup_steps` trains the RM alone first."""
    import json

    from safetensors.torch import load_file

    start = load_file(tiny_model_dir / "model.safetensors")

    def trained(out, warmup):
        T.run(cfg_for(tiny_model_dir, verified_dir, out, optim={"lr": 1e-3, "weight_decay": 0.0},
                      objective={"name": "oreal", "rm_lr": 3e-3, "rm_warmup_steps": warmup,
                                 "beta": 0.0},  # no KL: its gradient at theta_ref is ~0, not 0
                      run={"global_batch": 8, "max_steps": 1, "progress": False}))
        return load_file(out / "final" / "model.safetensors"), json.loads(
            (out / "manifest.json").read_text())["counts"]

    cold, cold_counts = trained(tmp_path / "cold", 0)
    assert all(torch.equal(cold[k], start[k]) for k in start)
    assert "rm_warmup_bce" not in cold_counts
    warm, counts = trained(tmp_path / "warm", 4)
    bce = counts["rm_warmup_bce"]
    assert len(bce) == 4 and bce[0] == pytest.approx(0.6931, abs=1e-4)  # log 2: p = 0.5
    assert bce[-1] < bce[0]
    assert any(not torch.equal(warm[k], start[k]) for k in start)
    metrics = (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in metrics] == [1]  # the policy's steps: warm-up apart


def test_reference_model_anchors_the_kl_and_nothing_else(tmp_path, tiny_model_dir, verified_dir):
    """`reference` (ProRL without resets: every round anchored to round 1's start) scores the
    KL's reference log-probs; the behaviour log-probs stay the starting model's."""
    import shutil

    from pydantic import ValidationError
    from safetensors.torch import load_file, save_file

    from reasoner import training
    from reasoner.models import load_tokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    weights = load_file(other / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    save_file({k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in weights.items()},
              other / "model.safetensors", metadata={"format": "pt"})
    tok = load_tokenizer(str(tiny_model_dir))
    obj = {"name": "prorl", "kl_coef": 0.1}

    def inputs_of(model, out, **kw):
        cfg = cfg_for(model, verified_dir, out, objective=obj, **kw)
        data = load_rollouts(cfg, tok)
        env = training.setup(cfg.model, cfg.run)
        return T.prepare(cfg, env, tok.pad_token_id, data, None).per_sample, data

    anchored, data = inputs_of(tiny_model_dir, tmp_path / "a", reference=str(other))
    plain, _ = inputs_of(tiny_model_dir, tmp_path / "p")
    of_other, _ = inputs_of(other, tmp_path / "o")
    for i in range(len(data.ids)):
        assert list(anchored.ref_logp[i]) == list(of_other.ref_logp[i])  # scored by `reference`
        assert list(anchored.old_logp[i]) == list(plain.old_logp[i])  # behaviour: the start
    assert list(plain.ref_logp[0]) != list(of_other.ref_logp[0])
    with pytest.raises(ValidationError, match="only used by a KL term"):
        cfg_for(tiny_model_dir, verified_dir, tmp_path, objective={"name": "pcl"}, reference="x")
    with pytest.raises(ValidationError, match="reference and objective.reset_every disagree"):
        cfg_for(tiny_model_dir, verified_dir, tmp_path, reference="x",
                objective={**obj, "reset_every": 2})


def test_stored_behaviour_logprobs_are_checked_against_the_trainers_own(tmp_path, tiny_model_dir,
                                                                         verified_dir):
    """The clipped objectives take infer's log-probs as pi_old; on a GPU vLLM's bf16 kernels
    give other numbers than the trainer's, so the ratio is not 1 at theta_old. The first
    samples are scored and compared: within the tolerance they are used, above it recomputed
    (or refused without allow_recompute). Here: stored = the trainer's own, then perturbed."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from reasoner.errors import TrainingError
    from reasoner.models import load_tokenizer
    from reasoner.models.logprobs import PolicyLogprobs

    cfg = cfg_for(tiny_model_dir, verified_dir, tmp_path,
                  objective={"name": "dapo", "old_logprobs": "samples"})
    tok = load_tokenizer(str(tiny_model_dir))
    data = load_rollouts(cfg, tok)
    from reasoner.device import DistInfo, Env

    policy = PolicyLogprobs(AutoModelForCausalLM.from_pretrained(tiny_model_dir), 64).eval()
    batching = Batching.of(cfg, tok.pad_token_id)
    env = Env(torch.device("cpu"), DistInfo(), torch.float32)
    everything = list(range(len(data.ids)))
    scored = kl_reference.score(policy, data, batching.micro_batches(everything, data), batching,
                             env)
    own = [scored[i] for i in everything]
    check = lambda obj, d: behaviour.check_behaviour(  # noqa: E731
        obj, d, policy, batching, env, "stored by infer")
    recompute, note, gap = check(cfg.objective, dataclasses.replace(data, old_logp=own))
    assert not recompute and gap["max_abs_diff"] < 1e-5 and abs(gap["ratio_mean"] - 1) < 1e-5
    assert note.startswith("stored by infer (stored vs trainer on 16 samples: mean |Δ| 0.0000")
    off = dataclasses.replace(data, old_logp=[[x + 0.3 for x in row] for row in own])
    recompute, note, gap = check(cfg.objective, off)
    assert recompute and gap["mean_abs_diff"] == pytest.approx(0.3, abs=1e-5)
    assert gap["ratio_max"] == pytest.approx(math.exp(-0.3), rel=1e-4)
    assert note.startswith("recomputed by the starting model") and "over the tolerance" in note
    strict = cfg.objective.model_copy(update={"allow_recompute": False})
    with pytest.raises(TrainingError, match="not the trainer's at theta_old"):
        check(strict, off)


@pytest.mark.parametrize("world", [1, 2])
def test_the_token_reward_model_recomputes_activations_like_the_policy(
        tmp_path, tiny_model_dir, verified_dir, monkeypatch, world):
    """OREAL's token RM trains on the policy's batches, so it needs activation checkpointing
    as much as the policy, in one process and sharded. Here `load_sharded` is replaced by a
    whole-model stand-in, since only what is done to the model it returns is under test."""
    from transformers import AutoModelForCausalLM

    from reasoner.device import DistInfo, Env
    from reasoner.models import fsdp
    from reasoner.train_offline.token_rm import load_token_rm

    monkeypatch.setattr(fsdp, "load_sharded", lambda cfg, src, device, dist, wrap, **kw: wrap(
        AutoModelForCausalLM.from_pretrained(src)))
    env = Env(torch.device("cpu"), DistInfo(0, world, 0), torch.float32)
    for checkpointing in (True, False):
        cfg = cfg_for(tiny_model_dir, verified_dir, tmp_path, objective={"name": "oreal"},
                      run={"gradient_checkpointing": checkpointing})
        rm = load_token_rm(cfg, env, "sdpa", None).model
        assert rm.model.model.gradient_checkpointing is checkpointing
        assert rm.training and float(rm.head.weight.abs().sum()) == 0.0


def test_trained_template_is_the_samples_template(tmp_path):
    """Issue 51, finding 12: an imported model (its reasoner.json records no template) trained on
    samples prompted with a system prompt records that prompt, not {}."""
    import json

    from reasoner import shards
    from reasoner.config import OfflineConfig, TemplateConfig
    from reasoner.train_offline import trained_template

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "reasoner.json").write_text(
        json.dumps({"built_by": "reasoner model import"}))
    used = TemplateConfig(system_prompt="Two worked examples.", instruction="")
    shards.update_manifest(tmp_path / "samples", stage="infer",
                           config={"template": used.model_dump(mode="json")})
    shards.update_manifest(tmp_path / "verified", stage="verify",
                           config={"input_dir": str(tmp_path / "samples")},
                           inputs={"input_dir": str(tmp_path / "samples")})
    cfg = OfflineConfig.model_validate({"model": {"name_or_path": str(tmp_path / "model")},
                                        "input_dir": str(tmp_path / "verified"),
                                        "output_dir": str(tmp_path / "rl")})
    assert trained_template(cfg) == used.model_dump(mode="json")


DIAGNOSTICS = {"offpolicy_kl_k3", "offpolicy_chi2", "offpolicy_log_ratio",
               "offpolicy_ratio_outside", "offpolicy_seq_ratio", "offpolicy_seq_ratio_std",
               "offpolicy_seq_ratio_max", "offpolicy_seq_ratio_min"}


@pytest.mark.parametrize("objective, behaviour", [
    ({"name": "pcl"}, "stored by infer, for the off-policy diagnostics only"),
    ({"name": "dapo"}, "recomputed by the starting model"),
    ({"name": "rft", "diagnostics": "starting"}, "the starting model's, scored once"),
    ({"name": "pcl", "diagnostics": "none"}, "not used (objective.diagnostics=none)"),
])
def test_every_step_logs_the_off_policy_diagnostics_and_the_lag(tmp_path, tiny_model_dir,
                                                                verified_dir, objective,
                                                                behaviour):
    """Issue 53: each step's log (and so TensorBoard and wandb, which get the same rows) carries
    the policy's distance from the behaviour log-probs and the lag in steps; the summary the
    last step's values, the lag and where the behaviour log-probs came from. At step 1 the
    policy is the starting model: dapo's recomputed pi_old and rft's starting log-probs give
    rho = 1; pcl compares with the stored ones, of infer's top-k 40 / top-p 0.95 distribution,
    which gave each sampled token about e^2 times the probability the whole vocabulary at T 1
    does: the diagnostics show it. The fixture's Verified shard names no samples folder, so
    the lag counts this run's steps only and says why."""
    import json

    out = tmp_path / "o"
    T.run(cfg_for(tiny_model_dir, verified_dir, out, objective=objective, optim={"lr": 1e-2},
                  run={"global_batch": 8, "max_steps": 2, "progress": False}))
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert [r["lag_steps"] for r in rows] == [0.0, 1.0] and rows[0]["lag_rounds"] == 0.0
    assert counts["behaviour_logprobs"].startswith(behaviour)
    assert counts["lag"].startswith("unknown") and counts["lag_steps_before"] == 0
    assert (out / "ref_logprobs").exists() is (objective["name"] != "pcl")  # a scoring pass
    if objective.get("diagnostics") == "none":
        assert not DIAGNOSTICS & (set(rows[0]) | set(counts))
        return
    assert all(DIAGNOSTICS <= set(r) and "offpolicy_seq_ratio_sq" not in r for r in rows)
    assert counts["offpolicy_chi2"] == round(rows[-1]["offpolicy_chi2"], 6)
    if objective["name"] == "pcl":  # stored by a truncating sampler: rho ~ e^-2 from the start
        assert rows[0]["offpolicy_log_ratio"] < -1.5 and rows[0]["offpolicy_ratio_outside"] > 0.9
        return
    assert rows[0]["offpolicy_kl_k3"] < 1e-6 and rows[0]["offpolicy_ratio_outside"] == 0.0
    assert rows[0]["offpolicy_seq_ratio_std"] < 1e-3
    assert rows[1]["offpolicy_kl_k3"] > 1e-5  # one step later the policy has moved away
