import pytest
import torch

from reasoner.config import SamplingConfig
from reasoner.infer.base import processed_logprobs
from reasoner.infer.sampling import (
    WHOLE_ROW_VOCAB,
    candidates,
    sample_full,
    sample_rows,
    uniform_stream,
)


def logits_of(kind: str, g: torch.Generator, rows: int = 16, vocab: int = 3000) -> torch.Tensor:
    """(rows, vocab) logits: peaked like a trained model, flat, or rounded to bf16 (many ties)."""
    x = torch.randn(rows, vocab, generator=g)
    if kind == "peaked":
        x = x * 4 + torch.randn(rows, 1, generator=g)
    if kind == "ties":
        x = (x * 3).to(torch.bfloat16).float()
    if kind == "coarse":  # so coarse that top-k's k-th value is shared by several tokens
        x = (x * 2).round()
    return x


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "coarse"])
@pytest.mark.parametrize("top_k,top_p,temperature", [(40, 0.95, 0.6), (40, 1.0, 1.0),
                                                     (5, 0.5, 1.3), (200, 0.9, 0.7),
                                                     (1, 0.95, 0.6)])
def test_candidates_pick_the_token_and_logprob_of_the_whole_vocabulary_cdf(kind, top_k, top_p,
                                                                           temperature):
    """The same uniform picks the same token with the same float32 log-prob, bit for bit, over
    200 seeds per case (3,200 rows), ties at the k-th value and at the top-p cut included."""
    sampling = SamplingConfig(n=1, temperature=temperature, top_k=top_k, top_p=top_p)
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        x = logits_of(kind, g)
        u = torch.rand(len(x), generator=g, dtype=torch.float64)
        fast, full = sample_rows(x, u, sampling), sample_full(x, u, sampling)
        assert torch.equal(fast[0], full[0]), (seed, fast[0], full[0])
        assert torch.equal(fast[1], full[1])


def test_uniforms_at_the_cdf_steps_pick_the_same_token():
    """Uniforms placed exactly on and just around each CDF step of every row, where a
    summation-order difference would show."""
    g = torch.Generator().manual_seed(7)
    x = logits_of("peaked", g, rows=4)
    sampling = SamplingConfig(n=1, temperature=0.6, top_k=40, top_p=0.95)
    logp = processed_logprobs(x, torch.zeros(4, dtype=torch.long), sampling)  # warm the path
    assert logp.shape == (4,)
    _, ids, keep = candidates(x, sampling)
    for row in range(4):
        full = sample_full(x[row:row + 1], torch.zeros(1, dtype=torch.float64), sampling)
        assert full[0].item() in ids[row][keep[row]].tolist()
        probs = torch.log_softmax(x[row] / 0.6, -1).double().exp()
        for cut in probs[ids[row][keep[row]]].cumsum(0).tolist():
            for u in (cut, torch.nextafter(torch.tensor(cut), torch.tensor(0.0)).item(),
                      torch.nextafter(torch.tensor(cut), torch.tensor(2.0)).item()):
                u = torch.tensor([min(u, 0.999999)], dtype=torch.float64)
                a, b = sample_rows(x[row:row + 1], u, sampling), sample_full(x[row:row + 1], u,
                                                                            sampling)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_greedy_takes_the_first_maximum_with_log_prob_zero():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 5.0]])
    chosen, logp = sample_rows(x, torch.tensor([0.9, 0.1], dtype=torch.float64),
                               SamplingConfig(n=1, temperature=0.0))
    assert chosen.tolist() == [1, 0] and logp.tolist() == [0.0, 0.0]
    assert torch.equal(chosen, sample_full(x, torch.tensor([0.9, 0.1], dtype=torch.float64),
                                           SamplingConfig(n=1, temperature=0.0))[0])


def test_top_k_off_samples_over_the_whole_vocabulary():
    g = torch.Generator().manual_seed(3)
    x = logits_of("flat", g, rows=8, vocab=50)
    u = torch.rand(8, generator=g, dtype=torch.float64)
    sampling = SamplingConfig(n=1, temperature=1.0, top_k=0, top_p=0.9)
    assert torch.equal(sample_rows(x, u, sampling)[0], sample_full(x, u, sampling)[0])


def test_a_request_s_uniforms_come_from_its_seed_alone():
    a = uniform_stream(5, 10)
    assert torch.equal(a, torch.rand(10, generator=torch.Generator().manual_seed(5),
                                     dtype=torch.float64))
    assert torch.equal(uniform_stream(5, 4), a[:4]) and not torch.equal(uniform_stream(6, 4), a[:4])


def test_a_tie_cut_by_top_p_keeps_the_lower_token_id():
    """Equal logits at the top-p cut: the lower token id counts as more likely, in the whole-
    vocabulary transform and in the candidate sampler alike (p = 0.576, 0.212, 0.212: the
    second 1.0 starts at mass 0.788 >= 0.7 and goes)."""
    from reasoner.infer.base import transform_logits

    x = torch.tensor([[1.0, 2.0, 1.0, 0.0]])
    inf = float("-inf")
    assert transform_logits(x, 1.0, 0, 0.7).tolist() == [[1.0, 2.0, inf, inf]]
    assert transform_logits(x, 1.0, 3, 0.7).tolist() == [[1.0, 2.0, inf, inf]]
    _, ids, keep = candidates(x, SamplingConfig(n=1, temperature=1.0, top_k=3, top_p=0.7))
    assert ids.tolist() == [[0, 1, 2]] and keep.tolist() == [[True, True, False]]


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
def test_a_large_vocabulary_softmaxes_the_candidates_alone_to_the_same_tokens(kind):
    """Above WHOLE_ROW_VOCAB the candidates' softmax runs over them alone: the same tokens as
    the whole-vocabulary CDF for every uniform drawn here (800 rows of 49,152), log-probs equal
    to float32 rounding."""
    sampling = SamplingConfig(n=1, temperature=0.6, top_k=40, top_p=0.95)
    vocab = 49152
    assert vocab > WHOLE_ROW_VOCAB
    for seed in range(50):
        g = torch.Generator().manual_seed(seed)
        x = logits_of(kind, g, vocab=vocab)
        u = torch.rand(len(x), generator=g, dtype=torch.float64)
        fast, full = sample_rows(x, u, sampling), sample_full(x, u, sampling)
        assert torch.equal(fast[0], full[0]), (seed, fast[0], full[0])
        assert torch.allclose(fast[1], full[1], rtol=0, atol=2e-6), (fast[1] - full[1]).abs().max()
