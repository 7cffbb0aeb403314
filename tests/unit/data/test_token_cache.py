import numpy as np
import pytest

from reasoner import device as dev
from reasoner.data import token_cache


def fake_tokenize(texts):
    return [[ord(c) for c in t] for t in texts]


def test_ids_read_back_exactly_across_batches_from_a_memory_map(tmp_path):
    pairs = [(f"p{i}", "r" * (i % 7)) for i in range(2 * token_cache.BATCH + 76)]
    seen = []
    n = token_cache.write(tmp_path / "t.arrow", iter(pairs), fake_tokenize, seen.append)
    assert n == len(pairs) and seen == [token_cache.BATCH, token_cache.BATCH, 76]
    table = token_cache.TokenTable(tmp_path / "t.arrow")
    assert len(table) == len(pairs)
    for i in (0, token_cache.BATCH - 1, token_cache.BATCH, len(pairs) - 1):
        p, r = pairs[i]
        assert table[i] == [ord(c) for c in p + r]
        assert table.prompt_lens[i] == len(p) and table.lengths[i] == len(p + r)
    assert all(not values.flags.owndata for values, _ in table._chunks)  # views of the map
    with pytest.raises(IndexError):
        table[len(pairs)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.arrow"]  # no temporary left


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    def pairs():
        yield ("a", "b")
        raise RuntimeError("row 2 is bad")

    with pytest.raises(RuntimeError):
        token_cache.write(tmp_path / "t.arrow", pairs(), fake_tokenize)
    assert list(tmp_path.iterdir()) == []


def recording(built: list):
    """A cache builder that records each path it builds."""
    def build(path):
        built.append(path)
        token_cache.write(path, [("a", "b")], fake_tokenize)
    return build


def test_only_the_first_process_of_a_node_builds(tmp_path):
    built = []
    build = recording(built)

    other = dev.DistInfo(rank=1, world_size=1, local_rank=1)
    assert token_cache.build_once(tmp_path / "x.arrow", build, other) is False and not built
    assert token_cache.build_once(tmp_path / "x.arrow", build, None) is False and built
    assert token_cache.build_once(tmp_path / "x.arrow", build, None) is True and len(built) == 1
    assert np.array_equal(token_cache.TokenTable(tmp_path / "x.arrow").lengths, [2])


def test_one_process_of_the_job_builds_a_shared_cache_one_per_node_a_local_one(tmp_path,
                                                                              monkeypatch):
    """Rank 2 is the first process of the second node: with the cache on a file system every
    node shares, rank 0 alone builds it (one tokenizing for the job, not one per node racing
    to the same file); on node-local disks each node's first process builds its copy."""
    monkeypatch.setattr(dev, "barrier", lambda dist: None)
    built = []
    build = recording(built)

    second_node = dev.DistInfo(rank=2, world_size=4, local_rank=0)
    assert token_cache.build_once(tmp_path / "x.arrow", build, second_node) is False and not built
    assert token_cache.build_once(tmp_path / "x.arrow", build, second_node, shared=False) is False
    assert len(built) == 1
    first = dev.DistInfo(rank=0, world_size=4, local_rank=0)
    assert token_cache.build_once(tmp_path / "y.arrow", build, first) is False and len(built) == 2
