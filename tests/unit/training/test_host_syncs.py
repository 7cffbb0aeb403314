"""Host syncs inside one optimiser step of each recipe (issue 52: a traceable step reads
nothing back from the device but what it must, once): train-offline with pcl and with dapo, and
sft with packing, one step each on the tiny model. `training.host_syncs.HostSyncs` records
around the step: every micro-batch's forward and backward, and the optimiser step (the logging
and checkpoints after it are outside). The counts are printed by call site (`pytest -s`).

Before issue 52 one such step made 115 (pcl), 123 (dapo) and 47 (sft) on this model: per
micro-batch the boolean selections of its targets (`hidden[keep]`, `labels[keep]`,
`sample_index[keep]`), the count of its real tokens, `float()` of its loss and of each metric,
and pcl's `geo[pos]` with `pos.any()`.
"""

import json
import re
from collections import Counter

import pytest

from reasoner import sft, training
from reasoner import train_offline as T
from reasoner.config import OfflineConfig, SFTConfig
from reasoner.training.host_syncs import HostSyncs

# What a step still reads, by the reasoner line that reads it (file (function), op): the step's
# metrics, all at once after its last micro-batch, and the gradient norm, which decides whether
# the update is applied (a non-finite one skips it; only a fused optimiser could skip on the
# device).
STEP = Counter({("training/loop.py (read)", "tolist"): 1,
                ("training/loop.py (optimizer_step)", "__float__"): 1})
# What libraries read inside the step, not reasoner's code: torch's per-parameter AdamW reads
# its step counters (CPU tensors, not a device sync; the fused AdamW the trainers take on CUDA
# reads none), and transformers checks the position ids for packed sequences once per forward
# (for sdpa, eager and flash kernels; it skips the check on fake tensors).
LIBRARIES = {("torch/optim/optimizer.py", "item"), ("transformers/masking_utils.py", "__bool__")}


def own(syncs: HostSyncs) -> Counter:
    """The syncs reasoner's own lines make, by (file (function), op), line numbers left out."""
    return Counter((re.sub(r":\d+ ", " ", s.site), s.op) for s in syncs.found if not s.via)


def libraries(syncs: HostSyncs) -> set:
    return {(s.via.split(":")[0], s.op) for s in syncs.found if s.via}


def test_the_recorder_finds_every_kind_of_host_read_once_and_nothing_else(monkeypatch):
    """Reads of values, outputs shaped by data (a bool index, a `repeat_interleave` with tensor
    repeats, `masked_scatter`, whose backward selects by the mask), a device tensor copied to
    the CPU (a CPU one is not) and `all_gather_object`, each once, whoever made it; selecting
    with host-built indices, numpy reads and `output_size` are not host syncs."""
    import numpy as np
    import torch
    import torch.distributed as tdist

    monkeypatch.setattr(tdist, "all_gather_object",
                        lambda out, obj: out.__setitem__(0, torch.tensor(obj).item()))
    x = torch.arange(6.0, requires_grad=True)
    with HostSyncs() as syncs:
        keep = x.detach() > 2
        x[keep].sum().backward()  # the index is found once, in the forward
        float(x.detach().sum()), x.tolist(), bool(keep.any())
        torch.zeros(6).masked_scatter(keep, x).sum().backward()
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]))
        torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 3]), output_size=6)
        x.index_select(0, torch.from_numpy(np.flatnonzero(keep.numpy()))).sum()
        x.cpu(), x.to("cpu")
        tdist.all_gather_object([None], 3)
    assert [s.op for s in syncs.found] == [
        "__getitem__", "__float__", "tolist", "__bool__", "masked_scatter",
        "aten.masked_scatter_backward", "repeat_interleave", "all_gather_object"]
    assert all(s.site == "(outside reasoner)" and "test_host_syncs.py" in s.via
               or s.op.startswith("aten.") for s in syncs.found)


@pytest.fixture
def syncs(monkeypatch) -> HostSyncs:
    """A recorder entered around every `training.accumulate` and `training.optimizer_step`."""
    recorder = HostSyncs()
    for name in ("accumulate", "optimizer_step"):
        def recorded(*args, real=getattr(training, name), **kwargs):
            with recorder:
                return real(*args, **kwargs)

        monkeypatch.setattr(training, name, recorded)
    return recorder


def offline(tiny_model_dir, verified_dir, out, objective) -> OfflineConfig:
    return OfflineConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)}, "input_dir": str(verified_dir),
        "output_dir": str(out), "seq_len": 256, "max_tokens": 256, "objective": objective,
        "run": {"global_batch": 8, "micro_batch": 1, "max_steps": 1, "progress": False}})


@pytest.mark.parametrize("objective", [{"name": "pcl"}, {"name": "dapo"},
                                       {"name": "dapo", "correction": {"name": "m2-mask"}}],
                         ids=["pcl", "dapo", "dapo-m2-mask"])
def test_a_train_offline_step_reads_its_metrics_once_and_its_gradient_norm(
        tmp_path, tiny_model_dir, verified_dir, syncs, objective):
    """... a sorting mask included (M2PO's: how many tokens it drops stays on the device)."""
    T.run(offline(tiny_model_dir, verified_dir, tmp_path, objective))
    print("\n" + syncs.report(f"train-offline {objective}, one step"))
    assert own(syncs) == STEP
    assert libraries(syncs) == LIBRARIES
    # ... with the off-policy diagnostics computed in that step (they add no read of their own)
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"offpolicy_kl_k3", "offpolicy_chi2", "offpolicy_seq_ratio_std"} <= set(logged)


def test_an_sft_step_reads_its_metrics_once_and_its_gradient_norm(tmp_path, synth_dir,
                                                                   tiny_model_dir, syncs):
    """sft's step hands the policy the collator's layout and leaves its NLL on the device: before,
    it read the layout back from the labels and its NLL with `float()`, once per micro-batch
    each (9 reads of its own at 4 micro-batches, 2 now)."""
    sft.run(SFTConfig.model_validate({
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"path": str(synth_dir / "sft"), "limit": 40}, "output_dir": str(tmp_path),
        "max_tokens": 512, "seq_len": 700, "packing": True,
        "run": {"global_batch": 4, "micro_batch": 1, "max_steps": 1, "progress": False}}))
    print("\n" + syncs.report("sft (packed), one step"))
    assert own(syncs) == STEP
    assert libraries(syncs) == LIBRARIES
