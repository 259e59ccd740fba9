"""Credit-assignment diagnostics: how close an estimator's values and advantages are to the truth.

Pure functions on plain sequences, so they score any estimator (Monte Carlo at any K, a learned critic, GRPO's
implied per-token advantage) against ground truth (e.g. Monte Carlo values from a large K drawn independently of
the estimate being scored). The I/O that produces those numbers (sampling, grading) lives elsewhere.

- :func:`value_errors`: mean absolute error, root mean squared error and explained variance of state values.
- :func:`sign_accuracy`: how often an advantage estimate has the sign of the true advantage.
- :func:`ranking_accuracy`: the paper's ranking test (VinePPO, section 7): given alternative next steps from one
  state, how often the estimator orders a pair as the truth does (pairwise), and how often it picks the truly best
  step (top-1).

Why this module is long: :func:`diagnose_credit` is one measurement (ground truth, estimates at several K, the
ranking test on sampled alternative steps) whose phases share their samples; with its plots, page and command line it
stays one reading unit, and the pure metric functions at the top are independent of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

__all__ = ["CreditDiagnostics", "diagnose_credit", "ranking_accuracy", "sign_accuracy", "value_errors"]


def _pairs(estimated: Sequence[float], truth: Sequence[float], name: str) -> list[tuple[float, float]]:
    if len(estimated) != len(truth):
        raise ValueError(
            f"{name}: estimated has {len(estimated)} values but truth has {len(truth)}; pass one each."
        )
    pairs = [(float(e), float(t)) for e, t in zip(estimated, truth, strict=True)]
    if not pairs:
        raise ValueError(f"{name}: no values to compare.")
    if any(not (math.isfinite(e) and math.isfinite(t)) for e, t in pairs):
        raise ValueError(f"{name}: values must be finite (drop unscorable states first).")
    return pairs


def value_errors(estimated: Sequence[float], truth: Sequence[float]) -> dict[str, float]:
    """Errors of estimated state values against true ones.

    Returns:
        ``mae``, ``rmse`` and ``explained_variance`` (``1 - Var(truth - estimated) / Var(truth)``, population
        variances; NaN when the true values do not vary).
    """
    pairs = _pairs(estimated, truth, "value_errors")
    n = len(pairs)
    errors = [t - e for e, t in pairs]
    mean_t = math.fsum(t for _, t in pairs) / n
    var_t = math.fsum((t - mean_t) ** 2 for _, t in pairs) / n
    mean_err = math.fsum(errors) / n
    var_err = math.fsum((d - mean_err) ** 2 for d in errors) / n
    return {
        "mae": math.fsum(abs(d) for d in errors) / n,
        "rmse": math.sqrt(math.fsum(d * d for d in errors) / n),
        "explained_variance": 1.0 - var_err / var_t if var_t > 0 else math.nan,
    }


def sign_accuracy(estimated: Sequence[float], truth: Sequence[float], *, tolerance: float = 0.0) -> float:
    """Share of advantages whose estimate has the true sign, over the entries whose true advantage is decided
    (``|truth| > tolerance``); NaN when none is. An estimate of exactly 0 counts as wrong (it ranks nothing)."""
    if tolerance < 0:
        raise ValueError(f"sign_accuracy: tolerance={tolerance} must be >= 0.")
    decided = [(e, t) for e, t in _pairs(estimated, truth, "sign_accuracy") if abs(t) > tolerance]
    if not decided:
        return math.nan
    return sum((e > 0) == (t > 0) and e != 0 for e, t in decided) / len(decided)


def ranking_accuracy(
    estimated: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]
) -> dict[str, float]:
    """The paper's ranking test over groups of alternatives (e.g. the values of K alternative next steps sampled
    from one state, one group per state).

    Args:
        estimated: per group, the estimator's value of each alternative.
        truth: per group, the true value of each alternative (same shape).

    Returns:
        ``pairwise``: over the pairs of alternatives whose true values differ, the share the estimator orders the
        same way (ties in the estimate count as half). ``top1``: over the groups with a unique true best, the share
        where the estimator's best (ties split evenly) is it. ``pairs`` and ``groups``: how many were scored. NaN
        where nothing could be scored.
    """
    if len(estimated) != len(truth):
        raise ValueError(f"ranking_accuracy: {len(estimated)} estimated groups but {len(truth)} true groups.")
    agree = pairs = 0.0
    top1 = groups = 0.0
    for g, (est, tru) in enumerate(zip(estimated, truth, strict=True)):
        values = _pairs(est, tru, f"ranking_accuracy group {g}")
        for (e_i, t_i), (e_j, t_j) in combinations(values, 2):
            if t_i == t_j:
                continue
            pairs += 1
            agree += 0.5 if e_i == e_j else float((e_i > e_j) == (t_i > t_j))
        best_t = max(t for _, t in values)
        if sum(t == best_t for _, t in values) != 1:
            continue
        groups += 1
        best_e = max(e for e, _ in values)
        chosen = [t for e, t in values if e == best_e]
        top1 += sum(t == best_t for t in chosen) / len(chosen)
    return {
        "pairwise": agree / pairs if pairs else math.nan,
        "top1": top1 / groups if groups else math.nan,
        "pairs": pairs,
        "groups": groups,
    }


# ------------------------------------------------------------------------------------------------------------------
# I/O: sampling responses, ground truth, the estimators, and the report. Everything above stays pure.
# ------------------------------------------------------------------------------------------------------------------

#: Tolerance of the sign test: a true advantage within it is undecided. A ground-truth value from K = 256 has a
#: standard error of at most 0.5 / 16 = 0.031, so an advantage (a difference of two) below 0.05 is not decided.
SIGN_TOLERANCE = 0.05


@dataclass
class CreditDiagnostics:
    """What :func:`diagnose_credit` measured.

    Attributes:
        estimators: per estimator name, its metrics against ground truth: ``value_*`` (state values,
            :func:`value_errors`), ``sign_accuracy`` (step advantages, :func:`sign_accuracy` with
            :data:`SIGN_TOLERANCE`), ``ranking_pairwise`` / ``ranking_top1`` (:func:`ranking_accuracy`) and
            ``states`` (how many values were compared).
        value_points: per estimator, ``(step position, estimate, truth)`` for every compared state.
        responses: the sampled responses with their ground-truth values and step advantages (for the report).
        settings: how it was run.
    """

    estimators: dict[str, dict[str, float]]
    value_points: dict[str, list[tuple[int, float, float]]]
    responses: list[dict[str, Any]]
    settings: dict[str, Any]

    def table(self) -> str:
        """A plain-text table of the metrics, one row per estimator."""
        head = f"{'estimator':<28} {'states':>6} {'value MAE':>9} {'expl. var':>9} {'sign acc':>8} {'rank pair':>9} {'rank top1':>9}"
        lines = [head, "-" * len(head)]
        for name, m in self.estimators.items():
            cells = [m.get(k, math.nan) for k in ("value_mae", "value_explained_variance", "sign_accuracy")]
            cells += [m.get("ranking_pairwise", math.nan), m.get("ranking_top1", math.nan)]
            lines.append(
                f"{name:<28} {int(m.get('states', 0)):>6} "
                + " ".join(f"{c:>9.3f}" if c == c else f"{'-':>9}" for c in cells)
            )
        return "\n".join(lines)

    def save(self, output_dir: str | Path) -> dict[str, Path]:
        """Write ``metrics.json``, ``responses.json`` (the responses with their ground-truth values and step
        advantages: the report's data), ``value_scatter.png``, ``error_by_position.png`` and ``report.html`` (a view
        of the two JSON files)."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"metrics": out / "metrics.json"}
        paths["metrics"].write_text(
            json.dumps(
                {"estimators": self.estimators, "settings": self.settings, "value_points": self.value_points},
                indent=2,
            ),
            encoding="utf-8",
        )
        paths["responses"] = out / "responses.json"
        paths["responses"].write_text(json.dumps({"responses": self.responses}, indent=1), encoding="utf-8")
        paths.update(_plot(self, out))
        paths["report"] = out / "report.html"
        paths["report"].write_text(_render_report(self), encoding="utf-8")
        return paths


def diagnose_credit(
    sampler: Any,
    tokenizer: Any,
    reward_func: Callable[..., list[float]],
    rows: Sequence[Mapping[str, Any]],
    *,
    segmenter: Any = "gsm8k",
    responses_per_prompt: int = 4,
    ground_truth_k: int = 256,
    ks: Sequence[int] = (1, 3, 9),
    alternatives: int = 4,
    ranking_states: int = 32,
    max_new_tokens: int = 64,
    seed: int = 0,
    progress: bool = True,
    value_functions: Mapping[str, Callable[[list[list[int]], list[list[int]]], list[float]]] | None = None,
) -> CreditDiagnostics:
    """Measure how well each estimator assigns credit on responses of one policy, against ground truth.

    1. ``responses_per_prompt`` responses per row (``row["prompt"]`` text; the other columns go to
       ``reward_func``, as TRL passes dataset columns) from ``sampler``, cut into steps by ``segmenter``.
    2. Ground truth: the value of every step-boundary state from ``ground_truth_k`` Monte Carlo rollouts.
    3. VinePPO at each ``K`` in ``ks``, from fresh rollouts (independent of the ground truth).
    4. GRPO's and RLOO's implied credit: one advantage for every step of a response (its reward minus the mean
       of its group, with or without itself), and an implied ``V(S_0)`` (that mean); deeper states get no value
       from them, so their value errors cover ``S_0`` only.
    5. The paper's ranking test: from up to ``ranking_states`` states spread over the responses, ``alternatives``
       continuations each, cut at their first step; each alternative next step is scored by the value of the
       state it leads to (ground truth, and each estimator). GRPO and RLOO give every alternative the same value,
       so their ranking is chance by construction (pairwise 0.5, top-1 ``1 / alternatives``); it is reported so
       the comparison reads side by side.

    6. Learned value functions (``value_functions``, e.g. a PPO critic's
       :meth:`~mcadvantage.estimators.CriticEstimator.predict_values`): ``fn(prompt_ids, prefixes) -> values`` is
       asked for every state, scored like the Monte Carlo estimates (value errors, step-advantage signs, the
       ranking test).

    ``sampler`` must sample with the policy's training settings (e.g.
    ``TransformersSampler(model, tokenizer, temperature=0.6)``); ``seed`` seeds torch's generator first.
    """
    import torch
    from tqdm.auto import tqdm

    from mcadvantage.mc.estimator import MCValueEstimator

    _check_arguments(responses_per_prompt, ground_truth_k, alternatives, max_new_tokens, ks, rows)
    torch.manual_seed(seed)
    # Stages: responses, ground truth, each K; alternatives, their ground truth, each K on them.
    bar = tqdm(total=4 + 2 * len(ks), desc="credit diagnostics", disable=not progress)

    def estimator(k: int) -> Any:
        return MCValueEstimator(
            sampler, reward_func, tokenizer, num_rollouts=k, max_completion_length=max_new_tokens
        )

    # 1. responses, 2. ground truth, 3. VinePPO at each K (fresh rollouts)
    grade = _Grader(tokenizer, reward_func, segmenter)
    trajectories, group_of = grade.responses(sampler, rows, responses_per_prompt, max_new_tokens)
    bar.update(1)
    truth = estimator(ground_truth_k).estimate(trajectories)
    bar.update(1)
    estimates = {}
    for k in ks:
        estimates[f"vineppo_k{k}"] = estimator(k).estimate(trajectories)
        bar.update(1)
    learned = dict(value_functions or {})  # 3. and 6. against the truth, then 4. GRPO's and RLOO's
    value_points, metrics = _scored_values(estimates, learned, trajectories, truth)
    _implied_credit(trajectories, group_of, truth, value_points, metrics)

    # 5. ranking test, from up to ranking_states states spread over the responses
    states = [(i, j) for i, t in enumerate(trajectories) for j in range(len(t.step_boundaries) - 1)]
    chosen = states[:: max(1, len(states) // ranking_states)][:ranking_states]
    alt_trajs, alt_index = grade.alternatives(sampler, trajectories, chosen, alternatives, max_new_tokens)
    bar.update(1)
    ranking: dict[str, dict[str, float]] = {}
    if alt_trajs:
        scored = {"truth": estimator(ground_truth_k).estimate(alt_trajs).values}
        bar.update(1)
        for name in estimates:
            scored[name] = estimator(int(name.removeprefix("vineppo_k"))).estimate(alt_trajs).values
            bar.update(1)
        scored |= {name: _learned_values(fn, alt_trajs) for name, fn in learned.items()}
        ranking = _rankings(scored, alt_index, len(chosen), [*estimates, *learned])
    for name, r in ranking.items():
        metrics[name] |= {f"ranking_{key}": r[key] for key in ("pairwise", "top1", "groups", "pairs")}
    bar.close()
    settings = {
        "prompts": len(rows),
        "responses_per_prompt": responses_per_prompt,
        "ground_truth_k": ground_truth_k,
        "ks": list(ks),
        "alternatives": alternatives,
        "ranking_states": len(chosen),
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "sign_tolerance": SIGN_TOLERANCE,
        "responses": len(trajectories),
        "states": len(states),
    }
    return CreditDiagnostics(metrics, value_points, _responses(tokenizer, trajectories, truth), settings)


def _check_arguments(
    responses_per_prompt: int,
    ground_truth_k: int,
    alternatives: int,
    max_new_tokens: int,
    ks: Sequence[int],
    rows: Sequence[Mapping[str, Any]],
) -> None:
    """:func:`diagnose_credit`'s arguments, refused with the fix before anything is sampled."""
    for name, value in (
        ("responses_per_prompt", responses_per_prompt),
        ("ground_truth_k", ground_truth_k),
        ("alternatives", alternatives),
        ("max_new_tokens", max_new_tokens),
    ):
        if value < 1:
            raise ValueError(f"diagnose_credit: {name} must be >= 1, got {value}.")
    if not ks or min(ks) < 1:
        raise ValueError(f"diagnose_credit: ks must be a non-empty list of K >= 1, got {list(ks)}.")
    if responses_per_prompt < 2:
        raise ValueError("diagnose_credit: responses_per_prompt must be >= 2 (GRPO and RLOO need a group).")
    if not rows:
        raise ValueError(
            "diagnose_credit: rows is empty; pass at least one {'prompt': ..., 'answer': ...} row."
        )


@dataclass
class _Grader:
    """Samples responses or continuations, grades them with ``reward_func`` and cuts them into steps."""

    tokenizer: Any
    reward_func: Callable[..., list[float]]
    segmenter: Any

    def responses(
        self, sampler: Any, rows: Sequence[Mapping[str, Any]], per_prompt: int, max_new_tokens: int
    ) -> tuple[list[Any], list[int]]:
        """``per_prompt`` graded responses per row, and each one's row (its group)."""
        from mcadvantage.core.text import decode_batch
        from mcadvantage.mc.estimator import Trajectory
        from mcadvantage.samplers.base import RolloutRequest
        from mcadvantage.tasks.segmentation import segment_completion
        from mcadvantage.trainer.self_training import grade_completions

        prompt_ids = [list(self.tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows]
        conts = sampler.sample([RolloutRequest(tuple(p), per_prompt, max_new_tokens) for p in prompt_ids])
        trajectories, group_of = [], []
        for g, (row, pids, group) in enumerate(zip(rows, prompt_ids, conts, strict=True)):
            fields = {k: v for k, v in row.items() if k != "prompt"}
            texts = decode_batch(self.tokenizer, [list(c.token_ids) for c in group])
            for c, reward in zip(
                group, grade_completions(self.reward_func, row["prompt"], texts, fields), strict=True
            ):
                ids = list(c.token_ids)
                bounds = segment_completion(self.segmenter, self.tokenizer, ids)
                trajectories.append(Trajectory(pids, ids, bounds, reward, row["prompt"], fields))
                group_of.append(g)
        return trajectories, group_of

    def alternatives(
        self,
        sampler: Any,
        trajectories: Sequence[Any],
        chosen: Sequence[tuple[int, int]],
        n: int,
        max_new: int,
    ) -> tuple[list[Any], list[tuple[int, int]]]:
        """``n`` graded continuations from each chosen state (response, step), and for each the chosen state's
        index and the index of the state its first step leads to."""
        from mcadvantage.core.text import decode_batch
        from mcadvantage.mc.estimator import Trajectory
        from mcadvantage.samplers.base import RolloutRequest
        from mcadvantage.tasks.segmentation import segment_completion
        from mcadvantage.trainer.self_training import grade_completions

        requests = [
            RolloutRequest(
                tuple(
                    trajectories[i].prompt_ids
                    + trajectories[i].completion_ids[: trajectories[i].step_boundaries[j]]
                ),
                n,
                max_new - trajectories[i].step_boundaries[j],
            )
            for i, j in chosen
        ]
        alt_trajs, alt_index = [], []
        for s, ((i, j), group) in enumerate(
            zip(chosen, sampler.sample(requests) if requests else [], strict=True)
        ):
            base = trajectories[i]
            head = base.completion_ids[: base.step_boundaries[j]]
            texts = decode_batch(self.tokenizer, [head + list(c.token_ids) for c in group])
            for c, reward in zip(
                group, grade_completions(self.reward_func, base.prompt, texts, base.fields), strict=True
            ):
                ids = head + list(c.token_ids)
                bounds = segment_completion(self.segmenter, self.tokenizer, ids)
                k = next((m for m, b in enumerate(bounds) if b > len(head)), len(bounds) - 1)
                alt_trajs.append(Trajectory(base.prompt_ids, ids, bounds, reward, base.prompt, base.fields))
                alt_index.append((s, k))
        return alt_trajs, alt_index


def _points(values: list[list[float]], truth: list[list[float]]) -> list[tuple[int, float, float]]:
    """``(position, estimate, truth)`` of every state but each response's last (its reward)."""
    return [(j, est[j], tru[j]) for est, tru in zip(values, truth, strict=True) for j in range(len(tru) - 1)]


def _learned_values(fn: Callable[..., list[float]], trajs: Sequence[Any]) -> list[list[float]]:
    """A learned value function's values of every state of ``trajs``, each response's reward last."""
    flat = [(t.prompt_ids, t.completion_ids[:b]) for t in trajs for b in t.step_boundaries[:-1]]
    preds = list(fn([p for p, _ in flat], [c for _, c in flat])) if flat else []
    out, start = [], 0
    for t in trajs:
        n = len(t.step_boundaries) - 1
        out.append([float(v) for v in preds[start : start + n]] + [float(t.reward)])
        start += n
    return out


def _scored_values(
    estimates: Mapping[str, Any],
    learned: Mapping[str, Callable[..., list[float]]],
    trajectories: Sequence[Any],
    truth: Any,
) -> tuple[dict[str, list[tuple[int, float, float]]], dict[str, dict[str, float]]]:
    """Each Monte Carlo estimate's and learned value function's value points and metrics against the truth."""
    true_advs = [a for advs in truth.step_advantages for a in advs]
    value_points: dict[str, list[tuple[int, float, float]]] = {}
    metrics: dict[str, dict[str, float]] = {}
    for name, est in estimates.items():
        value_points[name] = _points(est.values, truth.values)
        metrics[name] = _value_metrics(value_points[name])
        metrics[name]["sign_accuracy"] = sign_accuracy(
            [a for advs in est.step_advantages for a in advs], true_advs, tolerance=SIGN_TOLERANCE
        )
    for name, fn in learned.items():
        values = _learned_values(fn, trajectories)
        value_points[name] = _points(values, truth.values)
        metrics[name] = _value_metrics(value_points[name])
        metrics[name]["sign_accuracy"] = sign_accuracy(
            [v[i] - v[i - 1] for v in values for i in range(1, len(v))], true_advs, tolerance=SIGN_TOLERANCE
        )
    return value_points, metrics


def _implied_credit(
    trajectories: Sequence[Any],
    group_of: Sequence[int],
    truth: Any,
    value_points: dict[str, list[tuple[int, float, float]]],
    metrics: dict[str, dict[str, float]],
) -> None:
    """GRPO's and RLOO's implied credit, into ``value_points`` and ``metrics``: ``V(S_0)`` is the group's mean
    (with or without the response), every step's advantage the reward minus it."""
    true_advs = [a for advs in truth.step_advantages for a in advs]
    rewards = [t.reward for t in trajectories]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_of):
        groups.setdefault(g, []).append(i)
    for name, leave_one_out in (("grpo (implied)", False), ("rloo (implied)", True)):
        baseline = []
        for i, g in enumerate(group_of):
            others = [rewards[j] for j in groups[g] if not (leave_one_out and j == i)]
            baseline.append(sum(others) / len(others))
        value_points[name] = [(0, b, tru[0]) for b, tru in zip(baseline, truth.values, strict=True)]
        metrics[name] = _value_metrics(value_points[name])
        per_step = [
            rewards[i] - baseline[i] for i, t in enumerate(trajectories) for _ in t.step_boundaries[1:]
        ]
        metrics[name]["sign_accuracy"] = sign_accuracy(per_step, true_advs, tolerance=SIGN_TOLERANCE)


def _rankings(
    scored: Mapping[str, list[list[float]]],
    alt_index: Sequence[tuple[int, int]],
    states: int,
    names: Sequence[str],
) -> dict[str, dict[str, float]]:
    """The ranking test of each of ``names`` against the truth (``scored["truth"]``), and of GRPO and RLOO, which
    give every alternative the same value."""

    def grouped(values: list[list[float]]) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in range(states)]
        for (s, k), vals in zip(alt_index, values, strict=True):
            out[s].append(vals[k])
        return out

    true_groups = grouped(scored["truth"])
    ranking = {name: ranking_accuracy(grouped(scored[name]), true_groups) for name in names}
    flat = [[0.0] * len(g) for g in true_groups]  # one value for every alternative
    for name in ("grpo (implied)", "rloo (implied)"):
        ranking[name] = ranking_accuracy(flat, true_groups)
    return ranking


def _responses(tokenizer: Any, trajectories: Sequence[Any], truth: Any) -> list[dict[str, Any]]:
    """The responses with their steps' text, ground-truth values and step advantages (the report's data)."""
    from mcadvantage.core.text import decode_batch

    responses = []
    for t, values, advs in zip(trajectories, truth.values, truth.step_advantages, strict=True):
        b = t.step_boundaries
        steps = decode_batch(tokenizer, [t.completion_ids[b[n] : b[n + 1]] for n in range(len(b) - 1)])
        responses.append(
            {
                "prompt": t.prompt,
                "steps": steps,
                "values": list(values),
                "advantages": list(advs),
                "reward": t.reward,
                "gold": str(t.fields.get("answer", "")),
            }
        )
    return responses


def _value_metrics(points: Sequence[tuple[int, float, float]]) -> dict[str, float]:
    errors = value_errors([e for _, e, _ in points], [t for _, _, t in points])
    return {f"value_{k}": v for k, v in errors.items()} | {"states": float(len(points))}


def _plot(result: CreditDiagnostics, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.value_points)
    fig, axes = plt.subplots(
        1, len(names), figsize=(3.2 * len(names), 3.3), sharex=True, sharey=True, squeeze=False
    )
    for ax, name in zip(axes[0], names, strict=True):
        pts = result.value_points[name]
        ax.scatter([t for _, _, t in pts], [e for _, e, _ in pts], s=8, alpha=0.5)
        ax.plot([0, 1], [0, 1], color="grey", lw=1)
        ax.set_title(f"{name}\nMAE {result.estimators[name]['value_mae']:.3f}", fontsize=9)
        ax.set_xlabel("ground-truth value")
    axes[0][0].set_ylabel("estimated value")
    fig.tight_layout()
    scatter = out / "value_scatter.png"
    fig.savefig(scatter, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name in names:
        by_pos: dict[int, list[float]] = {}
        for j, e, t in result.value_points[name]:
            by_pos.setdefault(j, []).append(abs(e - t))
        xs = sorted(by_pos)
        ax.plot(xs, [sum(by_pos[x]) / len(by_pos[x]) for x in xs], "o-", label=name)
    ax.set_xlabel("step position (state S_j)")
    ax.set_ylabel("mean absolute value error")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    by_position = out / "error_by_position.png"
    fig.savefig(by_position, dpi=110)
    plt.close(fig)
    return {"value_scatter": scatter, "error_by_position": by_position}


def _render_report(result: CreditDiagnostics) -> str:
    from mcadvantage.evaluation.report import ScoredResponse, render_responses_html

    summary = {"settings": ", ".join(f"{k}={v}" for k, v in result.settings.items())}
    for name, m in result.estimators.items():
        parts = [
            f"value MAE {m['value_mae']:.3f} over {int(m['states'])} states",
            f"sign accuracy {m['sign_accuracy']:.3f}",
        ]
        if "ranking_pairwise" in m:
            parts.append(f"ranking pairwise {m['ranking_pairwise']:.3f}, top-1 {m['ranking_top1']:.3f}")
        summary[name] = "; ".join(parts)
    scored = [
        ScoredResponse(str(r["prompt"]), r["steps"], r["values"], r["advantages"], r["reward"], r["gold"])
        for r in result.responses
    ]
    return render_responses_html(
        {"Sampled responses, each step coloured by its ground-truth advantage": scored},
        title="Credit-assignment diagnostics",
        summary=summary,
    )


def _parser() -> Any:
    """The command line of :func:`main`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mcadvantage.evaluation.diagnostics", description=main.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", required=True, help="a saved model directory (or a cached model id)")
    parser.add_argument("--data", required=True, help="JSONL, one {'prompt': ..., 'answer': ...} per line")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--verifier", choices=("gsm8k", "math"), default="gsm8k")
    parser.add_argument(
        "--segmenter", default=None, help="step segmenter name (default: the verifier's task)"
    )
    parser.add_argument("--num_prompts", type=int, default=16, help="the first N rows of --data")
    parser.add_argument("--responses_per_prompt", type=int, default=4)
    parser.add_argument("--ground_truth_k", type=int, default=256)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 9])
    parser.add_argument("--alternatives", type=int, default=4)
    parser.add_argument("--ranking_states", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mcadvantage.evaluation.diagnostics --model DIR --data FILE.jsonl --output_dir DIR``: credit diagnostics of a
    saved model on prompts with answers (JSONL rows with ``prompt`` and ``answer``). Loads the model with
    transformers, samples with :class:`~mcadvantage.TransformersSampler`; nothing is downloaded."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = _parser().parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage.samplers.hf import TransformersSampler
    from mcadvantage.tasks import GSM8KVerifier, MathVerifier

    path = Path(args.data)
    if not path.is_file():
        raise SystemExit(
            f"--data {args.data!r} does not exist; pass a JSONL file of {{'prompt', 'answer'}} rows."
        )
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][
        : args.num_prompts
    ]
    bad = [i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str) or "answer" not in r]
    if bad:
        raise SystemExit(f"--data rows {bad[:5]} lack a text 'prompt' or an 'answer'; every row needs both.")
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    sampler = TransformersSampler(model, tokenizer, temperature=args.temperature, max_batch_sequences=1024)
    verifier = GSM8KVerifier() if args.verifier == "gsm8k" else MathVerifier()
    result = diagnose_credit(
        sampler,
        tokenizer,
        verifier,
        rows,
        segmenter=args.segmenter or args.verifier,
        responses_per_prompt=args.responses_per_prompt,
        ground_truth_k=args.ground_truth_k,
        ks=args.ks,
        alternatives=args.alternatives,
        ranking_states=args.ranking_states,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    print(result.table())
    paths = result.save(args.output_dir)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
