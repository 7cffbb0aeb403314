"""Benchmark: SFT tokens/s, reasoner packed vs padded vs TRL's SFTTrainer (bfd packing), one run.

    pip install -e '.[bench]' && python scripts/bench_sft.py [--steps 30] [--out runs/bench_sft]

Same tiny model, data, machine and batch shape for all three; TRL is configured fairly: fp32 on
CPU, no gradient checkpointing, completion-only loss, packing_strategy="bfd". Prints a markdown
table of tokens/s, padding waste and the ratios (the numbers in docs/benchmarks.md come from here).
Ratios matter, not absolute times: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from reasoner import sft
from reasoner.config import SFTConfig, SynthConfig, TinyConfig, TinyModelConfig
from reasoner.data import synthetic
from reasoner.models import build_tiny


def reasoner_run(data: Path, model: Path, out: Path, packing: bool, steps: int, seq_len: int,
                 rows: int) -> dict:
    cfg = SFTConfig.model_validate({
        "model": {"name_or_path": str(model)}, "data": {"path": str(data / "sft")},
        "output_dir": str(out), "max_tokens": seq_len, "packing": packing, "seq_len": seq_len,
        "optim": {"lr": 1e-3},
        # padded rows hold one sample each: give them as many samples per step as packed rows hold
        "run": {"micro_batch": rows, "global_batch": rows, "max_steps": steps, "progress": False,
                "resume": "never"},
    })
    sft.run(cfg)
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    return {"tokens_per_s": last["tokens_per_s"], "efficiency": last["packing_efficiency"]}


def trl_run(data: Path, model: Path, out: Path, steps: int, seq_len: int, rows: int) -> dict:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig as TrlConfig
    from trl import SFTTrainer

    from reasoner import shards
    from reasoner.config import TemplateConfig
    from reasoner.data.template import render_sft

    tok = AutoTokenizer.from_pretrained(model)
    rows_ = [render_sft(r, TemplateConfig(), tok) for r in shards.iter_rows(data / "sft")]
    ds = datasets.Dataset.from_list([{"prompt": p, "completion": c} for p, c in rows_])
    args = TrlConfig(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=rows,
        gradient_accumulation_steps=1, learning_rate=1e-3, packing=True, packing_strategy="bfd",
        max_length=seq_len, completion_only_loss=True, bf16=False, fp16=False,
        gradient_checkpointing=False, logging_steps=steps, save_strategy="no", report_to=[],
        dataloader_num_workers=0, use_cpu=True, seed=0, disable_tqdm=True,
    )
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model), args=args,
                         train_dataset=ds, processing_class=tok)
    loader = trainer.get_train_dataloader()
    tokens = 0
    for i, batch in enumerate(loader):
        if i >= steps:
            break
        mask = batch.get("attention_mask")
        tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
    started = time.perf_counter()
    trainer.train()
    return {"tokens_per_s": tokens / (time.perf_counter() - started), "efficiency": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rows", type=int, default=4, help="packed rows (TRL: sequences) per step")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_sft"))
    args = ap.parse_args()
    data, model = args.out / "data", args.out / "model"
    synthetic.run(SynthConfig(output_dir=data, num_train=3000, num_test=10, overwrite=True))
    build_tiny(TinyConfig(output_dir=model, corpus=[data / "sft"], overwrite=True,
                          model=TinyModelConfig(max_position_embeddings=args.seq_len)))
    per_row = max(1, args.seq_len // 160)  # ~samples per packed row, for the padded baseline
    results = {
        "reasoner packed": reasoner_run(data, model, args.out / "packed", True, args.steps,
                                        args.seq_len, args.rows),
        "reasoner padded": reasoner_run(data, model, args.out / "padded", False, args.steps,
                                        args.seq_len, args.rows * per_row),
    }
    try:
        results["TRL SFTTrainer (bfd)"] = trl_run(data, model, args.out / "trl", args.steps,
                                                  args.seq_len, args.rows)
    except ImportError as exc:
        print(f"TRL not installed ({exc}); pip install 'reasoner[bench]' to compare")
    base = results["reasoner packed"]["tokens_per_s"]
    print("\n| run | tokens/s | vs reasoner packed | real tokens / slots |\n|---|---|---|---|")
    for name, r in results.items():
        eff = f"{r['efficiency']:.3f}" if r["efficiency"] is not None else "n/a"
        print(f"| {name} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base:.2f}x | {eff} |")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
