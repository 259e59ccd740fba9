"""Cheaper Monte Carlo: value error against Monte Carlo tokens, for the fixed scheme and each cheaper option.

    python benchmarks/mc_efficiency.py                  # both tasks: the exact toy, then the demo policy
    python benchmarks/mc_efficiency.py --tasks toy      # seconds
    python benchmarks/mc_efficiency.py --report         # only rebuild the table, JSON and plot

Tasks:

* ``toy``: :class:`~mcadvantage.testing.StepTreeSampler`, 6 one-token steps (a/b/c with probabilities
  0.5/0.3/0.2) then success with probability ``P[sum of step indexes % 4]``, ``P = (0.1, 0.4, 0.7, 0.95)``;
  groups of 8 responses drawn from the toy itself. Ground truth is exact.
* ``toy_long``: the same toy with 12 steps per response (twice the states and rollout lengths).
* ``demo``: the shipped demo warm-up policy on held-out demo problems, groups of 8 responses at the RL
  temperature (0.6), ``gsm8k`` steps, the GSM8K verifier. Ground truth: ``--ground_truth_k`` rollouts per state
  (its own variance, ``p(1-p)/K``, is reported and not subtracted).

Options (each swept over K, the per-state budget): ``fixed`` (the paper's scheme, K fresh rollouts per state),
``reuse`` (free samples, leave-one-out, topped up to K), ``variance`` (free samples plus variance allocation of
the tokens fixed K would spend), and ``reuse+merge`` (free samples on steps merged to >= ``--min_step_tokens``
tokens: fewer, coarser states, so its errors are over other steps and are not compared at equal error).

Per point: value MSE over every (response, state) pair, advantage sign accuracy over steps whose true
advantage exceeds 0.05 in size, Spearman rank correlation of step advantages, Monte Carlo tokens per response.
Per family: the tokens it needs to reach fixed K=9's value MSE (log-log interpolation between the sweep's points),
as a ratio to K=9's tokens, against the simulated K=9 point and against K=9's expected MSE
(``expected_fixed_target``: ``mean v(1-v)/9`` plus the ground truth's variance, no repeat noise of its own). Every
(task, option, K, repeat) is appended to ``benchmarks/results/mc_efficiency_runs/<task>.jsonl`` as it finishes,
and a rerun skips what is there; the demo's responses and ground truth are cached there too. Writes ``benchmarks/results/mc_efficiency.json`` and
``mc_efficiency.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = RESULTS / "mc_efficiency_runs"

#: family -> (MCValueEstimator options, Ks swept)
FAMILIES: dict[str, tuple[dict[str, Any], list[int]]] = {
    "fixed": ({}, [1, 3, 4, 9]),  # K=4: the learning-efficiency arms' K
    "reuse": ({"reuse_samples": True}, [1, 2, 3, 6, 9]),
    "variance": ({"reuse_samples": True, "allocation": "variance"}, [1, 2, 3, 6, 9]),
    "reuse+merge": (
        {"reuse_samples": True, "min_step_tokens": None},
        [1, 3, 9],
    ),  # min_step_tokens set per task
}
SIGN_TOLERANCE = 0.05
TOY_P = (0.1, 0.4, 0.7, 0.95)
TASK_ORDER = ("toy", "toy_long", "demo")


# ------------------------------------------------------------------------------------------------ statistics


# Rank correlation by hand: scipy is not a dependency of the project, and these 20 lines are all it would give.
def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their average rank
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (Pearson on average ranks); NaN when either side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(math.fsum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(math.fsum((b - my) ** 2 for b in ry))
    return sxy / (sx * sy) if sx and sy else math.nan


def score(
    estimate: Any, boundaries: list[list[int]], trajectories: list[Any], truth: dict[tuple[int, int], float]
) -> dict[str, float]:
    """Value MSE, sign accuracy and rank correlation of one estimate (whose states sit at ``boundaries``) against
    ``truth[(trajectory, prefix length)]``."""
    sq, est_adv, true_adv = [], [], []
    for t, traj in enumerate(trajectories):
        bounds = boundaries[t]
        values = estimate.values[t]
        true_values = [truth[(t, b)] for b in bounds[:-1]] + [float(traj.reward)]
        sq += [(v - tv) ** 2 for v, tv in zip(values[:-1], true_values[:-1], strict=True)]
        est_adv += [values[i] - values[i - 1] for i in range(1, len(values))]
        true_adv += [true_values[i] - true_values[i - 1] for i in range(1, len(true_values))]
    decided = [(e, t) for e, t in zip(est_adv, true_adv, strict=True) if abs(t) > SIGN_TOLERANCE]
    return {
        "value_mse": statistics.fmean(sq),
        "sign_accuracy": statistics.fmean((e > 0) == (t > 0) for e, t in decided) if decided else math.nan,
        "rank_correlation": spearman(est_adv, true_adv),
        "states_per_response": len(sq) / len(trajectories),
    }


# ------------------------------------------------------------------------------------------------ tasks


def toy_value(taken: tuple[int, ...], depth: int, probs: list[float]) -> float:
    """The toy's exact success probability after the step indexes ``taken``: success is ``TOY_P[sum of all step
    indexes % 4]``, so only the distribution of the remaining steps' sum mod 4 matters."""
    dist = [1.0, 0.0, 0.0, 0.0]
    for _ in range(depth - len(taken)):
        dist = [sum(dist[(m - i) % 4] * p for i, p in enumerate(probs)) for m in range(4)]
    return sum(w * TOY_P[(sum(taken) + m) % 4] for m, w in enumerate(dist))


def toy_task(groups: int, seed: int, depth: int = 6) -> dict[str, Any]:
    from mcadvantage.mc.estimator import Trajectory
    from mcadvantage.samplers.base import RolloutRequest
    from mcadvantage.testing import OutcomeReward, StepTreeSampler, build_char_tokenizer

    tok = build_char_tokenizer()

    def tid(ch: str) -> int:
        return tok(ch, add_special_tokens=False)["input_ids"][0]

    def sampler(s: int) -> StepTreeSampler:
        return StepTreeSampler(
            step_token_ids=[tid(c) for c in "abc"],
            step_probs=[0.5, 0.3, 0.2],
            depth=depth,
            success_prob=lambda steps: TOY_P[sum(steps) % 4],
            success_token_id=tid("Y"),
            failure_token_id=tid("N"),
            eos_token_id=tok.eos_token_id,
            seed=s,
        )

    source = sampler(seed)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    trajectories = []
    for g in range(groups):
        prompt = f"{letters[g // 26 % 26]}{letters[g % 26]}:"
        pid = tok(prompt, add_special_tokens=False)["input_ids"]
        for cont in source.sample([RolloutRequest(prefix_ids=tuple(pid), n=8, max_tokens=64)])[0]:
            ids = list(cont.token_ids)
            trajectories.append(
                Trajectory(
                    prompt_ids=pid,
                    completion_ids=ids,
                    step_boundaries=[*range(depth + 1), len(ids)],
                    reward=1.0 if ids[-2] == tid("Y") else 0.0,
                    prompt=prompt,
                )
            )
    # Exact values by dynamic programming over the remaining steps' index sum mod 4 (StepTreeSampler.value enumerates
    # every future, 3^12 of them per state at 12 steps); the two agree on the 6-step toy (tests/benchmarks/test_mc_efficiency.py).
    truth = {
        (t, b): toy_value(source.steps_of(traj.prompt_ids + traj.completion_ids[:b]), depth, [0.5, 0.3, 0.2])
        for t, traj in enumerate(trajectories)
        for b in traj.step_boundaries[:-1]
    }
    return {
        "trajectories": trajectories,
        "truth": truth,
        "make_sampler": sampler,
        "tokenizer": tok,
        "reward": OutcomeReward("Y"),
        "max_completion_length": depth + 10,
        "min_step_tokens": 2,
        "description": f"StepTreeSampler, {depth} steps, {groups} groups of 8 (exact values)",
        "truth_variance": 0.0,
        "value_variance": statistics.fmean(v * (1 - v) for v in truth.values()),
    }


def demo_task(
    prompts: int, ground_truth_k: int, seed: int, threads: int, runs: Path = RUNS
) -> dict[str, Any]:
    import torch

    from mcadvantage import GSM8KVerifier, MCValueEstimator, TransformersSampler
    from mcadvantage.core.text import decode_batch
    from mcadvantage.demo.arms import load_policy
    from mcadvantage.demo.config import DemoConfig, build_data, shipped_warmup_dir
    from mcadvantage.mc.estimator import Trajectory
    from mcadvantage.samplers.base import RolloutRequest
    from mcadvantage.tasks.segmentation import get_segmenter, segment_completion
    from mcadvantage.trainer.self_training import grade_completions

    torch.set_num_threads(threads)
    config = DemoConfig()
    model, tok = load_policy(str(shipped_warmup_dir()))
    model.eval()
    verifier = GSM8KVerifier()
    segmenter = get_segmenter("gsm8k")

    def sampler(s: int) -> Any:
        torch.manual_seed(s)
        return TransformersSampler(model, tok, temperature=config.temperature, max_batch_sequences=1024)

    cache = runs / f"demo_ground_truth_p{prompts}_k{ground_truth_k}_s{seed}.json"
    problems = build_data(config).eval_set[:prompts]
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in problems]
    if cache.exists():
        stored = json.loads(cache.read_text(encoding="utf-8"))
        responses, truth_items = stored["responses"], stored["truth"]
    else:
        engine = sampler(seed)
        responses = []
        for row in rows:
            pid = tok(row["prompt"], add_special_tokens=False)["input_ids"]
            request = RolloutRequest(prefix_ids=tuple(pid), n=8, max_tokens=config.max_completion_length)
            conts = engine.sample([request])[0]
            texts = decode_batch(tok, [list(c.token_ids) for c in conts])
            rewards = grade_completions(verifier, row["prompt"], texts, {"answer": row["answer"]})
            for cont, reward in zip(conts, rewards, strict=True):
                responses.append(
                    {"row": row, "prompt_ids": pid, "ids": list(cont.token_ids), "reward": reward}
                )
        trajectories = _demo_trajectories(responses, tok, segmenter, Trajectory, segment_completion)
        t0 = time.perf_counter()
        gt = MCValueEstimator(
            sampler(seed + 1),
            verifier,
            tok,
            num_rollouts=ground_truth_k,
            max_completion_length=config.max_completion_length,
            show_progress=True,
        ).estimate(trajectories)
        truth_items = [
            [t, b, v]
            for t, traj in enumerate(trajectories)
            for b, v in zip(traj.step_boundaries[:-1], gt.values[t][:-1], strict=True)
        ]
        cache.write_text(
            json.dumps(
                {"responses": responses, "truth": truth_items, "seconds": time.perf_counter() - t0},
                indent=None,
            ),
            encoding="utf-8",
        )
    trajectories = _demo_trajectories(responses, tok, segmenter, Trajectory, segment_completion)
    truth = {(t, b): v for t, b, v in truth_items}
    variances = [v * (1 - v) / ground_truth_k for v in truth.values()]
    return {
        "trajectories": trajectories,
        "truth": truth,
        "make_sampler": sampler,
        "tokenizer": tok,
        "reward": verifier,
        "max_completion_length": config.max_completion_length,
        "min_step_tokens": 24,
        "description": f"demo warm-up policy (seed 0), {prompts} held-out prompts x 8 responses, "
        f"ground truth K={ground_truth_k}",
        "truth_variance": statistics.fmean(variances),
        # Unbiased for the mean of v (1 - v) over the states: t (1 - t) x K / (K - 1) for a mean t of K Bernoullis.
        "value_variance": statistics.fmean(v * (1 - v) for v in truth.values())
        * ground_truth_k
        / (ground_truth_k - 1),
    }


def _demo_trajectories(responses, tok, segmenter, trajectory_cls, segment_completion) -> list[Any]:
    out = []
    for r in responses:
        if not r["ids"]:
            continue
        out.append(
            trajectory_cls(
                prompt_ids=list(r["prompt_ids"]),
                completion_ids=list(r["ids"]),
                step_boundaries=segment_completion(segmenter, tok, list(r["ids"])),
                reward=float(r["reward"]),
                prompt=r["row"]["prompt"],
                fields={"answer": r["row"]["answer"]},
            )
        )
    return out


# ------------------------------------------------------------------------------------------------ runs


def run_point(task: dict[str, Any], family: str, k: int, repeat: int) -> dict[str, Any]:
    from mcadvantage.core.settings import MCSettings
    from mcadvantage.mc.estimator import MCValueEstimator
    from mcadvantage.mc.planning import plan_states

    options = dict(FAMILIES[family][0])
    if "min_step_tokens" in options:
        options["min_step_tokens"] = task["min_step_tokens"]
    estimator = MCValueEstimator(
        task["make_sampler"](1000 * (repeat + 1) + k),
        task["reward"],
        task["tokenizer"],
        num_rollouts=k,
        max_completion_length=task["max_completion_length"],
        **options,
    )
    t0 = time.perf_counter()
    out = estimator.estimate(task["trajectories"])
    seconds = time.perf_counter() - t0
    plan = plan_states(task["trajectories"], MCSettings(min_step_tokens=options.get("min_step_tokens")))
    responses = len(task["trajectories"])
    return {
        "family": family,
        "k": k,
        "repeat": repeat,
        **score(out, plan.boundaries, task["trajectories"], task["truth"]),
        "tokens_per_response": out.stats["generated_tokens"] / responses,
        "rollouts_per_response": out.stats["rollouts"] / responses,
        "free_samples_per_response": out.stats.get("free_samples", 0.0) / responses,
        "seconds": seconds,
    }


def _interpolate_tokens(points: list[tuple[float, float]], target_mse: float) -> float | None:
    """Tokens at which a family's (tokens, mse) curve reaches ``target_mse`` (log-log linear between the two
    points around it); None when the sweep never gets there."""
    points = sorted(points)
    if points and points[0][1] <= target_mse:
        return points[0][0]  # already at the target with its cheapest point
    for (t0, m0), (t1, m1) in zip(points, points[1:], strict=False):
        if m0 > target_mse >= m1:
            f = (math.log(target_mse) - math.log(m0)) / (math.log(m1) - math.log(m0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


def expected_fixed_target(
    records: list[dict[str, Any]], value_variance: float, truth_variance: float, k: int = 9
) -> tuple[float, float]:
    """Fixed K's expected (tokens per response, value MSE), without simulating it: K fresh rollouts from a state of
    value v give a mean with variance ``v (1 - v) / K`` (the rewards are 0/1), and the ground truth adds its own
    ``truth_variance``, so the expected MSE is ``mean v (1 - v) / K + truth_variance``; tokens grow linearly in K, so
    they are K x the fixed runs' mean tokens per rollout per response. Its only noise is the ground truth's, which
    every option shares: the simulated K=9 point's repeat-to-repeat noise (a few high-variance states dominate it)
    does not enter the ratio. Checked against the simulated fixed points in ``summarize`` (``expected_value_mse``).
    ``truth_variance`` is the recorded ``mean t(1-t)/K_gt``, which is low by a factor ``(K_gt-1)/K_gt`` (0.4% at
    K_gt = 256, negligible next to ``v(1-v)/9``)."""
    fixed = [r for r in records if r["family"] == "fixed"]
    if not fixed:
        raise ValueError("expected_fixed_target: no fixed-K records to measure tokens per rollout from")
    per_rollout = statistics.fmean(r["tokens_per_response"] / r["k"] for r in fixed)
    return k * per_rollout, value_variance / k + truth_variance


def summarize(
    task_name: str,
    records: list[dict[str, Any]],
    value_variance: float | None = None,
    truth_variance: float = 0.0,
) -> list[dict[str, Any]]:
    """Mean over repeats per (family, K), and each family's token ratio to fixed K=9 at K=9's value MSE: against the
    simulated K=9 point, and (with ``value_variance``, the mean ``v (1 - v)`` over the states) against its expectation
    (:func:`expected_fixed_target`), which removes the target's own noise from the ratio."""
    keys = sorted(
        {(r["family"], r["k"]) for r in records}, key=lambda fk: (list(FAMILIES).index(fk[0]), fk[1])
    )
    options = []
    for family, k in keys:
        rs = [r for r in records if r["family"] == family and r["k"] == k]
        entry = {"task": task_name, "name": f"{family} K={k}", "family": family, "k": k, "repeats": len(rs)}
        for field in (
            "tokens_per_response",
            "value_mse",
            "sign_accuracy",
            "rank_correlation",
            "states_per_response",
            "rollouts_per_response",
            "free_samples_per_response",
            "seconds",
        ):
            xs = [r[field] for r in rs if field in r and not math.isnan(r[field])]
            entry[field] = statistics.fmean(xs) if xs else math.nan
            entry[field + "_se"] = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
        options.append(entry)
    k9 = next((o for o in options if o["family"] == "fixed" and o["k"] == 9), None)
    has_fixed = any(r["family"] == "fixed" for r in records)
    target = (
        expected_fixed_target(records, value_variance, truth_variance)
        if value_variance is not None and has_fixed
        else None
    )
    for family in FAMILIES:
        members = [o for o in options if o["family"] == family]
        points = {o["k"]: (o["tokens_per_response"], o["value_mse"]) for o in members}
        ratio, interval = None, None
        if k9 is not None and members and family != "reuse+merge":
            ratio = _ratio_to_k9(points, (k9["tokens_per_response"], k9["value_mse"]))
            interval = None if family == "fixed" else ratio_interval(records, family)
        against_target = target is not None and family not in ("fixed", "reuse+merge") and members
        if against_target:
            expected_ratio = _ratio_to_k9(points, target)
            expected_interval = ratio_interval(records, family, target=target)
        for o in members:
            o["tokens_ratio_vs_k9_at_equal_error"] = ratio
            o["tokens_ratio_ci90"] = interval
            if family == "fixed" and value_variance is not None:
                o["expected_value_mse"] = value_variance / o["k"] + truth_variance
            if against_target:
                o["tokens_ratio_vs_expected_k9"] = expected_ratio
                o["tokens_ratio_vs_expected_k9_ci90"] = expected_interval
    return options


def _ratio_to_k9(points: dict[int, tuple[float, float]], k9: tuple[float, float]) -> float | None:
    """A family's tokens to reach fixed K=9's value MSE, as a ratio to K=9's tokens (None: never reached)."""
    tokens = _interpolate_tokens(list(points.values()), k9[1])
    return None if tokens is None else tokens / k9[0]


def ratio_interval(
    records: list[dict[str, Any]],
    family: str,
    *,
    target: tuple[float, float] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> list[float] | None:
    """90% bootstrap interval of ``family``'s token ratio to fixed K=9 at K=9's error: every (option, K) point's
    repeats are resampled with replacement (independently: each repeat of each point uses its own rollouts) and the
    ratio recomputed; a resample that never reaches K=9's error counts as infinitely expensive. With ``target`` (K=9's
    expected tokens and MSE, :func:`expected_fixed_target`) the target is held fixed and only the family's points
    are resampled. None with fewer than 2 repeats of a point."""
    import random

    def by_k(fam: str) -> dict[int, list[tuple[float, float]]]:
        out: dict[int, list[tuple[float, float]]] = {}
        for r in records:
            if r["family"] == fam:
                out.setdefault(r["k"], []).append((r["tokens_per_response"], r["value_mse"]))
        return out

    points, fixed = by_k(family), by_k("fixed")
    needed = list(points.values()) + ([] if target is not None else [fixed.get(9, [])])
    if not points or any(len(v) < 2 for v in needed):
        return None
    rng = random.Random(seed)

    def mean_of_resample(reps: list[tuple[float, float]]) -> tuple[float, float]:
        draw = [reps[rng.randrange(len(reps))] for _ in reps]
        return statistics.fmean(t for t, _ in draw), statistics.fmean(m for _, m in draw)

    ratios = []
    for _ in range(resamples):
        k9 = target if target is not None else mean_of_resample(fixed[9])
        ratio = _ratio_to_k9({k: mean_of_resample(reps) for k, reps in points.items()}, k9)
        ratios.append(math.inf if ratio is None else ratio)
    ratios.sort()
    return [ratios[int(0.05 * resamples)], ratios[int(0.95 * resamples) - 1]]


def table(options: list[dict[str, Any]]) -> str:
    lines = [
        "| task | option | MC tokens / response | value MSE | sign accuracy | rank corr. | states / resp. | "
        "free samples / resp. | tokens vs K=9 at K=9's error | vs K=9's expected error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in options:
        ratio = o["tokens_ratio_vs_k9_at_equal_error"]
        lines.append(
            f"| {o['task']} | {o['name']} | {o['tokens_per_response']:.1f} | {_mse_text(o)} | "
            f"{o['sign_accuracy']:.3f} | {o['rank_correlation']:.3f} | "
            f"{o['states_per_response']:.2f} | {o['free_samples_per_response']:.1f} | "
            + ("not reached" if ratio is None else f"{ratio:.2f}x" + _interval_text(o))
            + f" | {_expected_ratio_text(o)} |"
        )
    return "\n".join(lines)


def _mse_text(o: dict[str, Any]) -> str:
    expected = o.get("expected_value_mse")
    return f"{o['value_mse']:.4f} ± {o['value_mse_se']:.4f}" + (
        "" if expected is None else f" (expected {expected:.4f})"
    )


def _interval_text(o: dict[str, Any], key: str = "tokens_ratio_ci90") -> str:
    ci = o.get(key)
    return "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def _expected_ratio_text(o: dict[str, Any]) -> str:
    if "tokens_ratio_vs_expected_k9" not in o:
        return ""
    ratio = o["tokens_ratio_vs_expected_k9"]
    return (
        "not reached"
        if ratio is None
        else f"{ratio:.2f}x" + _interval_text(o, "tokens_ratio_vs_expected_k9_ci90")
    )


def doc_tables(
    options: list[dict[str, Any]], descriptions: dict[str, str], truth_variance: dict[str, float]
) -> str:
    """The Markdown results of every task (for ``--doc``): one table per task, every point of every option."""
    out = []
    for task in TASK_ORDER:
        rows = [o for o in options if o["task"] == task]
        if not rows:
            continue
        out += [f"**{task}**: {descriptions.get(task, '')}.", ""]
        if truth_variance.get(task):
            out += [
                f"Mean variance of the ground truth itself: {truth_variance[task]:.5f} (included in every value MSE "
                "below, so it narrows the gaps between options).",
                "",
            ]
        out += [
            "| option | MC tokens / response | value MSE | sign accuracy | rank corr. | states / resp. | "
            "free samples / resp. | tokens vs K=9 at K=9's error [90% CI] | vs K=9's expected error [90% CI] |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for o in rows:
            ratio = o["tokens_ratio_vs_k9_at_equal_error"]
            last = o["family"] != "reuse+merge" and o["k"] == max(
                r["k"] for r in rows if r["family"] == o["family"]
            )
            shown = "(other states)" if o["family"] == "reuse+merge" and o["k"] == 1 else ""
            expected = ""
            if last:
                shown = (
                    "not reached"
                    if ratio is None
                    else f"**{ratio:.2f}x**{_interval_text(o)} ({o['repeats']} repeats)"
                )
                expected = _expected_ratio_text(o)
                expected = f"**{expected}**" if expected and not expected.startswith("not") else expected
            out.append(
                f"| {o['name']} | {o['tokens_per_response']:.1f} | {_mse_text(o)} | "
                f"{o['sign_accuracy']:.3f} | {o['rank_correlation']:.3f} | {o['states_per_response']:.2f} | "
                f"{o['free_samples_per_response']:.1f} | {shown} | {expected} |"
            )
        out.append("")
    return "\n".join(out)


def update_doc(doc: Path, markdown: str) -> bool:
    """Replace the text between the results markers of ``doc`` with ``markdown`` (False: no markers)."""
    from mcadvantage.evaluation.report import replace_between_markers

    return replace_between_markers(doc, "mc_efficiency", markdown)


def plot(options: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({o["task"] for o in options}, key=list(TASK_ORDER).index)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for family in FAMILIES:
            pts = sorted(
                (o["tokens_per_response"], o["value_mse"], o["k"])
                for o in options
                if o["task"] == task and o["family"] == family
            )
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=family)
            for x, y, k in pts:
                ax.annotate(f"K={k}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        k9 = [o["value_mse"] for o in options if o["task"] == task and o["family"] == "fixed" and o["k"] == 9]
        if k9:
            ax.axhline(k9[0], ls="--", lw=1, color="grey", label="fixed K=9's error")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Monte Carlo tokens per response")
        ax.set_ylabel("value MSE vs ground truth")
        ax.set_title(task)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["toy", "demo"], choices=list(TASK_ORDER))
    parser.add_argument("--toy_groups", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=16, help="demo: held-out prompts (8 responses each)")
    parser.add_argument("--ground_truth_k", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="independent estimates per (option, K)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES), help="run only these options"
    )
    parser.add_argument(
        "--ks",
        nargs="+",
        type=int,
        default=None,
        help="run these K for the chosen --families instead of each family's sweep (for example to extend a "
        "sweep past K=9 where an option does not reach fixed K=9's error)",
    )
    parser.add_argument("--report", action="store_true", help="only aggregate what is in the run files")
    parser.add_argument("--json", default=str(RESULTS / "mc_efficiency.json"))
    parser.add_argument("--runs", default=str(RUNS), help="where per-task records and caches are kept")
    parser.add_argument(
        "--doc", default=None, help="also rewrite the results between the markers of this file"
    )
    return parser


def _run_task(task_name: str, args: argparse.Namespace, runs: Path, machine_info: Any) -> None:
    """Every (option, K, repeat) of ``task_name`` not yet in ``runs/<task>.jsonl``, appended as it finishes
    (repeat-major, so an interrupted run leaves whole sweeps behind), and the task's meta file."""
    path = runs / f"{task_name}.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            done.add((r["family"], r["k"], r["repeat"]))
    # Repeat-major, so an interrupted run leaves whole sweeps behind.
    todo = [
        (f, k, rep)
        for rep in range(args.repeats)
        for f, (_, sweep) in FAMILIES.items()
        if f in args.families
        for k in (sweep if args.ks is None else args.ks)
    ]
    todo = [x for x in todo if x not in done]
    meta_path = runs / f"{task_name}.meta.json"
    settings = (
        {"toy_groups": args.toy_groups, "seed": args.seed}
        if task_name.startswith("toy")
        else {"prompts": args.prompts, "ground_truth_k": args.ground_truth_k, "seed": args.seed}
    )
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else None
    same_settings = meta is None or meta.get("settings") == settings
    nothing_to_run = args.report or not todo
    if not nothing_to_run and not same_settings:
        raise SystemExit(
            f"{path} holds runs with settings {meta.get('settings')}, not {settings}: pass those settings to "
            "resume, or another --runs directory for a new configuration."
        )
    # A meta file written before value_variance existed is completed, for its own settings only.
    heal = meta is not None and "value_variance" not in meta and same_settings
    if nothing_to_run and not heal:
        return  # the aggregation reads the meta file
    if task_name.startswith("toy"):
        task = toy_task(args.toy_groups, args.seed, depth=12 if task_name == "toy_long" else 6)
    else:  # with its cache in place this loads the policy and the stored responses, and samples nothing
        task = demo_task(args.prompts, args.ground_truth_k, args.seed, args.threads, runs)
    meta_path.write_text(
        json.dumps(
            {
                "description": task["description"],
                "truth_variance": task["truth_variance"],
                "value_variance": task["value_variance"],
                "settings": settings,
                "environment": machine_info(threads=args.threads),
            }
        ),
        encoding="utf-8",
    )
    if nothing_to_run:
        return
    for family, k, rep in todo:
        record = run_point(task, family, k, rep)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(
            f"[{task_name}] {family} K={k} repeat {rep}: {record['tokens_per_response']:.1f} tokens/response, "
            f"value MSE {record['value_mse']:.4f}, sign {record['sign_accuracy']:.3f} ({record['seconds']:.1f} s)",
            flush=True,
        )


def _aggregate(runs: Path) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, float], dict[str, float]]:
    """Every task's summarized options, descriptions, ground-truth and value variances, from the run files."""
    descriptions: dict[str, str] = {}
    truth_variance: dict[str, float] = {}
    value_variance: dict[str, float] = {}
    options: list[dict[str, Any]] = []
    for task_name in TASK_ORDER:
        path = runs / f"{task_name}.jsonl"
        if path.exists():
            records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            meta_path = runs / f"{task_name}.meta.json"
            meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
            descriptions[task_name] = meta.get("description", "")
            truth_variance[task_name] = meta.get("truth_variance", 0.0)
            if "value_variance" in meta:
                value_variance[task_name] = meta["value_variance"]
            options += summarize(task_name, records, value_variance.get(task_name), truth_variance[task_name])
    return options, descriptions, truth_variance, value_variance


def main(argv: list[str] | None = None) -> int:
    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = _parser().parse_args(argv)

    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    png = Path(args.json).with_suffix(".png")
    for task_name in args.tasks:
        _run_task(task_name, args, runs, machine_info)

    options, descriptions, truth_variance, value_variance = _aggregate(runs)
    if not options:
        print("no finished runs yet")
        return 0
    print(table(options))
    plot(options, png)
    out = {
        "machine": machine_info(threads=args.threads),
        "command": "python benchmarks/mc_efficiency.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "tasks": descriptions,
        "ground_truth_variance": truth_variance,
        "value_variance": value_variance,
        "sign_tolerance": SIGN_TOLERANCE,
        "options": options,
    }
    Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    print(f"wrote {args.json} and {png}")
    if args.doc and not update_doc(Path(args.doc), doc_tables(options, descriptions, truth_variance)):
        print(f"{args.doc} has no mc_efficiency results markers; left it alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
