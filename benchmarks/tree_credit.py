"""Tree credit, measured in the gradient: a prompt's group drawn as a tree, step credit from its own leaves.

    python benchmarks/tree_credit.py                  # toy, toy_low (seconds), then the demo policy (~10 min)
    python benchmarks/tree_credit.py --report --doc docs/gradient-quality.md

The idea (TreeRL / TreePO / TEMPO): instead of ``G`` independent responses, draw the group as a tree that branches
at fixed token depths, so its responses share prefixes by construction. Shared prefixes are generated once, which
makes the group cheaper than ``G`` independent responses. Every leaf is a training response, and the value of every
branch point is the mean outcome of the *other* leaves below it (leave-one-out), so each segment between branch
points gets step credit ``V(next branch point) - V(this one)`` with no extra rollouts. This is
:class:`~mcadvantage.estimators.VinePPOEstimator` with free samples (``reuse_samples=True``) on states cut at the
branch depths: a branch point with another leaf below needs no rollout (K = 1 counts that leaf); one without gets
a rollout, and its tokens are counted.

Every tree variant is scored with the gradient instrument (:mod:`mcadvantage.evaluation.gradient_quality`) against the same
reference as ``benchmarks/gradient_quality.py`` (exact on the toys; the stored demo reference), and compared with
that benchmark's GRPO budgets at equal cost. Writes ``benchmarks/results/tree_credit.json`` after every variant.
Experiment code: the trainer does not draw trees yet (its responses come from TRL's generation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "tree_credit.json"
GQ = RESULTS / "gradient_quality.json"

#: Variants per task: (label, branch factor per level, token depth where each level starts).
VARIANTS = {
    "toy": [
        ("tree_2x2x2_d0-1-2", [2, 2, 2], [0, 1, 2]),
        ("tree_4x2_d0-1", [4, 2], [0, 1]),
        ("tree_2x4_d0-1", [2, 4], [0, 1]),
    ],
    "demo": [
        ("tree_2x2x2_d0-8-16", [2, 2, 2], [0, 8, 16]),
        ("tree_4x2_d0-12", [4, 2], [0, 12]),
        ("tree_2x4_d0-6", [2, 4], [0, 6]),
    ],
}
VARIANTS["toy_low"] = VARIANTS["toy"]


class DepthSegmenter:
    """Steps cut at fixed character depths (the toys and the demo policy tokenise one character per token, so
    these are the tree's token depths)."""

    def __init__(self, depths: list[int]) -> None:
        self.depths = [d for d in depths if d > 0]

    def __call__(self, text: str) -> list[str]:
        cuts = [0, *[d for d in self.depths if d < len(text)], len(text)]
        return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a] or [text]


def _gradient_quality() -> Any:
    """``benchmarks/gradient_quality.py``, whose tasks, reference, GRPO records and tables this benchmark uses."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gradient_quality

    return gradient_quality


def sample_tree(
    task: Any, prompt: int, branching: list[int], depths: list[int]
) -> tuple[list[list[int]], int]:
    """The leaves (completion ids) of one prompt's tree and the tokens generated to draw it."""
    from mcadvantage.samplers.base import RolloutRequest

    prompt_ids = list(task.prompt_ids[prompt])
    open_nodes: list[list[int]] = [[]]
    leaves: list[list[int]] = []
    generated = 0
    for level, width in enumerate(branching):
        stop = depths[level + 1] if level + 1 < len(depths) else task.max_completion_length
        requests = [
            RolloutRequest(prefix_ids=tuple(prompt_ids + node), n=width, max_tokens=stop - len(node))
            for node in open_nodes
        ]
        grown: list[list[int]] = []
        for node, conts in zip(open_nodes, task.sampler.sample(requests), strict=True):
            for cont in conts:
                ids = node + list(cont.token_ids)
                generated += len(cont.token_ids)
                ended = not cont.truncated or len(ids) >= task.max_completion_length
                (leaves if ended or level + 1 == len(branching) else grown).append(ids)
        open_nodes = grown
    return leaves, generated


def tree_gradient(task: Any, prompts: list[int], branching: list[int], depths: list[int]) -> Any:
    """One batch gradient from trees over ``prompts``, as the trainer would compute it (whitened VinePPO credit with
    free samples, dapo loss at ratio 1)."""
    import torch

    from mcadvantage.core.advantages import masked_whiten
    from mcadvantage.estimators import AdvantageBatch, VinePPOEstimator
    from mcadvantage.evaluation.gradient_instrument import GradientEstimate, weighted_logprob_gradient

    start = time.perf_counter()
    prompt_ids, completion_ids, texts, rows, generated = [], [], [], [], 0
    for p in prompts:
        leaves, tokens = sample_tree(task, p, branching, depths)
        generated += tokens
        for ids in leaves:
            prompt_ids.append(list(task.prompt_ids[p]))
            completion_ids.append(ids)
            texts.append(task.prompts[p])
            rows.append(dict(task.rows[p]))
    rewards = task.grade(prompt_ids, completion_ids, texts, rows)
    width = max(len(c) for c in completion_ids)
    mask = torch.zeros((len(completion_ids), width), dtype=torch.long)
    for i, c in enumerate(completion_ids):
        mask[i, : len(c)] = 1
    batch = AdvantageBatch(
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        completion_mask=mask,
        rewards_per_func=rewards,
        reward_weights=torch.tensor(task.reward_weights, dtype=torch.float32),
        local_slice=slice(0, len(completion_ids)),
        group_size=1,  # leaves per prompt vary when a branch ends early; the credit needs no groups
        prompts=texts,
        rows=rows,
    )
    estimator = VinePPOEstimator(num_rollouts=1, reuse_samples=True, step_segmenter=DepthSegmenter(depths))
    result = estimator.estimate(batch, task.context())
    valid = result.token_mask.bool() & mask.bool()
    advantages = (
        masked_whiten(result.advantages.float() * valid, valid)
        if int(valid.sum()) >= 2
        else torch.zeros(mask.shape)
    )
    gradient = weighted_logprob_gradient(
        task.oracle, prompt_ids, completion_ids, advantages * mask / int(mask.sum())
    )
    rollout_tokens = int(result.metrics.get("generated_tokens", 0) or 0)
    return GradientEstimate(
        gradient=gradient,
        sampled_tokens=generated + rollout_tokens,
        trained_tokens=int(mask.sum()),
        seconds=time.perf_counter() - start,
    )


def run(task_name: str, args: argparse.Namespace, data: dict[str, Any]) -> None:
    import torch

    from mcadvantage.evaluation.cost_model import cost_model_tokens
    from mcadvantage.evaluation.gradient_instrument import ReferenceGradient, gradient_metrics
    from mcadvantage.evaluation.gradient_quality import batch_prompts

    gq = _gradient_quality()

    stored = json.loads(GQ.read_text(encoding="utf-8"))
    ratio = stored["cost_ratio"]["cost_ratio"]
    if task_name.startswith("toy"):
        rates = [0.05, 0.3, 0.6, 0.9] if task_name == "toy" else [0.0, 0.05, 0.15, 0.4]
        task, reference, _ = gq.toy_task(rates, args.seed)
        repeats = args.toy_repeats
    else:
        task, _, _ = gq.demo_task(64, args.seed, args.threads)
        saved = torch.load(RESULTS / "gradient_quality_demo_reference.pt", weights_only=True)
        ref = stored["tasks"]["demo"]["reference"]
        reference = ReferenceGradient(
            saved["gradient"],
            saved["standard_error"],
            ref["split_half_cosine"],
            ref["responses"],
            ref["rounds"],
        )
        repeats = args.demo_repeats
    records = data["tasks"].setdefault(task_name, [])
    done = {r["estimator"] for r in records}
    for (label, branching, depths), prompts in [(v, p) for p in (4, 6) for v in VARIANTS[task_name]]:
        name = f"{label}_p{prompts}"
        if name in done:
            continue
        runs = [
            tree_gradient(task, batch_prompts(len(task.prompt_ids), prompts, r, args.seed), branching, depths)
            for r in range(repeats)
        ]
        sampled = sum(r.sampled_tokens for r in runs) / len(runs)
        trained = sum(r.trained_tokens for r in runs) / len(runs)
        record = {
            "estimator": name,
            "prompts_per_batch": prompts,
            "group_size": int(torch.tensor(branching).prod()),
            **gradient_metrics([r.gradient for r in runs], reference, seed=args.seed),
            "sampled_tokens": sampled,
            "trained_tokens": trained,
            "cost_ratio": ratio,
            "cost_model": cost_model_tokens(sampled, trained, ratio),
        }
        records.append(record)
        OUT.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(
            f"{task_name}: {name}: cosine {record['cosine']:.3f} {record['cosine_ci']} tokens {sampled:.0f}",
            flush=True,
        )


def report(data: dict[str, Any]) -> str:
    from mcadvantage.evaluation.gradient_quality import markdown_table

    gq = _gradient_quality()

    stored = json.loads(GQ.read_text(encoding="utf-8"))
    parts = []
    for task_name, records in data["tasks"].items():
        grpo = [
            r
            for r in stored["tasks"].get(task_name, {}).get("records", [])
            if r["estimator"].startswith("grpo_p")
        ]
        if not records or not grpo:
            continue
        parts.append(f"### {task_name}: trees\n\n{markdown_table(records)}\n")
        for ratio in (stored["cost_ratio"]["cost_ratio"], gq.GPU_COST_RATIO):
            parts.append(gq.equal_cost_markdown(records + grpo, ratio, "tree"))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tasks", nargs="+", default=["toy", "toy_low", "demo"], choices=["toy", "toy_low", "demo"]
    )
    parser.add_argument("--toy_repeats", type=int, default=200)
    parser.add_argument("--demo_repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--doc", default=None)
    args = parser.parse_args(argv)
    data = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {"tasks": {}}
    if not args.report:
        for name in args.tasks:
            run(name, args, data)
    _gradient_quality().publish(report(data), args.doc, "tree_credit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
