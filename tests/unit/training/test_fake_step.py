"""The trainers' own step on fake tensors, with no harness (issue 52): the model built under
torch's FakeTensorMode, then `training.start`, a micro-batch's forward and backward through
sft's `step_loss` and train-offline's `MicroStep` on the collators' real batches, the loop's
`unscale_and_clip` and the optimiser's step, all as the trainers call them. A fake tensor has
no data: any host read inside the step (an `.item()`, a bool index, `nonzero`) raises here."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from reasoner import models, sft, training
from reasoner import train_offline as T
from reasoner.config import OfflineConfig, SFTConfig
from reasoner.models.logprobs import PolicyLogprobs
from reasoner.train_offline import objectives
from reasoner.train_offline.objectives import GlobalCounts
from reasoner.train_offline.rollouts import Batching, load_rollouts


def fake_model(folder, chunk: int):
    """The HF model of `folder`'s config with fake weights, as the trainers wrap it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder),
                                             attn_implementation="sdpa")
    return training.Loaded(model, PolicyLogprobs(model, chunk))


def updated(state) -> None:
    """Every trained parameter has a fake gradient of its shape before the update, and AdamW
    moments after it."""
    params = [p for p in state.policy.parameters() if p.requires_grad]
    assert all(isinstance(p.grad, FakeTensor) and p.grad.shape == p.shape for p in params)
    norm = training.unscale_and_clip(state)
    assert isinstance(norm, FakeTensor) and norm.dim() == 0
    state.optimizer.step()
    assert all(isinstance(state.optimizer.state[p]["exp_avg"], FakeTensor) for p in params)


def test_an_sft_step_runs_on_fake_tensors(tmp_path, tiny_model_dir, synth_dir):
    cfg = SFTConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"path": str(synth_dir / "sft"), "limit": 40}, "output_dir": str(tmp_path),
        "max_tokens": 512, "seq_len": 700, "packing": True,
        "run": {"global_batch": 4, "micro_batch": 2, "max_steps": 1, "progress": False,
                "gradient_checkpointing": True}})
    env = training.setup(cfg.model, cfg.run, tmp_path)
    tokenizer = models.load_tokenizer(cfg.model.name_or_path)
    data = sft.tokenize(cfg, tokenizer)
    rows = sft.plan_rows(data, cfg)
    with FakeTensorMode(allow_non_fake_inputs=True):
        state = training.start(cfg, env, tokenizer, fake_model(tiny_model_dir, 64), 1, None, "")
        batch = sft.collate(data, rows[:2], cfg, tokenizer.pad_token_id, False)
        out = sft.step_loss(state.policy, batch, 100.0, 1.0, env.device, env.dtype)
        assert isinstance(out.sums["nll"], FakeTensor)
        updated(state)


@pytest.mark.parametrize("objective", ["pcl", "dapo"])
def test_a_train_offline_step_runs_on_fake_tensors(tmp_path, tiny_model_dir, verified_dir,
                                                    objective):
    cfg = OfflineConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)}, "input_dir": str(verified_dir),
        "output_dir": str(tmp_path), "seq_len": 256, "max_tokens": 256,
        "objective": {"name": objective},
        "run": {"global_batch": 8, "micro_batch": 2, "max_steps": 1, "progress": False}})
    env = training.setup(cfg.model, cfg.run, tmp_path)
    tokenizer = models.load_tokenizer(cfg.model.name_or_path)
    data = load_rollouts(cfg, tokenizer)
    obj = cfg.objective
    tokens = [[0.0] * data.resp_len(i) for i in range(len(data.ids))]  # behaviour log-probs
    inputs = T.PerSample(objectives.sample_signal(obj, data), objectives.token_scope(obj, data),
                      tokens if obj.reads_behaviour else None, None, "stored", {})
    batching = Batching.of(cfg, tokenizer.pad_token_id)
    micro = T.MicroStep(obj, data, inputs, batching, env)
    index = list(range(8))
    counts = GlobalCounts(8, sum(data.resp_len(i) for i in index),
                          sum(data.resp_len(i) for i in index if data.rewards[i] > 0))
    rows = batching.micro_batches(index, data)
    with FakeTensorMode(allow_non_fake_inputs=True):
        state = training.start(cfg, env, tokenizer, fake_model(tiny_model_dir, 64), 1, None, "")
        out = micro(state.policy, rows[0], counts, 1.0)
        assert isinstance(out.sums["loss"], FakeTensor)
        assert torch.is_tensor(out.sums["loss"])
        updated(state)
