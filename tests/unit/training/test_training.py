"""The training core: the lr schedule, metric reduction over micro-batches, the metrics file,
and loading a model for training (`policy.load_wrapped`): a frozen model, a LoRA base or a fixed
reference, is read in the training dtype, never as a whole fp32 copy; what trains is fp32."""

import json
import math
import subprocess

import pytest
import torch

from reasoner import training
from reasoner.config import LoraSettings, OptimConfig, TrainedModelConfig
from reasoner.device import DistInfo, Env
from reasoner.models import lora
from reasoner.training import schedule


def test_lr_warmup_then_cosine_to_min_lr():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_ratio=0.2)
    lrs = [schedule.lr_at(s, 10, cfg) for s in range(10)]
    assert lrs[:2] == [0.5, 1.0]  # 2 warmup steps: linear up to the peak
    assert lrs[2] == 1.0 and lrs[-1] == pytest.approx(0.1)  # cosine from the peak to min_lr
    # step 5 is 3 of the cosine's 7 intervals in
    assert lrs[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False))
    flat = OptimConfig(lr=2.0, min_lr=2.0)
    assert {schedule.lr_at(s, 5, flat) for s in range(5)} == {2.0}


class _State:
    """The parts of training.TrainState that `accumulate` reads."""

    def __init__(self):
        self.dist, self.device, self.policy = DistInfo(), torch.device("cpu"), torch.nn.Linear(1, 1)
        self.scaler = None


def test_accumulate_sums_weights_means_skips_nan_and_keeps_extremes():
    outs = [training.MicroOut({"loss": 0.25, "tokens": 10}, {"geo": 0.5}, 0.25,
                              {"ratio_max": 1.5}, {"ratio_min": 0.9}),
            training.MicroOut({"loss": 0.5, "tokens": 30}, {"geo": math.nan}, 0.75,
                              {"ratio_max": 1.1}, {"ratio_min": 0.7})]
    seen = []

    def step(mb, scale):
        seen.append((mb, scale))
        return outs[mb]

    m = training.accumulate(_State(), 2, step)
    assert seen == [(0, 1.0), (1, 1.0)]
    assert m["loss"] == 0.75 and m["tokens"] == 40
    assert m["geo"] == 0.5  # the NaN micro-batch (no positives) does not pull it towards 0
    assert m["ratio_max"] == 1.5 and m["ratio_min"] == 0.7


def test_accumulate_reads_the_values_left_on_the_device_once_and_as_float_reads_each():
    """Issue 52: a micro-batch's metrics may stay on the device (0-dim tensors) until the
    step's last pass; they are read in one transfer, and the step's metrics are the very
    numbers `float()` of each would have given (fp32 values, an fp64 one, a NaN, a count)."""
    from reasoner.training.host_syncs import HostSyncs

    g = torch.Generator().manual_seed(0)
    values = [torch.rand((), generator=g) / 3 for _ in range(8)]  # fp32: 1/3 rounds
    outs = [training.MicroOut({"loss": values[0], "tokens": 10}, {"geo": values[1]}, 0.25,
                              {"ratio_max": values[2]}, {"ratio_min": values[3]}),
            training.MicroOut({"loss": values[4].double() / 7, "tokens": torch.tensor(30)},
                              {"geo": torch.tensor(math.nan)}, 0.75, {"ratio_max": values[5]},
                              {"ratio_min": values[6]})]
    def floats(d: dict) -> dict:
        return {k: float(v) for k, v in d.items()}

    as_floats = [training.MicroOut(floats(o.sums), floats(o.means), o.weight, floats(o.maxima),
                                   floats(o.minima)) for o in outs]
    expected = training.accumulate(_State(), 2, lambda mb, scale: as_floats[mb])
    with HostSyncs() as syncs:
        got = training.accumulate(_State(), 2, lambda mb, scale: outs[mb])
    assert got == expected and got["tokens"] == 40.0 and got["geo"] == float(values[1])
    assert [(s.op, s.site.split(":")[0]) for s in syncs.found] == [("tolist", "training/loop.py")]


def test_accumulate_pads_a_process_with_fewer_micro_batches_with_zero_weight_passes(monkeypatch):
    """With 2 processes, one holding 1 micro-batch and the other 3: it runs 2 dummy passes at
    scale 0 (collectives inside FSDP would hang otherwise); their metrics count for nothing."""
    from reasoner import device as dev

    run = _State()
    run.dist = DistInfo(rank=1, world_size=2)
    reduced = []

    def fake_all_reduce(values, dist, device, op="sum"):
        reduced.append((list(values), op))
        return [3] if op == "max" and len(values) == 1 else list(values)

    monkeypatch.setattr(dev, "all_reduce", fake_all_reduce)
    import torch.distributed as tdist

    def fake_all_gather_object(out, mine):  # the other process saw one more mean, "kl"
        out[0], out[1] = mine, (mine[0], [*mine[1], "kl"], mine[2], mine[3])

    monkeypatch.setattr(tdist, "all_gather_object", fake_all_gather_object)
    calls = []

    def step(mb, scale):
        calls.append((mb, scale))
        if mb > 0:  # a dummy pass reports nothing: its metrics never count
            return training.MicroOut({})
        return training.MicroOut({"loss": 1.0}, {"m": 5.0}, 0.5)

    m = training.accumulate(run, 1, step)
    assert calls == [(0, 1.0), (1, 0.0), (2, 0.0)]  # grads are summed
    assert reduced[0] == ([1], "max")  # the count is agreed on first
    # every name any process saw is reduced, in one order: loss; then m, kl; then weights
    assert reduced[1] == ([1.0, 0.0, 2.5, 0.0, 0.5], "sum")
    assert m["loss"] == 1.0 and m["m"] == 5.0 and math.isnan(m["kl"])
    # the trainers know every process's micro-batches on the host: the count is not agreed on
    reduced.clear()
    calls.clear()
    assert training.accumulate(run, 1, step, busiest=3) == m
    assert calls == [(0, 1.0), (1, 0.0), (2, 0.0)] and reduced[0] == ([1.0, 0.0, 2.5, 0.0, 0.5], "sum")


def make_run(tmp_path, max_skipped=2):
    from reasoner import runlog
    from reasoner.config import RunConfig

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return training.TrainState(OptimConfig(max_skipped_steps=max_skipped), RunConfig(), tmp_path,
                               torch.device("cpu"), DistInfo(), torch.float32, None, model, model,
                               opt, sched, 10, 0, {},
                               runlog.MetricsLog(tmp_path / "m.jsonl", [], {}, False))


def test_a_non_finite_gradient_norm_skips_the_step_and_too_many_stop_the_run(tmp_path):
    """In every precision a step whose gradient norm is inf / NaN is skipped, unapplied (so such
    a state is never saved as the last good checkpoint), and too many in a row stop the run."""
    from reasoner.errors import TrainingError

    run = make_run(tmp_path)
    before = [p.detach().clone() for p in run.policy.parameters()]

    def backward(value):
        run.policy.weight.grad = torch.full_like(run.policy.weight, value)
        run.policy.bias.grad = torch.zeros_like(run.policy.bias)

    for step in range(2):
        backward(float("inf") if step == 0 else float("nan"))
        m = training.optimizer_step(run, 1.0, step)
        assert m["skipped_step"] == 1.0 and math.isnan(m["grad_norm"])
        assert all(torch.equal(p, b) for p, b in zip(run.policy.parameters(), before,
                                                        strict=True))  # unapplied
    backward(1.0)  # a finite step is applied and resets the count
    assert training.optimizer_step(run, 1.0, 2)["skipped_step"] == 0.0
    assert run.skipped_in_a_row == 0 and run.skipped == 2
    assert not torch.equal(run.policy.weight, before[0])
    for step in range(3, 5):
        backward(float("inf"))
        training.optimizer_step(run, 1.0, step)
    backward(float("inf"))
    with pytest.raises(TrainingError, match=r"3 steps in a row had a non-finite gradient "
                                            r"\(gradient norm inf at step 6\)"):
        training.optimizer_step(run, 1.0, 5)


@pytest.mark.slow
def test_gradients_stay_sharded_between_micro_batches(tmp_path):
    """Two gloo processes, three micro-batches: after each one's backward every FSDP2-sharded
    parameter holds its gradient shard (with sync off until the last micro-batch, FSDP2 would
    hold a whole unsharded fp32 gradient per device meanwhile: ~124 GB at 32B)."""
    from pathlib import Path

    from tests_helpers import SUBPROCESS_ENV, torchrun_two_processes, why

    out = tmp_path / "result.json"
    check = Path(__file__).parents[2] / "grad_sync_check.py"
    done = subprocess.run(torchrun_two_processes(check, out), capture_output=True, text=True,
                          env=SUBPROCESS_ENV, timeout=600)
    assert done.returncode == 0, why(done)
    result = json.loads(out.read_text())
    assert result["sharded_params"] > 0
    assert result["grads_sharded_after_each"] == [True, True, True]


def test_fused_adamw_when_asked_is_adamw_with_its_two_groups():
    """The trainers ask for torch's fused AdamW on CUDA (no loss scaler): the default foreach
    update holds a second copy of every shard during the step (measured with the same kernel on
    CPU by scripts/bench_memory.py: the 1-process step peak of the 0.5B model fell from 9.56 to
    8.51 GiB). Its update is AdamW's to rounding, and the two groups stay (matrices decay, the
    rest does not). CPU keeps the per-tensor loop, whose rounding the quickstart's published
    results were measured with."""
    from reasoner.config import OptimConfig
    from reasoner.training.schedule import build_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    cfg = OptimConfig(lr=0.1, weight_decay=0.1)
    assert not build_optimizer(model, cfg).defaults["fused"]
    opt = build_optimizer(model, cfg, fused=True)
    assert opt.defaults["fused"] is True
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    plain = torch.optim.AdamW([{"params": [reference[0]], "weight_decay": 0.1},
                               {"params": reference[1:], "weight_decay": 0.0}],
                              lr=0.1, betas=cfg.betas, eps=cfg.eps, foreach=False)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for p, q in zip(model.parameters(), reference, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        opt.step()
        plain.step()
    for p, q in zip(model.parameters(), reference, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


BF16 = Env(torch.device("cpu"), DistInfo(), torch.bfloat16)
FP32 = Env(torch.device("cpu"), DistInfo(), torch.float32)
SETTINGS = LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "down_proj"])


@pytest.fixture
def read_dtypes(monkeypatch) -> list:
    """The dtype every `from_pretrained` of a causal LM is asked to read the weights in."""
    from transformers import AutoModelForCausalLM

    asked, real = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        asked.append(kwargs.get("dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    return asked


def dtypes(model: torch.nn.Module) -> dict[str, set]:
    found: dict[str, set] = {"adapters": set(), "base": set()}
    for name, p in model.named_parameters():
        found["adapters" if lora.is_adapter(name) else "base"].add(p.dtype)
    return found


def test_a_lora_base_is_read_in_the_training_dtype_and_only_the_adapters_are_fp32(
        tiny_model_dir, read_dtypes):
    """bf16 training: the base is read in bf16 (it was read in fp32 and cast on the device:
    30.5 GB for Qwen2.5-7B), the adapters are fp32 masters (PEFT makes them in the base's
    dtype), and both hold the values the fp32 read and cast gave, bit for bit."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    model = TrainedModelConfig(name_or_path=str(tiny_model_dir), lora=SETTINGS)
    adapters = lora.Adapters(SETTINGS, (lora.TRAINED, lora.REFERENCE), seed=3)
    loaded = training.load_policy(model, tiny_model_dir, BF16, chunk=64, adapters=adapters)
    assert read_dtypes == [torch.bfloat16]
    assert dtypes(loaded.model) == {"adapters": {torch.float32}, "base": {torch.bfloat16}}
    trained = {n for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n and f".{lora.TRAINED}." in n for n in trained)
    assert loaded.model.config.dtype == torch.float32  # its checkpoints' config.json, as before

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                  attn_implementation="sdpa")
    lora.inject(before, SETTINGS, adapters.sets, base_dtype=torch.bfloat16)
    lora.initialise(before, adapters)
    now = loaded.model.state_dict()
    assert before.state_dict().keys() == now.keys()
    for name, value in before.state_dict().items():
        assert value.dtype == now[name].dtype and torch.equal(value, now[name]), name
    buffers = dict(loaded.model.named_buffers())  # the rotary frequencies stay as they were
    for name, value in before.named_buffers():
        assert value.dtype == buffers[name].dtype and torch.equal(value, buffers[name]), name


def test_a_frozen_reference_is_read_in_the_training_dtype(tiny_model_dir, read_dtypes):
    """A fixed reference (`frozen`) is read in bf16, a model that trains in fp32 (its master
    weights), and with fp32 training everything is read as before, in fp32."""
    model = TrainedModelConfig(name_or_path=str(tiny_model_dir))
    reference = training.load_policy(model, tiny_model_dir, BF16, chunk=64, frozen=True)
    assert dtypes(reference.model)["base"] == {torch.bfloat16}
    trained = training.load_policy(model, tiny_model_dir, BF16, chunk=64)
    assert dtypes(trained.model)["base"] == {torch.float32}
    training.load_policy(model, tiny_model_dir, FP32, chunk=64, frozen=True)
    assert read_dtypes == [torch.bfloat16, torch.float32, torch.float32]


def test_fp32_lora_loads_as_before(tiny_model_dir, read_dtypes):
    """The quickstart's fp32 path: the base and adapters read and held in fp32."""
    pytest.importorskip("peft")
    model = TrainedModelConfig(name_or_path=str(tiny_model_dir), lora=SETTINGS)
    loaded = training.load_policy(model, tiny_model_dir, FP32, chunk=64,
                         adapters=lora.Adapters(SETTINGS, seed=0))
    assert read_dtypes == [torch.float32]
    assert dtypes(loaded.model) == {"adapters": {torch.float32}, "base": {torch.float32}}


def test_a_stop_signal_saves_on_every_process_or_on_none(monkeypatch, tmp_path):
    """After SIGTERM, whether to checkpoint first hangs on how long the last save took. Each
    process timed its own save; deciding apart, a process under the grace would enter the
    save's collectives while the other left (a hang, or gloo reading a mismatched message). The
    processes take the slowest save, so both ranks here decide alike, whichever of them got the
    signal."""
    from types import SimpleNamespace

    from reasoner.config import RunConfig
    from reasoner.device import DistInfo
    from reasoner.errors import Stopped
    from reasoner.training import loop

    ranks = {0: {"signal": 15, "last_save_s": 1.0}, 1: {"signal": 0, "last_save_s": 50.0}}
    monkeypatch.setattr(loop.dev, "all_reduce", lambda values, dist, device, op: [
        max(r[k] for r in ranks.values()) for k in ("signal", "last_save_s")])
    monkeypatch.setattr(loop.checkpoints, "latest_checkpoint", lambda out, identity: None)
    for grace, saves in ((30.0, False), (60.0, True)):
        for rank, own in ranks.items():
            saved = []
            monkeypatch.setattr(loop, "_save", lambda state, done, extra, saved=saved: saved.append(done))
            loop._stop.clear()
            if own["signal"]:
                loop._stop["signal"] = own["signal"]
            state = SimpleNamespace(
                dist=DistInfo(rank=rank, world_size=2, local_rank=rank), device=torch.device("cpu"),
                settings=RunConfig(save_every=5, term_grace_s=grace), total_steps=20,
                last_save_s=own["last_save_s"], metrics=SimpleNamespace(close=lambda: None),
                out=tmp_path, identity="")
            with pytest.raises(Stopped, match="SIGTERM after step 3"):
                loop.stop_here(state, 3, False, dict)
            assert saved == ([3] if saves else []), (grace, rank)
    loop._stop.clear()
