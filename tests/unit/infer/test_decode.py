import pytest
import torch

from reasoner.config import ModelConfig, SamplingConfig
from reasoner.infer.base import Request
from reasoner.infer.decode import InOrder, left_padded

SAMPLING = SamplingConfig(n=1, max_tokens=8, temperature=1.0, top_k=40, top_p=0.95)


@pytest.fixture(scope="module")
def generator(tiny_model_dir):
    from reasoner.infer.hf import HFGenerator

    return HFGenerator(ModelConfig(name_or_path=str(tiny_model_dir)), batch_size=4)


def requests_of(gen, count: int, lengths=(3, 8, 5, 2, 7, 4)) -> list[Request]:
    """`count` requests with varied prompts and max_tokens, so rows stop at different steps."""
    texts = ["Ana has 3 apples.", "What is 12 + 7?", "Tom", "A box holds 9 pens and 4 more."]
    out = []
    for k in range(count):
        ids = gen.tokenizer(texts[k % len(texts)], add_special_tokens=False)["input_ids"]
        out.append(Request(f"p{k % len(texts)}", k, ids, 1000 + k, lengths[k % len(lengths)]))
    return out


def test_one_request_gives_the_same_tokens_alone_and_in_a_full_batch(generator):
    """The hard rule: a sample does not depend on which requests share its batch. Request 9
    alone, and as one of 14 decoded 4 rows at a time (rows refilled as others stop), gives the
    same tokens, and log-probs within float32 rounding of the batch shapes (fp32, short
    outputs)."""
    requests = requests_of(generator, 14)
    crowd = generator.generate(requests, SAMPLING)
    alone = generator.generate([requests[9]], SAMPLING)[0]
    assert crowd[9].token_ids == alone.token_ids and len(alone.token_ids) == 2
    assert crowd[9].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    # and every request: the continuous batch of 4 gives what one static batch of 14 gives
    generator.preferred_batch = 64
    try:
        static = generator.generate(requests, SAMPLING)
    finally:
        generator.preferred_batch = 4
    assert [c.token_ids for c in crowd] == [c.token_ids for c in static]
    assert [len(c.token_ids) for c in crowd] == [r.max_tokens for r in requests]


def test_the_batch_stays_full_and_refills_in_groups(generator, monkeypatch):
    """Rows that stop are refilled from the waiting requests: every decode step runs 4 rows
    until nothing waits, prompts are prefilled in groups, and a shared prompt once per group."""
    calls = []
    real = generator._forward

    def spy(ids, mask, positions, cache):
        calls.append(tuple(ids.shape))
        return real(ids, mask, positions, cache)

    monkeypatch.setattr(generator, "_forward", spy)
    requests = requests_of(generator, 14)
    list(generator.stream(requests, SAMPLING))
    prefills = [c for c in calls if c[1] > 1]
    steps = [c[0] for c in calls if c[1] == 1]
    # 14 requests with max_tokens (3, 8, 5, 2, 7, 4, ...): 4 rows on every step until the tail
    first_short = steps.index(next(s for s in steps if s < 4))
    assert first_short > 10 and all(s == 4 for s in steps[:first_short])
    assert sum(p[0] for p in prefills) <= 14 and prefills[0][0] == 4
    # 8 requests of one prompt: one prompt row in the prefill, copied to 4 rows
    calls.clear()
    one = [Request("p", k, requests[0].prompt_ids, k, 3) for k in range(8)]
    list(generator.stream(one, SAMPLING))
    assert [c[0] for c in calls if c[1] > 1] == [1, 1]


def test_samples_come_in_the_order_static_batches_wrote_them(generator):
    """Per chunk of `batch` requests, by the tokens sampled until the row stopped, then request
    index: what the static batches wrote, so a shard keeps its order."""
    requests = requests_of(generator, 14)
    order = [i for i, _ in generator.stream(requests, SAMPLING)]
    lengths = [r.max_tokens for r in requests]  # random weights: no row meets eos this soon
    expected = [i for start in range(0, 14, 4)
                for i in sorted(range(start, min(start + 4, 14)), key=lambda j: (lengths[j], j))]
    assert order == expected


def test_in_order_releases_a_result_as_soon_as_nothing_can_come_before_it():
    order = InOrder(6, 3)
    order.finish(2, 4, "c")
    # request 0 has 3 tokens and runs on (it ends with >= 4, index 0 < 2): 2 must wait
    assert list(order.ready(lambda j: {0: 4, 1: 6}[j])) == []
    order.finish(0, 4, "a")
    assert list(order.ready(lambda j: {1: 6}[j])) == [(0, "a"), (2, "c")]
    order.finish(4, 1, "e")  # of the next chunk: waits until the first chunk is out
    assert list(order.ready(lambda j: {1: 7, 3: 2, 5: 2}[j])) == []
    order.finish(1, 9, "b")
    assert list(order.ready(lambda j: {3: 2, 5: 2}[j])) == [(1, "b"), (4, "e")]
    order.finish(5, 2, "f")
    order.finish(3, 2, "d")
    assert list(order.ready(lambda j: 1)) == [(3, "d"), (5, "f")]


def test_stop_strings_still_end_rows(generator):
    """With a stop string the text is checked every step (on the host) and the row ends at
    the token completing it."""
    requests = requests_of(generator, 6, lengths=(12,))
    free = generator.generate(requests, SamplingConfig(n=1, max_tokens=12, temperature=1.0))
    word = generator.tokenizer.decode(free[2].token_ids[3:4])
    assert word.strip()
    stopped = generator.generate(requests, SamplingConfig(n=1, max_tokens=12, temperature=1.0,
                                                          stop=[word]))
    assert stopped[2].finish_reason == "stop" and word in stopped[2].text
    assert stopped[2].token_ids == free[2].token_ids[:len(stopped[2].token_ids)]
    assert len(stopped[2].token_ids) <= 4


def test_kv_cache_rows_are_placed_right_aligned_and_shifted(tiny_model_dir):
    from transformers import AutoConfig

    from reasoner.infer import kv_cache

    config = AutoConfig.from_pretrained(tiny_model_dir)
    cache, other = kv_cache.new_cache(config), kv_cache.new_cache(config)
    layer, theirs = cache.layers[0], other.layers[0]
    layer.update(torch.arange(2 * 5.0).reshape(2, 1, 5, 1), torch.zeros(2, 1, 5, 1), 0)
    theirs.update(torch.tensor([[[[7.0], [8.0]]]]), torch.ones(1, 1, 2, 1), 0)
    layer.place(torch.tensor([1]), theirs, torch.tensor([0]))
    assert layer.keys[:, 0, :5, 0].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 7, 8]]
    assert layer.values[1, 0, :5, 0].tolist() == [0, 0, 0, 1, 1]
    layer.shift(-2)
    assert layer.length == 3 and layer.keys[:, 0, :3, 0].tolist() == [[2, 3, 4], [7, 7, 8]]
    layer.shift(3)
    assert layer.length == 6 and layer.keys[:, 0, 3:6, 0].tolist() == [[2, 3, 4], [7, 7, 8]]
    assert kv_cache.refillable(cache)


def test_left_padded_right_aligns_prompts():
    ids, mask = left_padded([[5, 6], [7]], pad=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]


def test_a_sliding_window_model_decodes_in_batches_that_only_shrink(tiny_model_dir, tmp_path):
    """A cache with sliding-window layers is not refilled in place: its rows are decoded in
    fresh batches, with the same tokens as one batch of all of them."""
    import json
    import shutil

    from reasoner.infer import kv_cache
    from reasoner.infer.hf import HFGenerator

    folder = tmp_path / "sliding"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config.update(use_sliding_window=True, sliding_window=4, max_window_layers=0,
                  layer_types=["sliding_attention"] * layers)
    (folder / "config.json").write_text(json.dumps(config))
    gen = HFGenerator(ModelConfig(name_or_path=str(folder)), batch_size=4)
    assert not kv_cache.refillable(kv_cache.new_cache(gen.model.config))
    requests = requests_of(gen, 9)
    small = gen.generate(requests, SAMPLING)
    gen.preferred_batch = 64
    assert [c.token_ids for c in small] == [c.token_ids for c in gen.generate(requests, SAMPLING)]
    assert [len(c.token_ids) for c in small] == [r.max_tokens for r in requests]
