import torch

from reasoner import device as dev
from reasoner import sft
from reasoner.config import SFTConfig
from reasoner.models.logprobs import PolicyLogprobs


def config(synth_dir, model_dir, out, **kw) -> SFTConfig:
    data = {"path": str(synth_dir / "sft"), "limit": 12}
    return SFTConfig.model_validate({
        "model": {"name_or_path": str(model_dir)}, "data": data, "output_dir": str(out),
        "max_tokens": 512, "seq_len": 700, **kw})


def grads(policy, batches_of_rows, data, cfg, pad_id, denom):
    policy.zero_grad()
    for rows in batches_of_rows:
        batch = sft.collate(data, rows, cfg, pad_id, varlen=False)
        sft.step_loss(policy, batch, denom, 1.0, torch.device("cpu"), torch.float32)
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def test_gradient_same_for_micro_batches_and_packing(tmp_path, synth_dir, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from reasoner import models

    tok = models.load_tokenizer(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    policy = PolicyLogprobs(model, chunk_size=64)
    packed_cfg = config(synth_dir, tiny_model_dir, tmp_path, packing=True)
    padded_cfg = config(synth_dir, tiny_model_dir, tmp_path, packing=False)
    data = sft.tokenize(packed_cfg, tok)
    assert len(data.ids) == 12
    denom = sum(data.targets(i) for i in range(12))
    pad = tok.pad_token_id
    bins = sft.plan_rows(data, packed_cfg)
    assert 1 < len(bins) < 12
    one_packed = grads(policy, [bins], data, packed_cfg, pad, denom)
    many_packed = grads(policy, [[b] for b in bins], data, packed_cfg, pad, denom)
    singles = [[i] for i in range(12)]
    one_padded = grads(policy, [singles], data, padded_cfg, pad, denom)
    four_padded = grads(policy, [singles[i:i + 3] for i in range(0, 12, 3)], data, padded_cfg,
                        pad, denom)
    assert one_packed.keys() == one_padded.keys()
    for name in one_packed:
        ref = one_packed[name]
        for other in (many_packed, one_padded, four_padded):
            assert torch.allclose(other[name], ref, atol=1e-10, rtol=1e-8), name


def test_token_cache_reused_and_long_examples_dropped(tmp_path, synth_dir, tiny_model_dir):
    from reasoner import models

    tok = models.load_tokenizer(str(tiny_model_dir))
    first = sft.tokenize(config(synth_dir, tiny_model_dir, tmp_path), tok)
    again = sft.tokenize(config(synth_dir, tiny_model_dir, tmp_path), tok)
    assert not first.cache_hit and again.cache_hit and list(again.ids) == list(first.ids)
    cut = sorted(len(x) for x in first.ids)[6]
    short = sft.tokenize(config(synth_dir, tiny_model_dir, tmp_path, max_tokens=cut), tok)
    assert short.cache_hit and short.dropped == sum(len(x) > cut for x in first.ids)
    assert all(len(x) <= cut for x in short.ids)
    # the loss mask covers exactly the response, whose text ends with the end-of-turn token
    i = 0
    resp = tok.decode(first.ids[i][first.prompt_lens[i]:])
    assert resp.startswith("<think>") and resp.endswith("<|im_end|>")


def test_micro_batches_split_the_global_batch_between_processes():
    cfg = SFTConfig.model_validate({"model": {"name_or_path": "x"}, "data": {"path": "x"},
                                    "output_dir": "o", "run": {"micro_batch": 2}})
    rows = list(range(5))
    parts = [sft.micro_batches(rows, cfg, dev.DistInfo(r, 2, r), [1] * 5) for r in (0, 1)]
    assert parts[0] == parts[1]  # every process computes every group's, alike
    assert [len(p) for p in parts[0]] == [2, 1]  # uneven: training.accumulate evens it out
    assert sorted(i for p in parts[0] for mb in p for i in mb) == rows
