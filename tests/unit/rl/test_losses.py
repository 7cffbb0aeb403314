"""Every loss against hand-computed values and against a naive per-sample Python loop."""

import math

import pytest
import torch

from reasoner.rl import losses as L


def test_segment_mean_and_sum():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    idx = torch.tensor([0, 0, 1, 1])
    assert L.segment_mean(x, idx, 3).tolist() == [1.5, 3.5, 0.0]
    assert L.segment_sum(x, idx, 2).tolist() == [3.0, 7.0]


def test_pcl_hand_computed():
    logp = torch.log(torch.tensor([0.5, 0.5, 0.25]))
    loss, m = L.pcl_loss(logp, torch.tensor([0, 0, 1]), torch.tensor([1.0, -1.0]))
    assert loss.item() == pytest.approx((-0.5 + 0.25) / 2)
    assert m["geo_prob_pos"] == pytest.approx(0.5) and m["geo_prob_neg"] == pytest.approx(0.25)


def test_rft_hand_computed():
    loss, m = L.rft_loss(torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([0, 0, 1]),
                         torch.tensor([1.0, -1.0]))
    assert loss.item() == pytest.approx(1.5) and m["pos_tokens"] == 2
    none, _ = L.rft_loss(torch.tensor([-1.0]), torch.tensor([0]), torch.tensor([-1.0]))
    assert none.item() == 0.0


def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0])
    g = torch.tensor([0, 0, 1, 2, 2, 2])
    grpo = L.group_advantages(r, g, "grpo")
    s = math.sqrt(2.0)  # unbiased std of (1, -1)
    assert grpo[:2].tolist() == pytest.approx([1 / (s + 1e-6), -1 / (s + 1e-6)])
    assert grpo[2].item() == 0.0  # a group of one
    mean2, std2 = 1 / 3, math.sqrt(((2 / 3) ** 2 * 2 + (4 / 3) ** 2) / 2)
    assert grpo[3:].tolist() == pytest.approx([(1 - mean2) / (std2 + 1e-6), (-1 - mean2) / (std2 + 1e-6),
                                               (1 - mean2) / (std2 + 1e-6)])
    assert L.group_advantages(r, g, "rloo").tolist() == pytest.approx([2, -2, 0, 1, -2, 1])
    assert L.group_advantages(r, g, "none").tolist() == pytest.approx([1, -1, 0, 2 / 3, -4 / 3, 2 / 3])


def test_clipped_pg_hand_computed():
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0])
    idx = torch.tensor([0, 1, 1])
    loss, m = L.clipped_pg_loss(logp, old, adv, idx, 0.2, 0.28, "token-mean")
    # token 0: max(-1.5, -1.28) = -1.28; token 1: max(0.5, 0.8) = 0.8; token 2: max(1, 1) = 1
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 1.0) / 3)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    seq, _ = L.clipped_pg_loss(logp, old, adv, idx, 0.2, 0.28, "seq-mean-token-mean")
    assert seq.item() == pytest.approx((-1.28 + (0.8 + 1.0) / 2) / 2)


def test_the_dual_clip_bounds_a_negative_advantage_and_keeps_the_gradient_finite():
    """rho = 5 with A = -1 costs 5 without the dual clip, clip_ratio_c x |A| = 3 with it (and
    no gradient); a positive advantage is untouched (-1.28, clipped above); a log-prob gap of
    90 (rho = inf in float) costs 3 too, with a finite, zero gradient (inf without the
    bound)."""
    logp = torch.tensor([math.log(5.0), math.log(5.0), 90.0], requires_grad=True)
    old = torch.zeros(3)
    adv = torch.tensor([-1.0, 1.0, -2.0])
    idx = torch.tensor([0, 1, 2])
    loss, m = L.clipped_pg_loss(logp, old, adv, idx, 0.2, 0.28, "token-mean",
                                clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((3.0 - 1.28 + 6.0) / 3)
    assert m["dual_clip_frac"] == pytest.approx(2 / 3)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad.tolist() == [0.0, 0.0, 0.0]  # every token clipped: no gradient, and no NaN
    unbounded, _ = L.clipped_pg_loss(logp[:2], old[:2], adv[:2], idx[:2], clip_ratio_c=None)
    assert unbounded.item() == pytest.approx((5.0 - 1.28) / 2)
    # below the bound the dual clip changes nothing: rho = 2, A = -1 costs 2
    two, _ = L.clipped_pg_loss(torch.tensor([math.log(2.0)]), torch.zeros(1), torch.tensor([-1.0]),
                               torch.tensor([0]))
    assert two.item() == pytest.approx(2.0)


def test_token_rm_loss_hand_computed():
    """BCE of sigmoid(mean token score) against R > 0, a sample's mean over its tokens: sample
    0 (R = +1) has mean score 1, sample 1 (R = -1) mean 0."""
    scores = torch.tensor([0.5, 1.5, 2.0, -2.0])
    idx = torch.tensor([0, 0, 1, 1])
    loss, m = L.token_rm_loss(scores, idx, torch.tensor([1.0, -1.0]))
    pos, neg = -math.log(1 / (1 + math.exp(-1.0))), -math.log(1 - 0.5)
    assert loss.item() == pytest.approx((pos + neg) / 2) and m["rm_bce"] == pytest.approx(
        (pos + neg) / 2)
    share, _ = L.token_rm_loss(scores[:2], idx[:2], torch.tensor([1.0]), global_samples=4)
    assert share.item() == pytest.approx(pos / 4)


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([0.0]), torch.log(torch.tensor([0.5]))
    d = math.log(2)
    assert L.kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert L.kl_penalty(logp, ref, "k2").item() == pytest.approx(d * d / 2)
    assert L.kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + d - 1)
    assert L.kl_penalty(ref, ref, "k3").item() == 0.0


def test_soft_overlong_and_discounted():
    pen = L.soft_overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), max_len=10, cache_len=4)
    assert pen.tolist() == pytest.approx([0, 0, -0.5, -1, -1])
    r = L.discounted_reward(torch.tensor([True, False]), torch.tensor([1, 2]), 0.5, 0.1)
    assert r.tolist() == pytest.approx([0.6, 0.1])


def test_oreal_hand_computed():
    logp = torch.log(torch.tensor([0.5, 0.25, 0.5]))
    ref = logp.clone()
    loss, m = L.oreal_loss(logp, ref, torch.tensor([0, 0, 1]), torch.tensor([1.0, -1.0]),
                           torch.tensor([0.25, 0.25]), torch.ones(3), eta=0.5, beta=0.01)
    bc = -(math.log(0.5) + math.log(0.25)) / 2
    pg = 0.5 * (0.25 / 0.75) * math.log(0.5)
    assert loss.item() == pytest.approx((bc + pg) / 2) and m["kl"] == 0.0


def random_batch(seed: int, B: int = 5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (B,), generator=g)
    idx = torch.repeat_interleave(torch.arange(B), lengths)
    N = idx.numel()
    logp = (-torch.rand(N, generator=g, dtype=torch.float64) * 3).requires_grad_()
    return {
        "logp": logp, "idx": idx, "B": B,
        "old": -torch.rand(N, generator=g, dtype=torch.float64) * 3,
        "ref": -torch.rand(N, generator=g, dtype=torch.float64) * 3,
        "r": torch.where(torch.rand(B, generator=g) > 0.5, 1.0, -1.0).double(),
        "adv": torch.randn(B, generator=g, dtype=torch.float64),
        "acc": torch.rand(B, generator=g, dtype=torch.float64) * 0.9,
        "w": torch.rand(N, generator=g, dtype=torch.float64),
    }


def naive(kind: str, b: dict) -> torch.Tensor:
    """The same objectives written sample by sample, token by token."""
    logp, idx, B = b["logp"], b["idx"].tolist(), b["B"]
    toks = {i: [t for t, s in enumerate(idx) if s == i] for i in range(B)}
    if kind == "pcl":
        terms = [-b["r"][i] * torch.exp(sum(logp[t] for t in toks[i]) / len(toks[i])) for i in range(B)]
        return sum(terms) / B
    if kind == "rft":
        pos = [t for i in range(B) if b["r"][i] > 0 for t in toks[i]]
        return -sum(logp[t] for t in pos) / max(len(pos), 1)
    if kind == "clip":
        out = []
        for t, i in enumerate(idx):
            ratio = torch.exp(logp[t] - b["old"][t])
            a = b["adv"][i]
            term = max(-ratio * a, -torch.clamp(ratio, 0.8, 1.28) * a)
            out.append(min(term, -3.0 * a) if a < 0 else term)  # the dual clip, c = 3
        return sum(out) / len(out)
    if kind == "oreal":
        total = 0
        for i in range(B):
            m = sum(b["w"][t] * logp[t] for t in toks[i]) / len(toks[i])
            kl = sum(torch.exp(b["ref"][t] - logp[t]) - (b["ref"][t] - logp[t]) - 1 for t in toks[i]) / len(toks[i])
            p = b["acc"][i]
            term = -m if b["r"][i] > 0 else 0.5 * p / (1 - p) * m
            total = total + term + 0.01 * kl
        return total / B
    raise ValueError(kind)


def vectorised(kind: str, b: dict) -> torch.Tensor:
    if kind == "pcl":
        return L.pcl_loss(b["logp"], b["idx"], b["r"])[0]
    if kind == "rft":
        return L.rft_loss(b["logp"], b["idx"], b["r"])[0]
    if kind == "clip":
        return L.clipped_pg_loss(b["logp"], b["old"], b["adv"], b["idx"])[0]
    return L.oreal_loss(b["logp"], b["ref"], b["idx"], b["r"], b["acc"], b["w"])[0]


@pytest.mark.parametrize("kind", ["pcl", "rft", "clip", "oreal"])
@pytest.mark.parametrize("seed", range(5))
def test_losses_match_naive_loop_values_and_gradients(kind, seed):
    b = random_batch(seed)
    ours = vectorised(kind, b)
    (g_ours,) = torch.autograd.grad(ours, b["logp"])
    ref = naive(kind, b)
    (g_ref,) = torch.autograd.grad(ref, b["logp"])
    assert ours.item() == pytest.approx(float(ref), abs=1e-10)
    assert torch.allclose(g_ours, g_ref, atol=1e-10)


def test_shares_of_a_split_batch_add_up_to_the_whole_batch_loss():
    """Given the global normaliser, each part's loss is its share: the parts sum to the whole."""
    logp = torch.log(torch.tensor([0.5, 0.25, 0.8, 0.4, 0.1]))
    idx = torch.tensor([0, 0, 1, 2, 2])
    r = torch.tensor([1.0, -1.0, 1.0])
    old = torch.log(torch.tensor([0.4, 0.3, 0.8, 0.5, 0.2]))
    parts = [(slice(0, 3), slice(0, 2), [0, 0, 1]), (slice(3, 5), slice(2, 3), [0, 0])]

    def split(fn):
        return sum(float(fn(logp[t], torch.tensor(i), r[s])) for t, s, i in parts)

    whole = L.pcl_loss(logp, idx, r)[0].item()
    assert split(lambda lp, i, rr: L.pcl_loss(lp, i, rr, global_samples=3)[0]) == pytest.approx(whole)
    whole = L.rft_loss(logp, idx, r)[0].item()  # positive samples 0 and 2: 4 tokens
    assert split(lambda lp, i, rr: L.rft_loss(lp, i, rr, global_pos_tokens=4)[0]) == pytest.approx(whole)
    for agg in ("token-mean", "seq-mean-token-mean"):
        whole = L.clipped_pg_loss(logp, old, r, idx, agg=agg)[0].item()
        got = sum(float(L.clipped_pg_loss(logp[t], old[t], r[s], torch.tensor(i), agg=agg,
                                          global_tokens=5, global_samples=3)[0])
                  for t, s, i in parts)
        assert got == pytest.approx(whole), agg
    assert L.agg_loss(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]), 2, "token-mean",
                      global_tokens=6).item() == pytest.approx(9 / 6)
    assert L.agg_loss(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]), 2,
                      "seq-mean-token-mean", global_samples=4).item() == pytest.approx((2 + 5) / 4)
