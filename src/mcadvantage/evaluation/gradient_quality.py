"""Gradient quality per unit of cost: many advantage estimators, each at several budgets, measured on one fixed
policy and prompt set, and compared at equal cost; what ``benchmarks/gradient_quality.py`` and
``python -m mcadvantage.evaluation.gradient_quality`` run.

- :class:`EstimatorSpec` / :func:`parse_estimator_spec`: one estimator at one budget (``"vineppo:k=4,prompts=4"``);
- :func:`measure_estimators`: every spec's repeated batch gradients scored against the reference, with its cost
  (common random numbers: every estimator sees the same prompts, :func:`batch_prompts`);
- :func:`at_equal_cost`: the baseline's (GRPO's) cosine at each record's cost;
- :func:`markdown_table`, :func:`plot_records` and :func:`main` (the command line, on *your* policy and data).

What is measured, and how (the reference gradient, an estimator's batch gradient exactly as the trainer computes
it, the quality metrics): :mod:`mcadvantage.evaluation.gradient_instrument`. The cost model (``generated + r *
trained`` tokens, and measuring ``r``): :mod:`mcadvantage.evaluation.cost_model`.

Why this module is long: the instrument's user-facing side is one piece, the spec grammar (one builder per
estimator), the measurement loop over specs, the equal-cost comparison and the command line that ties them, each
function short; splitting it would scatter one command's parts over modules that nothing else imports.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcadvantage.evaluation.cost_model import cost_model_tokens, measure_cost_ratio
from mcadvantage.evaluation.gradient_instrument import (
    CausalLMOracle,
    GradientTask,
    ReferenceGradient,
    estimator_gradient,
    gradient_metrics,
    reference_gradient,
)

__all__ = [
    "EstimatorSpec",
    "at_equal_cost",
    "log_cost_interpolate",
    "batch_prompts",
    "main",
    "markdown_table",
    "measure_estimators",
    "parse_estimator_spec",
    "plot_records",
]


@dataclass
class EstimatorSpec:
    """One estimator at one budget.

    Attributes:
        name: the row's label (e.g. ``"vineppo_k4"``, ``"grpo_p16"``).
        estimator: an advantage estimator (``estimate(batch, context)``).
        prompts_per_batch: prompts per batch gradient.
        group_size: responses per prompt.
        warmup_batches: batches the estimator sees before it is measured (a learned critic trains on them, as in
            the first steps of a PPO run); 0 for estimators without state.
        whiten: whiten the advantages (None: the estimator's default, as the trainer's ``whiten_advantages=None``).
    """

    name: str
    estimator: Any
    prompts_per_batch: int
    group_size: int
    warmup_batches: int = 0
    whiten: bool | None = None


def parse_estimator_spec(spec: str, *, segmenter: Any, prompts: int = 4, group: int = 8) -> EstimatorSpec:
    """``"name[:key=value,...]"`` -> :class:`EstimatorSpec`. Names: ``grpo``, ``rloo``, ``vineppo``. Keys: ``k``
    (``num_mc_rollouts``), ``reuse`` (free samples), ``variance`` (variance allocation), ``min`` (its first wave),
    ``prompts`` (per batch), ``group`` (responses per prompt), ``nowhiten`` (skip the whitening the trainer would
    apply), ``label``; for ``gae`` (PPO's learned critic, a copy
    of the policy with a scalar head, trained as the ``ppo`` learning-efficiency arm trains it) also ``lr`` (the
    critic's learning rate, default 1e-4) and ``warmup`` (batches it trains on before it is measured, default 40).
    ``hybrid`` takes ``budget`` (extra sampled tokens as a fraction of the responses', default 0.1) and ``k``.
    ``tree`` (groups drawn as trees) takes ``branching`` (children per level, ``"4x2"``) and ``depths`` (token depths
    where the levels branch, ``"0-12"``; default: spread over the first half of the response budget).
    E.g. ``"vineppo:k=1,reuse"``, ``"grpo:prompts=16"``, ``"gae:warmup=40"``, ``"hybrid:budget=0.25"``,
    ``"tree:branching=4x2,depths=0-12"``."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, _, value = part.partition("=")
        options[key.strip()] = value.strip() or "1"
    if set(options) - _SPEC_OPTIONS:
        raise ValueError(
            f"estimator spec {spec!r}: unknown option(s) {sorted(set(options) - _SPEC_OPTIONS)}; "
            f"use {sorted(_SPEC_OPTIONS)}."
        )
    build = _SPEC_BUILDERS.get(name.strip().lower())
    if build is None:
        raise ValueError(
            f"estimator spec {spec!r}: unknown estimator {name!r}; use grpo, rloo, vineppo, hybrid, tree or gae."
        )
    p, g = int(options.get("prompts", prompts)), int(options.get("group", group))
    return build(options, segmenter, p, g)


#: The options an estimator spec may give (:func:`parse_estimator_spec`).
_SPEC_OPTIONS = frozenset(
    {"k", "reuse", "variance", "min", "prompts", "group", "label", "lr", "warmup", "nowhiten", "budget", "branching",
     "depths"}
)  # fmt: skip


def _spec(options: dict[str, str], estimator: Any, label: str, p: int, g: int) -> EstimatorSpec:
    """The spec of a sampled-credit estimator: ``label`` unless the options name it, whitened unless ``nowhiten``."""
    return EstimatorSpec(
        name=options.get("label", label),
        estimator=estimator,
        prompts_per_batch=p,
        group_size=g,
        whiten=False if "nowhiten" in options else None,
    )


def _grpo_spec(options: dict[str, str], segmenter: Any, p: int, g: int) -> EstimatorSpec:
    from mcadvantage.estimators import GRPOEstimator

    return _spec(options, GRPOEstimator(), f"grpo_p{p}", p, g)


def _rloo_spec(options: dict[str, str], segmenter: Any, p: int, g: int) -> EstimatorSpec:
    from mcadvantage.estimators import RLOOEstimator

    return _spec(options, RLOOEstimator(), f"rloo_p{p}", p, g)


def _vineppo_spec(options: dict[str, str], segmenter: Any, p: int, g: int) -> EstimatorSpec:
    from mcadvantage.estimators import VinePPOEstimator

    k = int(options.get("k", 4))
    allocation = "variance" if "variance" in options else "uniform"
    estimator = VinePPOEstimator(
        num_rollouts=k,
        reuse_samples="reuse" in options,
        allocation=allocation,
        min_rollouts=int(options.get("min", 1)),
        step_segmenter=segmenter,
    )
    label = (
        f"vineppo_k{k}"
        + ("_reuse" if "reuse" in options else "")
        + ("_variance" if allocation == "variance" else "")
        + ("_nowhiten" if "nowhiten" in options else "")
        + f"_p{p}"
    )
    return _spec(options, estimator, label, p, g)


def _hybrid_spec(options: dict[str, str], segmenter: Any, p: int, g: int) -> EstimatorSpec:
    from mcadvantage.estimators import HybridEstimator

    budget = float(options.get("budget", 0.1))
    estimator = HybridEstimator(
        budget=budget, num_rollouts=int(options.get("k", 4)), step_segmenter=segmenter
    )
    return _spec(
        options, estimator, f"hybrid_b{budget:g}_k{estimator.monte_carlo.settings.num_rollouts}_p{p}", p, g
    )


def _tree_spec(options: dict[str, str], segmenter: Any, p: int, g: int) -> EstimatorSpec:
    from mcadvantage.estimators import TreeEstimator

    branching = [int(b) for b in options.get("branching", "4x2").split("x")]
    depths = [int(d) for d in options["depths"].split("-")] if "depths" in options else None
    label = (
        f"tree_{'x'.join(map(str, branching))}"
        + (f"_d{'-'.join(map(str, depths))}" if depths else "")
        + ("_nowhiten" if "nowhiten" in options else "")
        + f"_p{p}"
    )
    # a tree's leaves are its group
    return _spec(options, TreeEstimator(branching=branching, depths=depths), label, p, math.prod(branching))


def _gae_spec(options: dict[str, str], segmenter: Any, p: int, g: int) -> EstimatorSpec:
    from mcadvantage.estimators import CriticEstimator

    warmup = int(options.get("warmup", 40))
    estimator = CriticEstimator(
        learning_rate=float(options.get("lr", 1e-4)), minibatch_size=p * g, step_segmenter=segmenter
    )
    return EstimatorSpec(
        name=options.get("label", f"gae_w{warmup}_p{p}"),
        estimator=estimator,
        prompts_per_batch=p,
        group_size=g,
        warmup_batches=warmup,
    )


#: Each estimator name of a spec and what builds its :class:`EstimatorSpec` from the options.
_SPEC_BUILDERS = {
    "grpo": _grpo_spec,
    "rloo": _rloo_spec,
    "vineppo": _vineppo_spec,
    "hybrid": _hybrid_spec,
    "tree": _tree_spec,
    "gae": _gae_spec,
}


def batch_prompts(num_prompts: int, per_batch: int, repeat: int, seed: int) -> list[int]:
    """The prompts of repeat ``repeat``: a seeded draw without replacement, the same for every estimator (common
    random numbers, so estimators are compared on the same prompts)."""
    rng = random.Random(seed * 1_000_003 + repeat)
    order = list(range(num_prompts))
    rng.shuffle(order)
    return [order[i % num_prompts] for i in range(per_batch)]


def measure_estimators(
    task: GradientTask,
    specs: Sequence[EstimatorSpec],
    reference: ReferenceGradient | torch.Tensor,
    *,
    repeats: int,
    cost_ratio: float,
    epochs: int = 1,
    seed: int = 0,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every spec's batch gradients (``repeats`` each) scored against ``reference``; one record per spec with its
    quality (:func:`gradient_metrics`) and mean cost per batch (sampled tokens, trained tokens, the cost model at
    ``cost_ratio``). ``on_record`` is called after each spec (e.g. to save results incrementally)."""
    records = []
    for spec in specs:
        for w in range(spec.warmup_batches):  # prompts drawn apart from the measured repeats' (another seed)
            batch = task.sample_group(
                batch_prompts(len(task.prompt_ids), spec.prompts_per_batch, w, seed + 7_777), spec.group_size
            )
            spec.estimator.estimate(batch, task.context())
        iterator: Any = range(repeats)
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(iterator, desc=spec.name, unit="batch")
        runs = [
            estimator_gradient(
                task,
                spec.estimator,
                batch_prompts(len(task.prompt_ids), spec.prompts_per_batch, r, seed),
                spec.group_size,
                whiten=spec.whiten,
            )
            for r in iterator
        ]
        sampled = sum(r.sampled_tokens for r in runs) / len(runs)
        trained = sum(r.trained_tokens for r in runs) / len(runs)
        record = {
            "estimator": spec.name,
            "prompts_per_batch": spec.prompts_per_batch,
            "group_size": spec.group_size,
            **gradient_metrics([r.gradient for r in runs], reference, seed=seed),
            "sampled_tokens": sampled,
            "trained_tokens": trained,
            "cost_ratio": cost_ratio,
            "cost_model": cost_model_tokens(sampled, trained, cost_ratio, epochs=epochs),
            "seconds_per_batch": sum(r.seconds for r in runs) / len(runs),
        }
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records


def log_cost_interpolate(cost: float, points: Sequence[tuple[float, float]]) -> float | None:
    """The value at ``cost`` of the piecewise-linear curve through ``(cost, value)`` ``points`` in log cost; None
    outside their range (no extrapolation)."""
    base = sorted(points)
    for (c0, v0), (c1, v1) in zip(base, base[1:], strict=False):
        if c0 <= cost <= c1:
            w = 0.0 if c1 == c0 else (math.log(cost) - math.log(c0)) / (math.log(c1) - math.log(c0))
            return v0 + w * (v1 - v0)
    return next((v for c, v in base if math.isclose(cost, c)), None)


def at_equal_cost(
    records: Sequence[dict[str, Any]], baseline_prefix: str = "grpo_p", cost_key: str = "cost_model"
) -> list[dict[str, Any]]:
    """Per record, the baseline's cosine at the same cost: linear interpolation of the baseline's budgets (e.g. GRPO
    at several prompts per batch) in log cost; None outside the baseline's measured range (no extrapolation)."""
    base = [(r[cost_key], r["cosine"]) for r in records if r["estimator"].startswith(baseline_prefix)]
    out = []
    for r in records:
        cost, value = r[cost_key], log_cost_interpolate(r[cost_key], base)
        out.append(
            {
                "estimator": r["estimator"],
                "cost": cost,
                "cosine": r["cosine"],
                "baseline_cosine_at_cost": value,
            }
        )
    return out


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """The records as a markdown table, cheapest first."""
    lines = [
        "| estimator | prompts x group | sampled tokens / batch | cost model (r) | cosine [95% CI] | rel. sq. error "
        "[95% CI] | sign agreement | mean cosine | bias ratio | repeats |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(records, key=lambda r: r["cost_model"]):
        lines.append(
            f"| {r['estimator']} | {r['prompts_per_batch']} x {r['group_size']} | {r['sampled_tokens']:,.0f} | "
            f"{r['cost_model']:,.0f} ({r['cost_ratio']:.2g}) | {r['cosine']:.3f} [{r['cosine_ci'][0]:.3f}, "
            f"{r['cosine_ci'][1]:.3f}] | {r['rel_sq_error']:.2f} [{r['rel_sq_error_ci'][0]:.2f}, "
            f"{r['rel_sq_error_ci'][1]:.2f}] | {r['sign_agreement']:.3f} | {r['mean_cosine']:.3f} | "
            f"{r['bias_ratio']:.2f} | {r['repeats']} |"
        )
    return "\n".join(lines)


def plot_records(records: Sequence[dict[str, Any]], path: str, *, title: str = "") -> None:
    """Cosine to the reference (with its interval) against the cost model, one series per estimator family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    families: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        families.setdefault(r["estimator"].rsplit("_p", 1)[0], []).append(r)
    for family, rows in sorted(families.items()):
        rows = sorted(rows, key=lambda r: r["cost_model"])
        xs = [r["cost_model"] for r in rows]
        ys = [r["cosine"] for r in rows]
        err = [
            [y - r["cosine_ci"][0] for y, r in zip(ys, rows, strict=True)],
            [r["cosine_ci"][1] - y for y, r in zip(ys, rows, strict=True)],
        ]
        ax.errorbar(
            xs, ys, yerr=err, marker="o", capsize=3, label=family, linestyle="-" if len(rows) > 1 else "none"
        )
    ax.set_xscale("log")
    ax.set_xlabel(
        f"cost per batch: generated + r x trained tokens (r = {records[0]['cost_ratio']:.2g})"
        if records
        else "cost"
    )
    ax.set_ylabel("cosine to the reference gradient")
    ax.set_title(title or "Gradient quality per unit of cost")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> Any:
    """The command line of :func:`main`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mcadvantage.evaluation.gradient_quality", description=main.__doc__
    )
    parser.add_argument(
        "--model", required=True, help="a causal LM directory or id (loaded offline if cached)"
    )
    parser.add_argument(
        "--dataset",
        required=True,
        help="a .jsonl/.json file with a 'prompt' column and the verifier's column",
    )
    parser.add_argument(
        "--verifier",
        default="gsm8k",
        help="gsm8k or math (mcadvantage.get_verifier), or module:attribute of your own TRL-style reward function",
    )
    parser.add_argument("--segmenter", default=None, help="step segmenter (default: the verifier's task)")
    parser.add_argument("--prompts", type=int, default=32, help="size of the fixed prompt set (first N rows)")
    parser.add_argument("--max_completion_length", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument(
        "--estimators",
        nargs="+",
        default=[
            "grpo:prompts=4",
            "grpo:prompts=8",
            "grpo:prompts=16",
            "rloo:prompts=4",
            "vineppo:k=1,reuse,prompts=4",
            "vineppo:k=4,prompts=4",
        ],
        help="estimator specs name[:k=..,reuse,variance,prompts=..,group=..]",
    )
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (default for every spec)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--reference_rounds", type=int, default=8)
    parser.add_argument("--reference_group", type=int, default=8)
    parser.add_argument(
        "--cost_ratio", default="measure", help="r: a trained token's cost in generated tokens, or 'measure'"
    )
    parser.add_argument(
        "--epochs", type=int, default=1, help="PPO epochs per batch (num_iterations) in the cost model"
    )
    parser.add_argument(
        "--parameters", default=None, help="only parameters whose name contains this (large models)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default="gradient_quality_output")
    return parser


def _read_rows(path: Any, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows of a JSON Lines or JSON file, each with a ``prompt``."""
    import json

    text = path.read_text(encoding="utf-8")
    rows = (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else json.loads(text)
    )[:n]
    if not rows or "prompt" not in rows[0]:
        raise SystemExit(
            f"--dataset {path}: needs rows with a 'prompt' column (got {list(rows[0]) if rows else 'no rows'})."
        )
    return rows


def _reward_and_segmenter(verifier_name: str, segmenter_name: str | None) -> tuple[Any, Any]:
    """``--verifier`` (a task's verifier, or ``module:attribute`` of a reward function) and the step segmenter."""
    from mcadvantage.tasks.segmentation import get_segmenter
    from mcadvantage.tasks.verifier import get_verifier

    if ":" in verifier_name:
        import importlib

        module, _, attribute = verifier_name.partition(":")
        verifier = getattr(importlib.import_module(module), attribute)
        if segmenter_name is None:
            raise SystemExit("--verifier module:attribute needs --segmenter (gsm8k, math or newline).")
    else:
        verifier = get_verifier(verifier_name)
    return verifier, get_segmenter(segmenter_name or verifier_name)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mcadvantage.evaluation.gradient_quality --model PATH --dataset FILE.jsonl --verifier gsm8k``: gradient
    quality per unit of cost of each estimator on *your* policy and data; writes a JSON, a markdown table and a plot
    under ``--output_dir``."""
    from pathlib import Path

    args = _parser().parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage.samplers import TransformersSampler

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    path = Path(args.dataset)
    rows = _read_rows(path, args.prompts)
    verifier, segmenter = _reward_and_segmenter(args.verifier, args.segmenter)
    sampler = TransformersSampler(model, tokenizer, temperature=args.temperature, top_p=args.top_p)
    oracle = CausalLMOracle(
        model, parameter_filter=(lambda n: args.parameters in n) if args.parameters else None
    )
    task = GradientTask(
        oracle=oracle,
        sampler=sampler,
        prompt_ids=[tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows],
        prompts=[r["prompt"] for r in rows],
        rows=[{k: v for k, v in r.items() if k != "prompt"} for r in rows],
        reward_funcs=[verifier],
        tokenizer=tokenizer,
        segmenter=segmenter,
        max_completion_length=args.max_completion_length,
    )
    ratio = (
        measure_cost_ratio(model)["cost_ratio"] if args.cost_ratio == "measure" else float(args.cost_ratio)
    )
    specs = [parse_estimator_spec(s, segmenter=segmenter, group=args.group) for s in args.estimators]
    reference = reference_gradient(
        task, responses_per_round=args.reference_group, rounds=args.reference_rounds, progress=True
    )
    records = measure_estimators(
        task, specs, reference, repeats=args.repeats, cost_ratio=ratio, epochs=args.epochs, seed=args.seed
    )
    result = {
        "model": args.model,
        "dataset": str(path),
        "prompts": len(rows),
        "cost_ratio": ratio,
        "reference": {
            "responses": reference.responses,
            "rounds": reference.rounds,
            "split_half_cosine": reference.split_half_cosine,
            "relative_standard_error": reference.relative_standard_error,
        },
        "records": records,
        "at_equal_cost": at_equal_cost(records),
    }
    _write_outputs(Path(args.output_dir), result, args.model)
    return 0


def _write_outputs(out: Any, result: dict[str, Any], model: str) -> None:
    """The JSON, the markdown table and the plot under ``out``, and the table and the best estimator printed."""
    import json

    records, ratio = result["records"], result["cost_ratio"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradient_quality.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    table = markdown_table(records)
    (out / "gradient_quality.md").write_text(table + "\n", encoding="utf-8")
    plot_records(
        records, str(out / "gradient_quality.png"), title=f"{model}: gradient quality per unit of cost"
    )
    print(table)
    best = max(records, key=lambda r: r["cosine"] / max(r["cost_model"], 1.0))
    print(
        f"\nAt r = {ratio:.2g}: best cosine per unit of cost: {best['estimator']} ({best['cosine']:.3f} at {best['cost_model']:,.0f})."
    )
    print(
        f"Wrote {out / 'gradient_quality.json'}, {out / 'gradient_quality.md'}, {out / 'gradient_quality.png'}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
