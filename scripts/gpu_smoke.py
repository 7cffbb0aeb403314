"""What the hardware contracts (docs/hardware.md) claim, checked on a real accelerator in one
short run; writes one JSON report. No internet, and nothing beyond torch is assumed: a check
whose packages are absent is reported as skipped, with the import error.

    python scripts/gpu_smoke.py --out gpu_smoke.json            # on the GPU machine
    python scripts/gpu_smoke.py --device cpu --out /tmp/x.json  # the same checks on a CPU

Checks:
- logprob_parity: `token_logprobs` under bf16 autocast on the device, values and gradients,
  against the fp64 log-softmax of the bf16-rounded logits on the CPU (contract 4);
- packed_attention: a tiny Qwen2 in bf16 scoring packed rows with no mask (the varlen path
  transformers takes from restarting position ids: sdpa here, flash-attention where installed)
  against each sample alone (contract 5), and the kernel `plan_attention` picks;
- bf16_policy: FSDP2 (one process, NCCL) with the bf16 mixed-precision policy: the layers
  compute with bf16 parameters, the master shards stay fp32, the gradient reduction is a sum
  and matches the unsharded model's (contracts 2, 3);
- trainers: `reasoner sft` and `reasoner train-offline` (pcl) on a tiny model, bf16, packed,
  one step each, on the device (contract 5 in both trainers);
- sequence_parallel: where two devices are lent, Ulysses sequence parallelism over them (NCCL,
  the kernel `plan_attention` picks, bf16): token log-probs and gradients of a packed row against
  one device's, and `reasoner sft` with run.sequence_parallel=2 (skipped, saying so, on one);
- rehearsal_peak: `reasoner sft` on a model of Qwen2.5-0.5B-Instruct's widths (4 layers,
  random weights, bf16, 2 steps of 2 packed 4,096-token rows) measured on the device (torch's peak allocated
  bytes) against `reasoner plan --rehearse`'s peak for the same config on fake tensors
  (pipeline/rehearsal.py), with the T x T mask a sdpa run adds where flash-attn is absent (the
  rehearsal stands in flash-attn's kernel). On a CPU both runs go through and the measured side
  is reported as absent (the peak is a CUDA allocator's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def logprob_parity(device):
    import torch

    from reasoner.models.logprobs import token_logprobs

    g = torch.Generator().manual_seed(0)
    h = 3 * torch.randn(256, 128, generator=g)
    w = torch.randn(2000, 128, generator=g)
    t = (h @ w.T).argmax(-1)
    coef = torch.randn(256, generator=g)
    hd, wd = h.to(device, copy=True).requires_grad_(), w.to(device, copy=True).requires_grad_()
    with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
        lp = token_logprobs(hd, wd, t.to(device), 64)
    (lp * coef.to(device)).sum().backward()
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    exact = h64 @ w64.T
    rounded = (h.to(torch.bfloat16) @ w.to(torch.bfloat16).T).double()
    ref = torch.log_softmax(exact + (rounded - exact).detach(), -1).gather(1, t[:, None])[:, 0]
    (ref * coef.double()).sum().backward()
    rel = lambda a, b: float((a.double().cpu() - b).norm() / b.norm())  # noqa: E731
    out = {"logprob_max_abs": float((lp.double().cpu() - ref).abs().max()),
           "grad_hidden_rel": rel(hd.grad, h64.grad), "grad_weight_rel": rel(wd.grad, w64.grad)}
    # device bf16 kernels may round a few logits differently from the CPU's: 1e-2, not 1e-5
    out["ok"] = out["logprob_max_abs"] < 5e-2 and max(out["grad_hidden_rel"],
                                                      out["grad_weight_rel"]) < 1e-2
    return out


def tiny_qwen(device, dtype, attn="sdpa"):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=False, attn_implementation=attn)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype)


def packed_attention(device):
    import torch

    from reasoner.data.packing import collate_packed
    from reasoner.models.attention import plan_attention

    plan = plan_attention(None, device, torch.bfloat16, True)
    out = {"plan": {"implementation": plan.implementation, "varlen": plan.varlen}}
    model = tiny_qwen(device, torch.bfloat16, plan.implementation).eval()
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (37, 90, 11)]
    batch = collate_packed([[(s, [True] * len(s)) for s in samples]], 160, 0, flat=plan.varlen)
    worst = 0.0
    with torch.no_grad():
        packed = model(input_ids=batch.input_ids.to(device),
                       position_ids=batch.position_ids.to(device), use_cache=False).logits[0]
        start = 0
        for s in samples:
            alone = model(input_ids=torch.tensor([s], device=device), use_cache=False).logits[0]
            worst = max(worst, float((packed[start:start + len(s)] - alone).abs().max()))
            start += len(s)
    out["packed_vs_alone_max_abs"] = worst
    out["ok"] = worst < 0.1  # bf16 logits of ~N(0, 1) size: a leak between samples is O(1)
    return out


def bf16_policy(device):
    import torch
    import torch.distributed as dist

    from reasoner.models.fsdp import shard_modules
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.models.vocab_layout import VocabSplit

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29677", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        import copy

        whole = PolicyLogprobs(tiny_qwen(device, torch.float32), 64)
        pol = copy.deepcopy(whole)
        layout = shard_modules(pol, pol.model, torch.bfloat16, VocabSplit("fsdp"))
        seen = set()
        pol.model.model.layers[0].mlp.register_forward_hook(
            lambda m, i, o: seen.add(str(m.up_proj.weight.dtype)))
        ids = torch.randint(3, 512, (2, 64), device=device)
        for m in (whole, pol):
            with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
                lp = m(ids, torch.arange(64, device=device).expand(2, 64), None, ids)
            lp.float().sum().backward()
        err = 0.0
        for p, q in zip(pol.parameters(), whole.parameters(), strict=True):
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            err = max(err, float((g.float() - q.grad).norm() / q.grad.norm().clamp_min(1e-12)))
        masters = sorted({str(p.dtype) for p in pol.parameters()})
        out = {"layout": layout, "layer_compute_dtype": sorted(seen), "master_dtypes": masters,
               "grad_rel_err": err}
        out["ok"] = seen == {"torch.bfloat16"} and masters == ["torch.float32"] and err < 0.1
        return out
    finally:
        dist.destroy_process_group()


def trainers(device):
    import subprocess

    import torch  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    dev = device.type
    qs = REPO / "configs" / "quickstart"
    on = [f"model.device={dev}", "model.dtype=bfloat16"]
    steps = [
        ["data", "synth", str(qs / "data_synth.yaml"), f"output_dir={work}/data",
         "num_train=64", "num_test=8"],
        ["model", "tiny", str(qs / "tiny_model.yaml"), f"output_dir={work}/tiny",
         f"corpus=[{work}/data/sft]"],
        ["sft", str(qs / "sft.yaml"), f"model.name_or_path={work}/tiny",
         f"data.path={work}/data/sft", f"output_dir={work}/sft", "run.max_steps=2",
         "run.progress=false", *on],
        ["infer", str(qs / "infer.yaml"), f"model.name_or_path={work}/sft/final",
         f"data.path={work}/data/train_problems", "data.limit=16", "sampling.n=2",
         f"output_dir={work}/samples", *on],
        ["verify", str(qs / "verify.yaml"), f"input_dir={work}/samples",
         f"output_dir={work}/verified", "filters.drop_zero_variance=false"],
        ["train-offline", str(qs / "train_offline.yaml"), f"model.name_or_path={work}/sft/final",
         f"input_dir={work}/verified", f"output_dir={work}/rl", "run.max_steps=1",
         "run.progress=false", *on],
    ]
    out = {}
    for args in steps:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "reasoner", *args], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=400)
        out[" ".join(args[:2 if args[0] in ("data", "model") else 1])] = {
            "rc": done.returncode, "s": round(time.perf_counter() - started, 1),
                        "tail": done.stderr[-600:] if done.returncode else ""}
        if done.returncode:
            break
    out["ok"] = all(v["rc"] == 0 for v in out.values() if isinstance(v, dict))
    return out


def sequence_parallel(device):
    """Two processes sharing a packed row (see the module docstring); skipped on one device."""
    import subprocess

    import torch

    count = torch.cuda.device_count() if device.type == "cuda" else 2
    if count < 2:
        return {"skipped": f"{count} device lent: sequence parallelism needs 2"}
    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_sp_"))
    out = work / "sp.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                "--master_port=29688"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([*torchrun, __file__, "--sp-worker", str(out), "--device",
                           device.type], capture_output=True, text=True, env=env, timeout=400)
    if done.returncode:
        return {"ok": False, "error": done.stderr[-1500:]}
    result = json.loads(out.read_text())
    qs, dtype = REPO / "configs" / "quickstart", "float32" if device.type == "cpu" else "bfloat16"
    steps = [["data", "synth", str(qs / "data_synth.yaml"), f"output_dir={work}/data",
              "num_train=64", "num_test=8"],
             ["model", "tiny", str(qs / "tiny_model.yaml"), f"output_dir={work}/tiny",
              f"corpus=[{work}/data/sft]"]]
    for args in steps:
        subprocess.run([sys.executable, "-m", "reasoner", *args], check=True, env=env,
                       capture_output=True, cwd=REPO)
    sft = subprocess.run([*torchrun, "-m", "reasoner", "sft", str(qs / "sft.yaml"),
                          f"model.name_or_path={work}/tiny", f"data.path={work}/data/sft",
                          f"output_dir={work}/sft", "run.max_steps=2", "run.progress=false",
                          "run.sequence_parallel=2", f"model.device={device.type}",
                          f"model.dtype={dtype}"], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=400)
    result["sft_rc"] = sft.returncode
    if sft.returncode:
        result["sft_tail"] = sft.stderr[-600:]
    result["ok"] = result["logp_max_abs"] < 5e-2 and result["grad_rel"] < 5e-2 and not sft.returncode
    return result


def sp_worker(out: Path, device_type: str) -> None:
    """Inside each of the two processes of `sequence_parallel`."""
    import copy

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2Config

    from reasoner import device as dev
    from reasoner.models.attention import plan_attention
    from reasoner.models.logprobs import PolicyLogprobs
    from reasoner.models.sequence_parallel import SequenceGroup

    rank = int(os.environ["RANK"])
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sp = SequenceGroup(2, rank, dist.new_group([0, 1]))
    kernel = plan_attention(None, device, dtype, True).implementation
    config = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    alone = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=kernel,
                                             dtype=torch.float32).to(device)
    shared = AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation=plan_attention(
            None, device, dtype, True, sp).implementation, dtype=torch.float32).to(device)
    shared.load_state_dict(alone.state_dict())
    lengths = [300, 700, 250, 800]  # one flat row of 2,050 tokens, sliced inside sample 1
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 256, (1, sum(lengths)), generator=g).to(device)
    pos = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    labels = ids.roll(-1, 1)
    labels[0, torch.cumsum(torch.tensor(lengths), 0).to(device) - 1] = -100
    values = {}
    for name, model, share in (("one", PolicyLogprobs(alone, 512), 1.0),
                               ("two", PolicyLogprobs(shared, 512, sp=sp), 0.5)):
        with dev.autocast(device, dtype):
            lp = model(ids, pos, None, labels).float()
        (lp.sum() * share).backward()
        values[name] = lp.detach()
    grads = []
    for a, b in zip(alone.parameters(), shared.parameters(), strict=True):
        gsum = b.grad.clone()
        dist.all_reduce(gsum)
        grads.append(float((gsum - a.grad).norm() / a.grad.norm().clamp_min(1e-12)))
    result = {"kernel": kernel, "tokens": int(values["one"].numel()),
              "logp_max_abs": float((values["one"] - values["two"]).abs().max()),
              "grad_rel": max(grads)}
    if rank == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


REHEARSED_ROW = 4096  # tokens of each packed row of rehearsal_peak
REHEARSED_WITHIN = 0.15  # measured / rehearsed within 15%: the allocator rounds blocks up


def rehearsal_peak(device):
    import subprocess

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasoner.config import SFTConfig, load
    from reasoner.pipeline import rehearsal

    work = Path(tempfile.mkdtemp(prefix="gpu_smoke_rehearsal_"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    qs = REPO / "configs" / "quickstart"
    for args in (["data", "synth", str(qs / "data_synth.yaml"), f"output_dir={work}/data",
                  "num_train=2000", "num_test=8"],
                 ["model", "tiny", str(qs / "tiny_model.yaml"), f"output_dir={work}/tiny",
                  f"corpus=[{work}/data/sft]"]):
        subprocess.run([sys.executable, "-m", "reasoner", *args], check=True, env=env, cwd=REPO,
                       capture_output=True, timeout=300)
    # Qwen2.5-0.5B-Instruct's widths (its 151,936-token vocabulary), 4 layers, the tiny
    # run's tokenizer
    config = rehearsal.model_config("Qwen/Qwen2.5-0.5B-Instruct", layers=4)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(work / "model")
    AutoTokenizer.from_pretrained(work / "tiny").save_pretrained(work / "model")
    overrides = [f"model.name_or_path={work}/model", f"data.path={work}/data/sft",
                 f"output_dir={work}/sft", f"model.device={device.type}",
                 "model.dtype=bfloat16", f"seq_len={REHEARSED_ROW}",
                 f"max_tokens={REHEARSED_ROW}", "run.micro_batch=1", "run.global_batch=2",
                 "run.max_steps=2", "run.gradient_checkpointing=true", "run.progress=false"]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "reasoner", "sft", str(qs / "sft.yaml"),
                           *overrides], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)
    if done.returncode:
        return {"ok": False, "error": done.stderr[-1500:]}
    measured_s = round(time.perf_counter() - started, 1)
    logged = [json.loads(line) for line in (work / "sft" / "metrics.jsonl").read_text().splitlines()]
    measured = max((r.get("peak_mem_gib", 0.0) for r in logged), default=0.0) or None
    cfg = load(SFTConfig, qs / "sft.yaml", overrides)
    flash = True
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        flash = False
    kind = "h100" if device.type == "cuda" else "cpu"
    r = rehearsal.rehearse("sft", cfg, str(work / "model"), 1, kind, None, REHEARSED_ROW)
    rehearsed = r.total / 2**30
    # without flash-attn the trainer runs sdpa with one additive T x T mask per micro-batch
    # (docs/hardware.md row 35), which the flash-attn stand-in does not hold
    mask = 0.0 if flash or kind == "cpu" else REHEARSED_ROW ** 2 * 2 / 2**30
    out = {"rehearsed_gib": round(rehearsed, 3), "sdpa_mask_gib": round(mask, 3),
           "rehearsed_where": r.where, "rehearsal_s": round(r.wall_s, 1), "sft_s": measured_s,
           "flash_attn": flash}
    if measured is None:
        out["measured_gib"] = f"absent: the peak is a CUDA allocator's, this ran on {device.type}"
        return out
    ratio = measured / (rehearsed + mask)
    out.update({"measured_gib": round(measured, 3), "measured_over_rehearsed": round(ratio, 3),
                "ok": abs(ratio - 1) <= REHEARSED_WITHIN})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu_smoke.json"))
    parser.add_argument("--sp-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sp_worker:
        sp_worker(args.sp_worker, args.device)
        return
    import torch

    device = torch.device(args.device)
    report = {"torch": torch.__version__, "device": args.device,
              "name": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
    for name in ("transformers", "flash_attn", "vllm", "pydantic"):
        try:
            report[name] = __import__(name).__version__
        except ImportError as e:
            report[name] = f"absent ({e})"
    for check in (logprob_parity, packed_attention, bf16_policy, trainers, sequence_parallel,
                  rehearsal_peak):
        started = time.perf_counter()
        try:
            result = check(device)
        except ImportError as e:
            result = {"skipped": f"{type(e).__name__}: {e}"}
        except Exception as e:  # noqa: BLE001 - the report says what failed, and goes on
            result = {"ok": False, "error": "".join(traceback.format_exception(e))[-1500:]}
        result["s"] = round(time.perf_counter() - started, 1)
        report[check.__name__] = result
        print(check.__name__, json.dumps(result)[:400], flush=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    failed = [k for k, v in report.items() if isinstance(v, dict) and v.get("ok") is False]
    print(f"gpu_smoke: {'failed: ' + ', '.join(failed) if failed else 'all ran checks passed'}"
          f" -> {args.out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
