"""OREAL's token reward model: running means, token weights, and that it finds the deciding token."""

import pytest
import torch

from reasoner.rl import losses
from reasoner.rl.token_rm import TokenRewardModel, running_mean, token_weights


def test_running_mean_and_token_weights():
    x = torch.tensor([1.0, 3.0, 2.0, -2.0, 4.0])
    idx = torch.tensor([0, 0, 1, 1, 1])
    assert running_mean(x, idx).tolist() == pytest.approx([1.0, 2.0, 2.0, 0.0, 4 / 3])
    w = token_weights(torch.tensor([10.0, -10.0]), torch.tensor([0, 1]), torch.tensor([1.0, -1.0]))
    assert w.tolist() == pytest.approx([2 * torch.sigmoid(torch.tensor(10.0)).item() - 1,
                                        1 - 2 * torch.sigmoid(torch.tensor(-10.0)).item()])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_reward_model_learns_the_deciding_tokens(tiny_model_dir, seed):
    """Responses are noise except one token: 'bad' at a random place iff the answer is wrong.

    After training, negatives' weights (w-) sit on and after that token, not before it. The
    claim is checked against its own noise: over the held-out negatives, the mean gap (after
    minus before) must exceed three standard errors, not a threshold one machine clears.
    """
    from transformers import AutoModelForCausalLM

    from reasoner.data.packing import collate_padded

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rm = TokenRewardModel(model)
    opt = torch.optim.AdamW(rm.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    BAD = 7

    def batch(n: int = 16):
        samples, rewards, where = [], [], []
        for k in range(n):
            resp = (torch.randint(20, 200, (12,), generator=g)).tolist()
            wrong = k % 2 == 1
            pos = int(torch.randint(3, 9, (1,), generator=g))
            if wrong:
                resp[pos] = BAD
            samples.append(([1, 2, 3] + resp, [False] * 3 + [True] * 12))
            rewards.append(-1.0 if wrong else 1.0)
            where.append(pos)
        return collate_padded(samples, 0), torch.tensor(rewards), where

    for _ in range(150):  # 60 steps left some seeds unconverged (BCE 0.6); 150 converge all
        b, rewards, _ = batch()
        scores = rm(b)
        idx = b.sample_index[b.labels >= 0]
        seq = losses.segment_mean(scores, idx, len(rewards))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(seq, (rewards > 0).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    b, rewards, where = batch(32)
    with torch.no_grad():
        scores = rm(b)
    idx = b.sample_index[b.labels >= 0]
    w = token_weights(scores, idx, rewards)
    gaps = []
    for s in range(32):
        if rewards[s] > 0:
            continue
        ws = w[idx == s]  # weight of the token predicted at each position: position t holds token t+1
        bad_at = where[s] + 3 - 1 - 2  # response offset -> label position within the response
        gaps.append(float(ws[bad_at + 1:].mean() - ws[:bad_at].mean()))
    gaps = torch.tensor(gaps)
    stderr = gaps.std() / len(gaps) ** 0.5
    assert gaps.mean() > 3 * stderr, (gaps.mean(), stderr)




def test_the_token_rm_learning_rate_decays_as_oreals_32b_config_says():
    """OREAL-32B: the RM's lr goes from 2e-6 to 4e-7 (cosine) over its 10 frozen-policy steps
    and the policy's 80; each step is taken at its step's rate (set from the step number, so a
    resumed run continues on the same curve). Without rm_min_lr the rate stays rm_lr."""
    import math

    from reasoner.device import Env
    from reasoner.rl.token_rm import TokenRM

    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=1.0)
    rm = TokenRM(None, opt, Env(torch.device("cpu"), None, torch.float32), 2e-6, 4e-7, 10 + 80)
    assert rm.lr_at(0) == 2e-6 and rm.lr_at(89) == pytest.approx(4e-7, rel=1e-12)
    assert rm.lr_at(44.5) == pytest.approx(4e-7 + 1.6e-6 * 0.5 * (1 + math.cos(math.pi / 2)))
    w.grad = torch.ones(1)
    rm.step(89)
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-7) and w.item() == pytest.approx(-4e-7)
    flat = TokenRM(None, opt, None, 2e-6, None, 90)
    assert {flat.lr_at(k) for k in (0, 45, 89)} == {2e-6}
