"""How evenly train-offline's global batches load the data-parallel processes: the strided split
it used (every k-th sample) against the token-balanced one it uses (`packing.balanced_shares`),
simulated with the project's own packer; no model runs.

Cost model: a process's time for a step is the sum over its samples of T + T^2 / 100,000 for a
sample of T tokens (the attention term of Qwen2.5-32B: 6 x 64 layers x 5,120 hidden x T FLOPs per
token beside 6 x 32.8e9 for the rest, about 1e-5 per token; a process with fewer rows runs the
one-token dummy pass, which costs nothing). A step lasts as long as its slowest process (every
FSDP2 collective waits for it). The best split is not known (the problem is NP-hard): the
reference is the best one found, longest-cost-first then improved by swapping samples between
the slowest process and the others until no swap helps; every split's step time is given
against it, and against the bound max(total cost / processes, the costliest sample), which
indivisible samples rarely reach.

    python scripts/bench_balance.py          # 128 samples on 64 processes, 3 length mixes

Target (issue 40): the balanced split within 1.05 x of the best found (median over 200 steps).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from reasoner.data.packing import balanced_shares  # noqa: E402

MIXES = {"24K-51.2K": (24_000, 51_200), "12K-51.2K": (12_000, 51_200),
         "2K-51.2K": (2_000, 51_200)}


def cost(tokens: int) -> float:
    return tokens + tokens * tokens / 100_000


def step_time(shares: list[list[int]], lengths: list[int]) -> float:
    """The slowest process's time for its share."""
    return max(sum(cost(lengths[i]) for i in share) for share in shares)


def best_found(lengths: list[int], processes: int) -> float:
    """The step time of the best split found: longest cost first, then swaps (see the top)."""
    costs = [cost(t) for t in lengths]
    shares = balanced_shares(list(range(len(lengths))), [int(c) for c in costs], processes)
    loads = [sum(costs[i] for i in s) for s in shares]
    for _ in range(1000):
        worst = max(range(processes), key=loads.__getitem__)
        move = None
        for other in range(processes):
            for a in shares[worst]:
                for b in [*shares[other], None]:  # a swap, or a move of `a`
                    cb = costs[b] if b is not None else 0.0
                    after = max(loads[worst] - costs[a] + cb, loads[other] - cb + costs[a])
                    if other != worst and after < loads[worst] - 1e-9:
                        move = (other, a, b, cb)
                        break
                if move:
                    break
            if move:
                break
        if move is None:
            break
        other, a, b, cb = move
        shares[worst].remove(a)
        shares[other].append(a)
        if b is not None:
            shares[other].remove(b)
            shares[worst].append(b)
        loads[worst] += cb - costs[a]
        loads[other] += costs[a] - cb
    return max(loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench_balance.json")
    a = parser.parse_args()
    rng = random.Random(0)
    report = {}
    print(f"{'lengths':>10} {'strided / best':>15} {'balanced / best':>16} "
          f"{'best / bound':>13} {'max/mean tokens: strided':>25} {'balanced':>9}")
    for name, (lo, hi) in MIXES.items():
        ratios: dict[str, list[float]] = {"strided": [], "balanced": [], "best / bound": []}
        spread: dict[str, list[float]] = {"strided": [], "balanced": []}
        for _ in range(a.steps):
            lengths = [rng.randint(lo, hi) for _ in range(a.samples)]
            items = list(range(a.samples))
            splits = {"strided": [items[k::a.processes] for k in range(a.processes)],
                      "balanced": balanced_shares(items, lengths, a.processes)}
            bound = max(sum(cost(t) for t in lengths) / a.processes, max(map(cost, lengths)))
            best = best_found(lengths, a.processes)
            ratios["best / bound"].append(best / bound)
            for split, shares in splits.items():
                ratios[split].append(step_time(shares, lengths) / best)
                tokens = [sum(lengths[i] for i in s) for s in shares]
                spread[split].append(max(tokens) / statistics.mean(tokens))
        med = {k: statistics.median(v) for k, v in ratios.items()}
        sp = {k: statistics.median(v) for k, v in spread.items()}
        report[name] = {"step_over_best_found": med, "max_over_mean_tokens": sp}
        print(f"{name:>10} {med['strided']:>15.3f} {med['balanced']:>16.3f} "
              f"{med['best / bound']:>13.3f} {sp['strided']:>25.3f} {sp['balanced']:>9.3f}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
