"""The reference side: ProRL's plateau tracker, the moving reference, held-out splits."""

import copy

import torch

from reasoner.logprobs import PolicyLogprobs
from reasoner.reference import Plateau, average_into, reset


def test_plateau_resets_after_patience_and_rebaselines():
    p = Plateau(patience=2)
    fired = [p.update(v) for v in (0.1, 0.2, 0.2, 0.15, 0.3, 0.4, 0.1)]
    # 0.2 and 0.15 do not beat 0.2 -> reset at the second; then 0.3 is the new baseline
    assert fired == [False, False, False, True, False, False, False]
    assert p.resets == 1 and p.best == 0.4 and p.bad == 1




def test_moving_reference_moves_each_tied_weight_once(tiny_model_dir):
    """ref <- 0.1 * policy + 0.9 * ref: with policy = ref + 1 every weight moves by exactly 0.1,
    the tied embedding / lm-head too (a state-dict loop moved it twice: 0.19)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    assert model.config.tie_word_embeddings
    ref = PolicyLogprobs(model)
    policy = copy.deepcopy(ref)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    average_into(ref, policy, 0.1)
    for name, p in ref.named_parameters():
        assert torch.allclose(p - before[name], torch.full_like(p, 0.1), atol=1e-12), name
    assert ref.model.lm_head.weight is ref.model.model.embed_tokens.weight  # still tied


def test_reset_copies_the_policy_and_clears_the_optimiser(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    ref = PolicyLogprobs(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    policy = copy.deepcopy(ref)
    opt = torch.optim.AdamW(policy.parameters(), lr=0.1)
    policy(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]), None,
           torch.tensor([[-100, 2, 3]])).sum().backward()
    opt.step()
    assert opt.state
    reset(policy, ref, opt)
    assert not opt.state
    for (name, a), b in zip(ref.named_parameters(), policy.parameters(), strict=True):
        assert torch.equal(a, b), name
