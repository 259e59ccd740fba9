"""What grading Monte Carlo rollouts with a reward model costs, per rollout, next to a rule-based verifier.

Usage::

    python benchmarks/reward_model_cost.py [--rollouts 64] [--repeats 2]

Prints a table and writes ``benchmarks/results/reward_model_cost.json``.

Rollout texts are GSM8K-style: a prompt from GSM8K-like problems plus a ~300-character solution (real GSM8K data
when ``../shared/data`` is present, a synthetic stand-in otherwise). Each is graded by
:class:`mcadvantage.rewards.models.RewardModelScorer` around randomly initialised sequence-classification Llamas
of two sizes (built offline; scoring cost depends on size, not on the weights) at two batch sizes, and by
:class:`mcadvantage.GSM8KVerifier` for reference. Reported: milliseconds per rollout (median of ``--repeats``),
and the ratio to the verifier, measured in one run on this machine (shared and noisy: compare ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from mcadvantage import GSM8KVerifier
from mcadvantage.rewards.models import RewardModelScorer
from mcadvantage.testing import build_char_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # name -> (hidden, layers, heads, intermediate)
    "llama-1M": (128, 4, 2, 512),
    "llama-9M": (384, 6, 6, 1024),
}


def rollout_texts(n: int) -> tuple[list[str], list[str], list[str]]:
    data = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
    rows = []
    if data.exists():
        with open(data, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        rows = [
            {
                "question": f"Tom has {i} apples and buys {i + 3} more. How many?",
                "answer": f"{i}+{i + 3}\n#### {2 * i + 3}",
            }
            for i in range(100)
        ]
    rows = (rows * (n // len(rows) + 1))[:n]
    prompts = [f"Question: {r['question']}\nAnswer:" for r in rows]
    completions = [" " + r["answer"] for r in rows]
    return prompts, completions, [r["answer"] for r in rows]


def tiny_reward_model(hidden: int, layers: int, heads: int, intermediate: int, vocab: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=2048,
        num_labels=1,
        pad_token_id=0,
    )
    return LlamaForSequenceClassification(config).eval()


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "reward_model_cost.json"))
    args = parser.parse_args()

    prompts, completions, answers = rollout_texts(args.rollouts)
    tok = build_char_tokenizer()
    rows = []
    verifier = GSM8KVerifier()
    base = timed(lambda: verifier(prompts=prompts, completions=completions, answer=answers), args.repeats)
    rows.append(
        {
            "grader": "GSM8KVerifier",
            "params": 0,
            "batch_size": None,
            "ms_per_rollout": 1e3 * base / len(prompts),
        }
    )
    for name, (hidden, layers, heads, inter) in SIZES.items():
        model = tiny_reward_model(hidden, layers, heads, inter, len(tok))
        params = sum(p.numel() for p in model.parameters())
        for batch_size in (8, 32):
            scorer = RewardModelScorer(model, tok, batch_size=batch_size)
            scorer(prompts=prompts[:batch_size], completions=completions[:batch_size])  # warm-up
            seconds = timed(lambda s=scorer: s(prompts=prompts, completions=completions), args.repeats)
            rows.append(
                {
                    "grader": f"RewardModelScorer({name})",
                    "params": params,
                    "batch_size": batch_size,
                    "ms_per_rollout": 1e3 * seconds / len(prompts),
                }
            )
    for row in rows:
        row["ratio_to_verifier"] = row["ms_per_rollout"] / rows[0]["ms_per_rollout"]

    chars = statistics.mean(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    print(
        f"{len(prompts)} rollouts, mean {chars:.0f} characters (= tokens, character tokenizer); torch threads {torch.get_num_threads()}"
    )
    print(f"{'grader':32} {'params':>11} {'batch':>6} {'ms/rollout':>11} {'x verifier':>11}")
    for row in rows:
        print(
            f"{row['grader']:32} {row['params']:>11,} {row['batch_size'] or '-':>6} {row['ms_per_rollout']:>11.3f} "
            f"{row['ratio_to_verifier']:>11.0f}"
        )
    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    result = {
        "machine": machine_info(),
        "rollouts": len(prompts),
        "mean_characters": chars,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
