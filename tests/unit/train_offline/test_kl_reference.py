"""The reference side: ProRL's plateau tracker, the moving reference, held-out splits."""

import copy

import pytest
import torch

from reasoner.device import DistInfo, Env
from reasoner.models.logprobs import PolicyLogprobs
from reasoner.train_offline.kl_reference import Plateau, average_into, reset
from reasoner.train_offline.rollouts import Batching, Rollouts


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


def test_reference_logprobs_are_memory_mapped_and_reused(tmp_path):
    """Scored once into JSONL parts and one Arrow file that is memory-mapped (not Python lists
    of every token); a rerun maps it without scoring; a rollout set with a new sample rescored."""
    from torch import nn

    from reasoner.train_offline.kl_reference import Reordered, starting_logprobs

    class Scorer(nn.Module):
        calls = 0

        def forward(self, input_ids, position_ids, attention_mask, labels):
            Scorer.calls += 1
            return -labels[labels >= 0].float() / 1000  # (N,) one value per scored token

    data = rollouts([("b", 0), ("a", 1), ("a", 0)], [[1, 2, 3, 4], [1, 2, 5], [7, 8, 9, 10, 11]],
                    [2, 2, 3])
    folder, batching, env = tmp_path / "ref_logprobs", BATCHING, ENV
    got = starting_logprobs(folder, "src", Scorer(), data, batching, env)
    assert isinstance(got, Reordered) and (folder / "logprobs.arrow").exists()
    expect = [[-0.003, -0.004], [-0.005], [-0.010, -0.011]]
    assert [list(got[i]) for i in range(3)] == [pytest.approx(e) for e in expect]
    calls = Scorer.calls
    again = starting_logprobs(folder, "src", Scorer(), data, batching, env)
    assert Scorer.calls == calls and [list(again[i]) for i in range(3)] == [list(got[i]) for i in range(3)]
    more = rollouts(data.keys + [("c", 0)], [*data.ids, [1, 6, 6]], [2, 2, 3, 1])
    third = starting_logprobs(folder, "src", Scorer(), more, batching, env)
    assert Scorer.calls > calls and list(third[3]) == pytest.approx([-0.006, -0.006])


def test_scoring_never_forwards_more_tokens_than_a_training_micro_batch(tmp_path):
    """Reference and behaviour log-probs are scored as training batches the rollouts: packed
    rows of seq_len, micro_batch rows per forward, so a scoring forward holds at most
    micro_batch x seq_len tokens (16 samples padded to the longest, at 51,200-token rows, made
    each MLP intermediate ~45 GB). Every sample is still scored, each once, in its own order."""
    from torch import nn

    from reasoner.train_offline.kl_reference import starting_logprobs, validation_margin

    seen = []

    class Scorer(nn.Module):
        def forward(self, input_ids, position_ids, attention_mask, labels):
            seen.append(input_ids.numel())
            return -labels[labels >= 0].float() / 1000  # (N,)

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 15, (40,), generator=g).tolist()
    data = rollouts([("p", i) for i in range(40)], [[i % 7 + 1] * n for i, n in
                                                     enumerate(lengths)], [2] * 40)
    got = starting_logprobs(tmp_path / "ref", "src", Scorer(), data, BATCHING, ENV)
    assert max(seen) <= BATCHING.micro_batch * BATCHING.seq_len == 32
    assert [len(got[i]) for i in range(40)] == [n - 2 for n in lengths]
    assert all(list(got[i]) == pytest.approx([-(i % 7 + 1) / 1000] * (n - 2))
               for i, n in enumerate(lengths))
    seen.clear()
    data.rewards[::2] = -1.0
    validation_margin(Scorer(), data, list(range(40)), BATCHING, ENV)
    assert max(seen) <= 32


BATCHING = Batching(global_batch=8, seed=0, packing=True, seq_len=16, micro_batch=2, pad=0)
ENV = Env(torch.device("cpu"), DistInfo(), torch.float32)


def rollouts(keys, ids, prompt_lens):
    m = len(keys)
    return Rollouts(keys=keys, ids=ids, prompt_lens=prompt_lens, rewards=torch.ones(m),
                    groups=torch.zeros(m, dtype=torch.long), group_acc=torch.ones(m),
                    reasoning=torch.ones(m), has_answer=torch.ones(m, dtype=torch.bool),
                    old_logp=None, dropped=0)
