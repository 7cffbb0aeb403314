"""Every loss against hand-computed values and against a naive per-sample Python loop."""

import math

import pytest
import torch

from reasoner.train_offline import losses as L


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



def test_gspo_hand_computed():
    """Sample 0 (A = +1): log-ratios ln 2 and 0, so s_0 = 2^(1/2) = 1.414, clipped to 1.28
    (no gradient); sample 1 (A = -1): s_1 = 1.1, inside the range. Each sample weighs 1/2, a
    token of sample i 1/(2|y_i|): d/dlogp of sample 1's token = 1/2 x -A x s_1 = 0.55."""
    logp = torch.tensor([math.log(2.0), 0.0, math.log(1.1)], requires_grad=True)
    old, idx, adv = torch.zeros(3), torch.tensor([0, 0, 1]), torch.tensor([1.0, -1.0])
    loss, m = L.gspo_loss(logp, old, adv, idx, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx((-1.28 + 1.1) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert torch.autograd.grad(loss, logp)[0].tolist() == pytest.approx([0.0, 0.0, 0.55])
    wide, _ = L.gspo_loss(logp, old, adv, idx, eps_low=0.2, eps_high=1.0)  # s_0 unclipped
    assert wide.item() == pytest.approx((-math.sqrt(2) + 1.1) / 2)
    # the sequence ratio's gradient, spread over its tokens: 1/2 x -A x s_0 x 1/2 each
    assert torch.autograd.grad(wide, logp)[0].tolist() == pytest.approx(
        [-math.sqrt(2) / 4, -math.sqrt(2) / 4, 0.55])
    share, _ = L.gspo_loss(logp[:2], old[:2], adv[:1], idx[:2], 0.2, 0.28, global_samples=2)
    assert share.item() == pytest.approx(-1.28 / 2)  # sample 0's share of a batch of two


def test_cispo_hand_computed():
    """rho = 2, 0.5, 8 under a cap 1 + eps_high = 5: weights 2, 0.5, 5 (stop-gradient) on
    -A log p, token-mean; every token keeps a gradient, -w A / 3."""
    logp = torch.log(torch.tensor([2.0, 0.5, 8.0])).requires_grad_()
    old, idx, adv = torch.zeros(3), torch.tensor([0, 0, 1]), torch.tensor([1.0, -1.0])
    loss, m = L.cispo_loss(logp, old, adv, idx, eps_high=4.0)
    assert loss.item() == pytest.approx(
        (-2 * math.log(2) - 0.5 * math.log(0.5) + 5 * math.log(8)) / 3)
    assert m["clip_frac"] == pytest.approx(1 / 3)
    assert torch.autograd.grad(loss, logp)[0].tolist() == pytest.approx([-2 / 3, -0.5 / 3, 5 / 3])
    floor, m = L.cispo_loss(logp, old, adv, idx, eps_low=0.2, eps_high=4.0)  # 0.5 -> 0.8
    assert torch.autograd.grad(floor, logp)[0].tolist() == pytest.approx([-2 / 3, -0.8 / 3, 5 / 3])
    assert m["clip_frac"] == pytest.approx(2 / 3)


def test_oapl_value_is_the_soft_maximum_of_the_group():
    """V = b ln mean exp(r / b) per group: 3 of 4 right at b = 0.5 gives 0.5 ln((3e^2 +
    e^-2) / 4); a lone wrong sample, -1; b -> 0 the max, b -> inf the mean."""
    r, g = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0]), torch.tensor([0, 0, 0, 0, 1])
    v = L.oapl_value(r, g, 0.5)
    top = 0.5 * math.log((3 * math.exp(2) + math.exp(-2)) / 4)
    assert v.tolist() == pytest.approx([top] * 4 + [-1.0])
    assert L.oapl_value(r, g, 1e-3).tolist() == pytest.approx([1.0] * 4 + [-1.0], abs=1e-3)
    assert L.oapl_value(r.double(), g, 1e4).tolist() == pytest.approx([0.5] * 4 + [-1.0], abs=1e-4)


def test_oapl_hand_computed():
    """Sample 0's log-ratios sum to 2, sample 1's to -1; beta 0.1, A = (0.3, -0.4): residuals
    0.2 - 0.3 = -0.1 and -0.1 + 0.4 = 0.3; L = (0.01 + 0.09) / 2; dL/dlogp = beta res (2/B)."""
    logp = torch.tensor([0.5, 1.5, -1.0], requires_grad=True)
    old, idx, adv = torch.zeros(3), torch.tensor([0, 0, 1]), torch.tensor([0.3, -0.4])
    loss, m = L.oapl_loss(logp, old, adv, idx, beta=0.1)
    assert loss.item() == pytest.approx(0.05)
    assert m["residual_abs"] == pytest.approx(0.2)
    assert torch.autograd.grad(loss, logp)[0].tolist() == pytest.approx([-0.01, -0.01, 0.03])
    masked, _ = L.oapl_loss(logp, old, adv, idx, beta=0.1, weights=torch.tensor([0.0, 0.0, 1.0]))
    assert masked.item() == pytest.approx(0.09 / 2)  # sample 0 dropped whole, still counted


# rho = 3, 0.25 (sample 0) and 1.5 (sample 1): the case every correction below is computed on
RHO_LOGP = torch.log(torch.tensor([3.0, 0.25, 1.5]))
RHO_IDX = torch.tensor([0, 0, 1])


def test_corrections_hand_computed():
    logp, old = RHO_LOGP, torch.zeros(3)
    anchor, w, m = L.correct(logp, old, RHO_IDX, 2, "none")
    assert anchor is old and w is None and m == {}
    anchor, w, m = L.correct(logp, old, RHO_IDX, 2, "token-tis", cap=2.0)
    assert torch.equal(anchor, logp) and w.tolist() == pytest.approx([2.0, 0.25, 1.5])
    assert m["corr_capped_frac"] == pytest.approx(1 / 3) and m["corr_weight_mean"] == 1.25
    anchor, w, m = L.correct(logp, old, RHO_IDX, 2, "seq-tis", cap=2.0)  # 3 x 0.25, and 1.5
    assert torch.equal(anchor, logp) and w.tolist() == pytest.approx([0.75, 0.75, 1.5])
    _, w, m = L.correct(logp, old, RHO_IDX, 2, "seq-tis", cap=1.0)
    assert w.tolist() == pytest.approx([0.75, 0.75, 1.0]) and m["corr_capped_frac"] == 0.5
    anchor, w, m = L.correct(logp, old, RHO_IDX, 2, "icepop", low=0.5, high=2.0)
    assert anchor is old and w.tolist() == [0.0, 0.0, 1.0]
    assert m["corr_masked_frac"] == pytest.approx(2 / 3)
    # geometric means: sqrt(3 x 0.25) = 0.866 and 1.5: both inside [0.5, 2], sample 0 not in [0.9, 2]
    assert L.correct(logp, old, RHO_IDX, 2, "geo-mask", low=0.5, high=2.0)[1].tolist() == [1.0] * 3
    anchor, w, m = L.correct(logp, old, RHO_IDX, 2, "geo-mask", low=0.9, high=2.0)
    assert anchor is old and w.tolist() == [0.0, 0.0, 1.0] and m["corr_masked_frac"] == 0.5
    # m2-mask: (log rho)^2 = 1.2069, 1.9218, 0.1644; the means of what is left when the largest
    # are dropped one by one: 1.0977 (none dropped), 0.6857 (token 1), 0.1644 (tokens 1 and 0)
    anchor, w, m = L.correct(logp, old, RHO_IDX, 2, "m2-mask", tau=0.7)
    assert anchor is old and w.tolist() == [1.0, 0.0, 1.0]
    assert m["corr_masked_frac"] == pytest.approx(1 / 3)
    assert L.correct(logp, old, RHO_IDX, 2, "m2-mask", tau=1.1)[1].tolist() == [1.0] * 3
    assert L.correct(logp, old, RHO_IDX, 2, "m2-mask", tau=0.2)[1].tolist() == [0.0, 0.0, 1.0]
    # no mean is below 0.04 here: all but the smallest are dropped, never every token
    assert L.correct(logp, old, RHO_IDX, 2, "m2-mask", tau=0.04)[1].tolist() == [0.0, 0.0, 1.0]


def test_the_second_moment_mask_drops_the_largest_first_and_stops_at_tau():
    """Ties keep their order; a batch already under tau keeps everything; no tokens, no mask."""
    m2 = torch.tensor([0.01, 0.5, 0.01, 0.5, 0.02])  # mean 0.208
    assert L.second_moment_keep(m2, 0.25).tolist() == [True] * 5
    # dropping one 0.5 leaves mean 0.135; both, 0.0133
    assert L.second_moment_keep(m2, 0.1).tolist() == [True, False, True, False, True]
    assert L.second_moment_keep(m2, 0.2).tolist() == [True, False, True, True, True]
    assert L.second_moment_keep(torch.zeros(0), 0.04).tolist() == []
    assert L.second_moment_keep(torch.tensor([9.0]), 0.04).tolist() == [True]


def test_an_is_correction_replaces_the_ratio_and_a_mask_drops_terms():
    """token-tis on dapo: the ratio is taken to the step's own policy (1, its clip inactive), so
    each token costs -w_t A with gradient -w_t A / N: (-2, -0.25, +1.5) / 3 for A = (1, -1).
    icepop [0.5, 2] keeps token 2 only, with dapo's own ratio 1.5 to the behaviour policy
    (A = -1: 1.5, below the dual clip's 3), still divided by all 3 tokens."""
    logp, old, adv = RHO_LOGP.clone().requires_grad_(), torch.zeros(3), torch.tensor([1.0, -1.0])
    anchor, w, _ = L.correct(logp, old, RHO_IDX, 2, "token-tis", cap=2.0)
    loss, m = L.clipped_pg_loss(logp, anchor, adv, RHO_IDX, weights=w)
    assert loss.item() == pytest.approx((-2.0 - 0.25 + 1.5) / 3) and m["clip_frac"] == 0.0
    assert torch.autograd.grad(loss, logp)[0].tolist() == pytest.approx([-2 / 3, -0.25 / 3, 0.5])
    for name, fn in (("gspo", L.gspo_loss), ("cispo", L.cispo_loss)):  # the same gradient
        anchor, w, _ = L.correct(logp, old, torch.tensor([0, 1, 2]), 3, "token-tis", cap=2.0)
        three = torch.tensor([1.0, 1.0, -1.0])
        got = torch.autograd.grad(fn(logp, anchor, three, torch.tensor([0, 1, 2]), weights=w)[0],
                                  logp)[0]
        assert got.tolist() == pytest.approx([-2 / 3, -0.25 / 3, 0.5]), name
    anchor, w, _ = L.correct(logp, old, RHO_IDX, 2, "icepop", low=0.5, high=2.0)
    loss, _ = L.clipped_pg_loss(logp, anchor, adv, RHO_IDX, weights=w)
    assert loss.item() == pytest.approx(1.5 / 3)
    assert torch.autograd.grad(loss, logp)[0].tolist() == pytest.approx([0.0, 0.0, 0.5])
    # m2-mask at tau 0.7 drops token 1 only: token 0 keeps dapo's ratio 3, clipped at 1.28
    # (A = 1: no gradient), token 2 as under icepop
    anchor, w, _ = L.correct(logp, old, RHO_IDX, 2, "m2-mask", tau=0.7)
    loss, _ = L.clipped_pg_loss(logp, anchor, adv, RHO_IDX, weights=w)
    assert loss.item() == pytest.approx((-1.28 + 1.5) / 3)
    assert torch.autograd.grad(loss, logp)[0].tolist() == pytest.approx([0.0, 0.0, 0.5])

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
    if kind == "gspo":
        terms = []
        for i in range(B):
            s = torch.exp(sum(logp[t] - b["old"][t] for t in toks[i]) / len(toks[i]))
            a = b["adv"][i]
            terms.append(max(-s * a, -torch.clamp(s, 0.8, 1.28) * a))
        return sum(terms) / B
    if kind == "cispo":
        out = [-torch.clamp(torch.exp(logp[t] - b["old"][t]).detach(), max=5.0) * b["adv"][i] * logp[t]
               for t, i in enumerate(idx)]
        return sum(out) / len(out)
    if kind == "oapl":
        return sum((0.1 * sum(logp[t] - b["old"][t] for t in toks[i]) - b["adv"][i]) ** 2
                   for i in range(B)) / B
    raise ValueError(kind)


def vectorised(kind: str, b: dict) -> torch.Tensor:
    if kind == "pcl":
        return L.pcl_loss(b["logp"], b["idx"], b["r"])[0]
    if kind == "rft":
        return L.rft_loss(b["logp"], b["idx"], b["r"])[0]
    if kind == "clip":
        return L.clipped_pg_loss(b["logp"], b["old"], b["adv"], b["idx"])[0]
    if kind == "gspo":
        return L.gspo_loss(b["logp"], b["old"], b["adv"], b["idx"], 0.2, 0.28)[0]
    if kind == "cispo":
        return L.cispo_loss(b["logp"], b["old"], b["adv"], b["idx"])[0]
    if kind == "oapl":
        return L.oapl_loss(b["logp"], b["old"], b["adv"], b["idx"], beta=0.1)[0]
    return L.oreal_loss(b["logp"], b["ref"], b["idx"], b["r"], b["acc"], b["w"])[0]


@pytest.mark.parametrize("kind", ["pcl", "rft", "clip", "oreal", "gspo", "cispo", "oapl"])
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
    for name, fn in (("gspo", lambda *a, **k: L.gspo_loss(*a, 0.2, 0.28, k["global_samples"])),
                     ("cispo", lambda *a, **k: L.cispo_loss(*a, global_tokens=k["global_tokens"])),
                     ("oapl", lambda *a, **k: L.oapl_loss(*a, 0.1, k["global_samples"]))):
        whole = fn(logp, old, r, idx, global_tokens=None, global_samples=None)[0].item()
        got = sum(float(fn(logp[t], old[t], r[s], torch.tensor(i), global_tokens=5,
                           global_samples=3)[0]) for t, s, i in parts)
        assert got == pytest.approx(whole), name
    assert L.agg_loss(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]), 2, "token-mean",
                      global_tokens=6).item() == pytest.approx(9 / 6)
    assert L.agg_loss(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]), 2,
                      "seq-mean-token-mean", global_samples=4).item() == pytest.approx((2 + 5) / 4)
