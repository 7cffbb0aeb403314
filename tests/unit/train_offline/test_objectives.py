"""Objectives: divergence points, pcl's negative scopes and the per-sample training signal."""

import pytest
import torch

from reasoner.config import OfflineConfig
from reasoner.train_offline.objectives import divergence, sample_signal, token_scope
from reasoner.train_offline.rollouts import Rollouts


def rollouts(rewards, groups, group_acc=None, ids=None):
    n = len(rewards)
    return Rollouts(keys=[("p", i) for i in range(n)], ids=ids or [[9, 1, 2]] * n,
                    prompt_lens=[1] * n, rewards=torch.tensor(rewards),
                    groups=torch.tensor(groups), group_acc=torch.tensor(group_acc or [0.5] * n),
                    reasoning=torch.zeros(n), has_answer=torch.ones(n, dtype=torch.bool),
                    old_logp=None, dropped=0)


def objective(**kw):
    return OfflineConfig.model_validate({"model": {"name_or_path": "x"}, "input_dir": "x",
                                         "output_dir": "x", "objective": kw}).objective


def test_divergence_spares_shared_prefixes():
    r = Rollouts(keys=[("a", 0), ("a", 1), ("a", 2)], ids=[[9, 1, 2, 3], [9, 1, 2, 4], [9, 5, 6]],
                   prompt_lens=[1, 1, 1], rewards=torch.tensor([1.0, -1.0, -1.0]),
                   groups=torch.tensor([0, 0, 0]), group_acc=torch.full((3,), 1 / 3),
                   reasoning=torch.zeros(3), has_answer=torch.ones(3, dtype=torch.bool),
                   old_logp=None, dropped=0)
    assert divergence(r) == [0, 2, 0]
    obj = OfflineConfig.model_validate({"model": {"name_or_path": "x"}, "input_dir": "x",
                                        "output_dir": "x", "objective": {"neg_scope": "first"}}).objective
    assert list(token_scope(obj, r)) == [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0], [1.0, 0.0]]


def test_divergence_reads_one_group_at_a_time():
    """64 samples in 8 groups of 8 (4 right, 4 wrong): never more than one group's responses
    are held at once (about a group), where every response used to be held for the whole
    pass; the answer is
    the prefix a wrong response shares with its group's closest right one."""
    import gc
    import weakref

    import numpy as np

    alive, peak = [0], [0]

    class Ids(list):  # hands out arrays it can watch
        def __getitem__(self, i):
            a = np.array(list.__getitem__(self, i))
            alive[0] += 1
            weakref.finalize(a, lambda: alive.__setitem__(0, alive[0] - 1))
            gc.collect()
            peak[0] = max(peak[0], alive[0])
            return a

    rows = [[9] + [g, k % 4, k] for g in range(8) for k in range(8)]  # prompt 9
    r = rollouts([1.0 if k < 4 else -1.0 for g in range(8) for k in range(8)],
                 [g for g in range(8) for _ in range(8)], ids=Ids(rows))
    got = divergence(r)
    assert peak[0] <= 2 * 8  # this group and the one before it, at most (was: all 64)
    # wrong sample k shares [g, k % 4] with right sample k % 4, then differs at k
    assert got == [0, 0, 0, 0, 2, 2, 2, 2] * 8
    obj = objective(neg_scope="first")
    assert list(token_scope(obj, r))[4] == [0.0, 0.0, 1.0]


def test_pcl_signal_folds_in_neg_weight_balance_and_baseline():
    r = rollouts([1.0, -1.0, -1.0, 1.0], [0, 0, 0, 1], group_acc=[1 / 3, 1 / 3, 1 / 3, 1.0])
    assert sample_signal(objective(name="pcl"), r).tolist() == [1.0, -1.0, -1.0, 1.0]
    assert sample_signal(objective(neg_weight=0.5), r).tolist() == [1.0, -0.5, -0.5, 1.0]
    # balance: negatives x p/(1-p) = (1/3)/(2/3) = 0.5, so the group's negatives sum to -1
    assert sample_signal(objective(balance=True), r).tolist() == pytest.approx([1.0, -0.5, -0.5, 1.0])
    # baseline: R - group mean (1/3 -> 2/3, -4/3; the lone sample of group 1 -> 0)
    assert sample_signal(objective(baseline="group"), r).tolist() == pytest.approx(
        [4 / 3, -2 / 3, -2 / 3, 0.0])


def test_rft_and_oreal_train_on_the_reward_clipped_on_group_advantages():
    r = rollouts([1.0, -1.0, 1.0], [0, 0, 1])
    assert sample_signal(objective(name="rft"), r).tolist() == [1.0, -1.0, 1.0]
    assert sample_signal(objective(name="oreal"), r).tolist() == [1.0, -1.0, 1.0]
    assert sample_signal(objective(name="dapo", advantage="rloo"), r).tolist() == [2.0, -2.0, 0.0]
