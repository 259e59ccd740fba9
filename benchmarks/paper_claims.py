"""The paper's claims side by side with ours: one row per quantitative claim of VinePPO (arXiv 2410.01679).

    python benchmarks/paper_claims.py          # read the records and results, write the JSON and the page

Reads the paper-claims study's run records (``benchmarks/results/paper_claims_runs``, produced by
``benchmarks/learning_efficiency.py`` under ``docs/paper-claims-protocol.md``), the other studies' committed results
(``benchmarks/results/*.json``) and the catalogue of the paper's claims (``benchmarks/paper_claims_catalogue.json``:
each claim, the paper's number and setting, and where our closest measurement lives). Writes
``benchmarks/results/paper_claims.json`` (``claims``: one record per claim with ``claim``, ``paper``, ``ours``, ``ci``,
``verdict``, ``command``; ``studies``: the tests behind the new rows) and ``docs/paper-claims.md``, rendered from that
JSON alone (``render_page``), so ``tests/benchmarks/test_paper_claims.py`` can check every number on the page.

The decision rule is the protocol's: for VinePPO K = 4 against PPO on ``demo_plateau``, paired by seed, M1 (accuracy
at the last step, paired t), M2 (steps to PPO's peak, exact sign test), M3 (wall time to PPO's peak, sign test), M4
(KL to the start at the last step, paired t), Holm over M1-M4. A stage whose runs have not all finished is reported as
not measured yet, with how many have.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = RESULTS / "paper_claims_runs"
REGIME_RUNS = RESULTS / "learning_efficiency_runs"
CATALOGUE = ROOT / "benchmarks" / "paper_claims_catalogue.json"
OUT_JSON = RESULTS / "paper_claims.json"
PAGE = ROOT / "docs" / "paper-claims.md"
COMMAND = "python benchmarks/paper_claims.py"
STAGE1_COMMAND = (
    "python benchmarks/learning_efficiency.py --task demo_plateau --seeds 0 1 2 3 4 5 6 7 8 9 10 11 --arms grpo "
    "vineppo_k4 ppo --eval_every 5 --kl_prompts 128 --threads 1 --root benchmarks/results/paper_claims_runs "
    "--json /tmp/paper_claims_stage1.json --report_tasks demo_plateau"
)
STAGE2_COMMAND = (
    "python benchmarks/learning_efficiency.py --task demo_plateau --seeds 0 1 2 3 4 5 6 7 8 9 10 11 --arms ppo_t0.6 "
    "vineppo_k4_t0.6 ppo_t0.8 vineppo_k4_t0.8 ppo_t1.0 vineppo_k4_t1.0 --rl_steps 14 --eval_every 7 "
    "--kl_prompts 128 --threads 1 --root benchmarks/results/paper_claims_runs --json /tmp/paper_claims_stage2.json "
    "--report_tasks demo_plateau"
)
SEEDS = list(range(12))
TASK = "demo_plateau"
STAGE1_ARMS = ("grpo", "vineppo_k4", "ppo")
TEMPERATURES = (0.6, 0.8, 1.0)
DIVERGED_BELOW_START = 0.04  # the protocol's "diverges": last accuracy this far (2 SE) below the start's
GPU_COST_RATIO = 0.4  # r on GPUs with vLLM (docs/gradient-quality.md), beside the CPU measurement
ALPHA = 0.05


# ---- statistics ----------------------------------------------------------------------------------------------


def _stats():
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from mcadvantage.evaluation import stats

    return stats


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: the probability, with ties dropped and each untied pair a fair coin, of a split at
    least as uneven as ``wins``/``losses``."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


# ---- records -------------------------------------------------------------------------------------------------


def load_curves(root: Path, task: str, arm: str, seeds: list[int]) -> dict[int, list[dict]]:
    """``{seed: records by step}`` of the finished runs of ``arm`` (a run counts once its ``done.json`` exists)."""
    out = {}
    for seed in seeds:
        seed_dir = root / task / f"seed{seed}"
        if not (seed_dir / f"{arm}.done.json").exists():
            continue
        rows = [
            json.loads(line) for line in (seed_dir / f"{arm}.jsonl").read_text().splitlines() if line.strip()
        ]
        out[seed] = sorted(rows, key=lambda r: r["step"])
    return out


def load_logs(root: Path, task: str, arm: str, seed: int) -> list[dict]:
    return json.loads((root / task / f"seed{seed}" / f"{arm}.done.json").read_text()).get("logs", [])


def first_reaching(curve: list[dict], target: float) -> dict | None:
    """The first evaluated record after step 0 at or above ``target`` (None: never)."""
    for r in curve:
        if r["step"] > 0 and r["accuracy"] >= target - 1e-12:
            return r
    return None


def peak(curve: list[dict]) -> float:
    return max(r["accuracy"] for r in curve if r["step"] > 0)


def race(curves: dict[str, dict[int, list[dict]]], fast: str, slow: str, target_arm: str, key: str) -> dict:
    """Who reaches ``target_arm``'s peak first, per seed, in ``key`` (``"step"`` or ``"train_seconds"``)."""
    wins = losses = ties = 0
    fast_at: list[float] = []
    slow_at: list[float] = []
    fast_reached = 0
    for seed in sorted(curves[target_arm]):
        target = peak(curves[target_arm][seed])
        hit_fast = first_reaching(curves[fast][seed], target)
        hit_slow = first_reaching(curves[slow][seed], target)
        assert hit_slow is not None or slow != target_arm  # an arm always reaches its own peak
        if hit_fast is not None:
            fast_reached += 1
            fast_at.append(hit_fast[key])
        if hit_slow is not None:
            slow_at.append(hit_slow[key])
        a = math.inf if hit_fast is None else hit_fast[key]
        b = math.inf if hit_slow is None else hit_slow[key]
        if a < b:
            wins += 1
        elif a > b:
            losses += 1
        else:
            ties += 1
    return {
        "fast": fast,
        "slow": slow,
        "target": f"{target_arm}'s peak",
        "key": key,
        "fast_first": wins,
        "slow_first": losses,
        "ties": ties,
        "fast_reached": fast_reached,
        "seeds": len(curves[target_arm]),
        "fast_mean_where_reached": statistics.fmean(fast_at) if fast_at else math.nan,
        "slow_mean": statistics.fmean(slow_at) if slow_at else math.nan,
        "p": sign_test(wins, losses),
    }


def at_step(curve: list[dict], step: int) -> dict:
    return next(r for r in curve if r["step"] == step)


def training_accuracy(logs: list[dict], step: int, window: int) -> float:
    """Mean training reward (the sampled responses' accuracy on training prompts) of the ``window`` steps up to
    ``step``."""
    rows = [r["reward"] for r in logs if step - window < r["step"] <= step]
    return statistics.fmean(rows)


def regime_reproduction(curves: dict[str, dict[int, list[dict]]]) -> dict:
    """Whether the new ``grpo`` and ``vineppo_k4`` runs reproduce the regime study's records of the same seed at steps
    20 and 40 (the protocol's check: more evaluations and the KL sample must not touch training)."""
    checked = matched = 0
    mismatches = []
    for arm in ("grpo", "vineppo_k4"):
        for seed, curve in curves[arm].items():
            path = REGIME_RUNS / TASK / f"seed{seed}" / f"{arm}.jsonl"
            if not path.exists():
                continue
            old = {r["step"]: r for r in map(json.loads, path.read_text().splitlines()) if r}
            for step in (20, 40):
                checked += 1
                new = at_step(curve, step)
                if (
                    new["accuracy"] == old[step]["accuracy"]
                    and new["sampled_tokens"] == old[step]["sampled_tokens"]
                ):
                    matched += 1
                else:
                    mismatches.append(f"{arm} seed {seed} step {step}")
    return {"checked": checked, "identical": matched, "mismatches": mismatches}


def stage1(root: Path = RUNS) -> dict:
    """The protocol's stage 1: VinePPO K = 4 against PPO (and GRPO) on ``demo_plateau``."""
    stats = _stats()
    curves = {arm: load_curves(root, TASK, arm, SEEDS) for arm in STAGE1_ARMS}
    finished = {arm: sorted(c) for arm, c in curves.items()}
    complete = all(len(finished[arm]) == len(SEEDS) for arm in STAGE1_ARMS)
    out: dict[str, Any] = {
        "task": TASK,
        "arms": list(STAGE1_ARMS),
        "finished": {arm: len(seeds) for arm, seeds in finished.items()},
        "runs_expected": len(SEEDS) * len(STAGE1_ARMS),
        "complete": complete,
        "command": STAGE1_COMMAND,
    }
    if not complete:
        return out
    last = max(r["step"] for r in curves["ppo"][0])
    steps = sorted(r["step"] for r in curves["ppo"][0])

    def finals(arm: str, field: str = "accuracy") -> list[float]:
        return [at_step(curves[arm][s], last)[field] for s in SEEDS]

    m1 = stats.paired_t_test([a - b for a, b in zip(finals("vineppo_k4"), finals("ppo"), strict=True)])
    m2 = race(curves, "vineppo_k4", "ppo", "ppo", "step")
    m3 = race(curves, "vineppo_k4", "ppo", "ppo", "train_seconds")
    kl_v, kl_p = finals("vineppo_k4", "kl_to_start"), finals("ppo", "kl_to_start")
    m4 = stats.paired_t_test([a - b for a, b in zip(kl_v, kl_p, strict=True)])
    holm = stats.holm_adjust([m1["p"], m2["p"], m3["p"], m4["p"]])
    for test, adjusted in zip((m1, m2, m3, m4), holm, strict=True):
        test["p_holm"] = adjusted
        test["rejects"] = adjusted < ALPHA
    vs_grpo = stats.paired_t_test([a - b for a, b in zip(finals("vineppo_k4"), finals("grpo"), strict=True)])
    ppo_vs_grpo = stats.paired_t_test([a - b for a, b in zip(finals("ppo"), finals("grpo"), strict=True)])

    def mean_se(xs: list[float]) -> list[float]:
        return [statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))]

    curve_means = {
        arm: [
            {
                "step": step,
                "accuracy": mean_se([at_step(curves[arm][s], step)["accuracy"] for s in SEEDS]),
                "kl_to_start": mean_se([at_step(curves[arm][s], step)["kl_to_start"] for s in SEEDS]),
                "train_seconds": statistics.fmean(
                    at_step(curves[arm][s], step)["train_seconds"] for s in SEEDS
                ),
                "sampled_tokens": statistics.fmean(
                    at_step(curves[arm][s], step)["sampled_tokens"] for s in SEEDS
                ),
                "training_accuracy": (
                    statistics.fmean(training_accuracy(load_logs(root, TASK, arm, s), step, 5) for s in SEEDS)
                    if step > 0
                    else None
                ),
            }
            for step in steps
        ]
        for arm in STAGE1_ARMS
    }
    seconds_ratio = stats.paired_t_test(
        [
            math.log(
                at_step(curves["vineppo_k4"][s], last)["train_seconds"]
                / at_step(curves["ppo"][s], last)["train_seconds"]
            )
            for s in SEEDS
        ]
    )
    out.update(
        last_step=last,
        eval_steps=steps,
        final_accuracy={arm: mean_se(finals(arm)) for arm in STAGE1_ARMS},
        final_kl={arm: mean_se(finals(arm, "kl_to_start")) for arm in STAGE1_ARMS},
        m1_accuracy=m1,
        m2_steps_to_ppo_peak=m2,
        m3_seconds_to_ppo_peak=m3,
        m4_kl=m4,
        vineppo_minus_grpo=vs_grpo,
        ppo_minus_grpo=ppo_vs_grpo,
        steps_to_grpo_peak=race(curves, "vineppo_k4", "grpo", "grpo", "step"),
        seconds_to_grpo_peak=race(curves, "vineppo_k4", "grpo", "grpo", "train_seconds"),
        # exp of the mean log ratio and its interval: VinePPO's training seconds per run over PPO's
        seconds_per_run_ratio={
            "ratio": math.exp(seconds_ratio["mean"]),
            "ci95": [math.exp(x) for x in seconds_ratio["ci95"]],
        },
        curves=curve_means,
        vineppo_minus_ppo_by_step=[
            {"step": step}
            | stats.paired_t_test(
                [
                    at_step(curves["vineppo_k4"][s], step)["accuracy"]
                    - at_step(curves["ppo"][s], step)["accuracy"]
                    for s in SEEDS
                ]
            )
            for step in steps
            if step > 0
        ],
        reproduction=regime_reproduction(curves),
        cost_model=cost_model_estimate(root),
    )
    return out


def cost_model_estimate(root: Path) -> dict:
    """Per run, the cost model's tokens ``generated + r x trained`` with r = 0.4 (vLLM on GPUs) for each arm, mean over
    seeds; a PPO step trains the critic on the same responses, counted as a second trained pass."""
    from mcadvantage.evaluation.cost_model import cost_model_tokens

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from learning_efficiency import _tokens_per_step  # one definition of what a run sampled and trained

    out = {}
    for arm in STAGE1_ARMS:
        costs = []
        for seed in SEEDS:
            info = json.loads((root / TASK / f"seed{seed}" / f"{arm}.done.json").read_text())
            sampled, trained = _tokens_per_step(info)
            trained *= 2 if arm == "ppo" else 1
            costs.append(info["steps"] * cost_model_tokens(sampled, trained, GPU_COST_RATIO))
        out[arm] = statistics.fmean(costs)
    return {"r": GPU_COST_RATIO, "tokens": out, "vineppo_over_ppo": out["vineppo_k4"] / out["ppo"]}


def stage2(root: Path = RUNS) -> dict:
    """The protocol's stage 2: VinePPO and PPO at three temperatures, a third of training."""
    stats = _stats()
    out: dict[str, Any] = {"task": TASK, "temperatures": list(TEMPERATURES), "command": STAGE2_COMMAND}
    arms = [f"{a}_t{t}" for t in TEMPERATURES for a in ("ppo", "vineppo_k4")]
    curves = {arm: load_curves(root, TASK, arm, SEEDS) for arm in arms}
    out["finished"] = {arm: len(c) for arm, c in curves.items()}
    out["runs_expected"] = len(SEEDS) * len(arms)
    out["complete"] = all(len(c) == len(SEEDS) for c in curves.values())
    if not out["complete"]:
        return out
    rows, ps = [], []
    for t in TEMPERATURES:
        v, p = curves[f"vineppo_k4_t{t}"], curves[f"ppo_t{t}"]
        start = v[SEEDS[0]][0]["accuracy"]
        v_last = [v[s][-1]["accuracy"] for s in SEEDS]
        p_last = [p[s][-1]["accuracy"] for s in SEEDS]
        test = stats.paired_t_test([a - b for a, b in zip(v_last, p_last, strict=True)])
        ps.append(test["p"])
        rows.append(
            {
                "temperature": t,
                "vineppo": statistics.fmean(v_last),
                "ppo": statistics.fmean(p_last),
                "test": test,
                "diverged": {
                    "vineppo": sum(a < start - DIVERGED_BELOW_START for a in v_last),
                    "ppo": sum(a < start - DIVERGED_BELOW_START for a in p_last),
                },
                "kl": {
                    "vineppo": statistics.fmean(v[s][-1]["kl_to_start"] for s in SEEDS),
                    "ppo": statistics.fmean(p[s][-1]["kl_to_start"] for s in SEEDS),
                },
            }
        )
    for row, adjusted in zip(rows, stats.holm_adjust(ps), strict=True):
        row["test"]["p_holm"] = adjusted
    out["rows"] = rows
    return out


# ---- rows ------------------------------------------------------------------------------------------------------


def _dig(obj: Any, keys: list[Any]) -> Any:
    for key in keys:
        obj = obj[key]
    return obj


def _fmt_ci(ci: list[float], spec: str = "+.3f") -> str:
    return f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def _p(test: dict) -> str:
    holm = f", Holm {test['p_holm']:.3g}" if "p_holm" in test else ""
    return f"p {test['p']:.3g}{holm}"


def _paired_verdict(test: dict, paper_direction: int) -> str:
    """The protocol's reading of a paired test whose paper claim has sign ``paper_direction``."""
    p = test.get("p_holm", test["p"])
    if p < ALPHA:
        return "holds" if math.copysign(1, test["mean"]) == paper_direction else "does not hold"
    return "inconclusive"


def _race_text(r: dict, unit: str, slow_name: str = "PPO") -> str:
    spec = ".0f" if unit == "steps" else ".0f"
    reached = f"VinePPO reached it in {r['fast_reached']}/{r['seeds']} seeds"
    mean = (
        ""
        if math.isnan(r["fast_mean_where_reached"])
        else f", at {r['fast_mean_where_reached']:{spec}} {unit} on average"
    )
    return (
        f"{reached}{mean}; {slow_name} at {r['slow_mean']:{spec}} {unit}. VinePPO first in {r['fast_first']} seeds, "
        f"{slow_name} in {r['slow_first']}, ties {r['ties']}"
    )


def new_study_row(kind: str, s1: dict, s2: dict) -> dict:
    """``ours``, ``ci`` and ``verdict`` of a row the paper-claims study measures (``kind``: which measure)."""
    stage, measure = kind.split(":")
    study = s1 if stage == "stage1" else s2
    if stage not in ("stage1", "stage2"):
        return {"ours": "not measured yet (protocol " + stage + ")", "ci": "", "verdict": "not measured yet",
                "why": f"the protocol's {stage} has not run"}  # fmt: skip
    if not study["complete"]:
        done = sum(study["finished"].values())
        return {
            "ours": f"not measured yet: {done} of {study['runs_expected']} runs finished",
            "ci": "",
            "verdict": "not measured yet",
            "why": f"the protocol reads {stage} only when all its runs have finished",
        }
    if kind == "stage1:accuracy":
        t = study["m1_accuracy"]
        fa = study["final_accuracy"]
        return {
            "ours": f"VinePPO K=4 {fa['vineppo_k4'][0]:.3f}, PPO {fa['ppo'][0]:.3f}: {t['mean']:+.3f} ({_p(t)})",
            "ci": _fmt_ci(t["ci95"]),
            "verdict": _paired_verdict(t, +1),
            "why": "M1, paired by seed, 12 seeds",
        }
    if kind in ("stage1:steps", "stage1:seconds"):
        r = study["m2_steps_to_ppo_peak" if kind == "stage1:steps" else "m3_seconds_to_ppo_peak"]
        unit = "steps" if kind == "stage1:steps" else "s"
        ratio = r["slow_mean"] / r["fast_mean_where_reached"] if r["fast_reached"] else math.nan
        verdict = (
            ("holds" if r["fast_first"] > r["slow_first"] else "does not hold")
            if r["p_holm"] < ALPHA
            else "inconclusive"
        )
        return {
            "ours": f"{_race_text(r, unit)} ({_p(r)}); ratio of means {ratio:.2f}x",
            "ci": "sign test",
            "verdict": verdict,
            "why": "M2" if unit == "steps" else "M3 (1 CPU thread per run)",
        }
    if kind == "stage1:kl":
        t = study["m4_kl"]
        kl = study["final_kl"]
        return {
            "ours": f"KL at step {study['last_step']}: VinePPO {kl['vineppo_k4'][0]:.3f}, PPO {kl['ppo'][0]:.3f}: "
            f"{t['mean']:+.3f} ({_p(t)})",
            "ci": _fmt_ci(t["ci95"]),
            "verdict": _paired_verdict(t, -1),
            "why": "M4: the paper's frontier claim read as less KL for the accuracy reached; accuracy is M1",
        }
    if kind in ("stage1:grpo_peak_steps", "stage1:grpo_peak_seconds"):
        r = study["steps_to_grpo_peak" if kind.endswith("steps") else "seconds_to_grpo_peak"]
        unit = "steps" if kind.endswith("steps") else "s"
        ratio = r["slow_mean"] / r["fast_mean_where_reached"] if r["fast_reached"] else math.nan
        return {
            "ours": _race_text(r, unit, slow_name="GRPO") + f" ({_p(r)}); ratio of means {ratio:.2f}x",
            "ci": "sign test",
            "verdict": ("holds" if r["fast_first"] > r["slow_first"] else "does not hold")
            if r["p"] < ALPHA
            else "inconclusive",
            "why": "descriptive (outside the Holm family)",
        }
    if kind == "stage1:generalization":
        pts = {arm: study["curves"][arm][-1] for arm in ("vineppo_k4", "ppo")}
        return {
            "ours": "at step {s}: VinePPO train {tv:.3f} / held-out {hv:.3f}, PPO train {tp:.3f} / held-out {hp:.3f}".format(
                s=study["last_step"],
                tv=pts["vineppo_k4"]["training_accuracy"],
                hv=pts["vineppo_k4"]["accuracy"][0],
                tp=pts["ppo"]["training_accuracy"],
                hp=pts["ppo"]["accuracy"][0],
            ),
            "ci": f"held-out SE {pts['vineppo_k4']['accuracy'][1]:.3f} / {pts['ppo']['accuracy'][1]:.3f}",
            "verdict": "see the curve",
            "why": "descriptive: held-out and training accuracy at every evaluation are in the stage-1 table and plot",
        }
    if kind == "stage1:throughout":
        diffs = study["vineppo_minus_ppo_by_step"]
        ahead = sum(1 for d in diffs if d["mean"] > 0)
        significant = sum(1 for d in diffs if d["ci95"][0] > 0)
        behind = sum(1 for d in diffs if d["ci95"][1] < 0)
        return {
            "ours": f"VinePPO minus PPO at the {len(diffs)} evaluations after step 0: ahead in {ahead}, significantly "
            f"ahead in {significant}, significantly behind in {behind}; at step {diffs[0]['step']}: "
            f"{diffs[0]['mean']:+.3f}, at step {diffs[len(diffs) // 2]['step']}: {diffs[len(diffs) // 2]['mean']:+.3f}",
            "ci": "per step, paired t (unadjusted)",
            "verdict": "holds"
            if significant == len(diffs)
            else ("holds partly" if ahead > len(diffs) / 2 else "does not hold"),
            "why": "descriptive (outside the Holm family)",
        }
    if kind == "stage1:cost":
        ratio = study["seconds_per_run_ratio"]
        cm = study["cost_model"]
        return {
            "ours": f"training seconds per 40-step run, VinePPO K=4 over PPO, one CPU thread: {ratio['ratio']:.2f}x; "
            f"the cost model's GPU estimate (r = {cm['r']}): {cm['vineppo_over_ppo']:.2f}x",
            "ci": _fmt_ci(ratio["ci95"], ".2f"),
            "verdict": "holds"
            if ratio["ci95"][0] > 1
            else ("does not hold" if ratio["ci95"][1] < 1 else "inconclusive"),
            "why": "geometric mean of the per-seed ratio, 12 seeds",
        }
    if kind == "stage2:temperature":
        hi = next(r for r in study["rows"] if r["temperature"] == max(TEMPERATURES))
        t = hi["test"]
        holds = t["p_holm"] < ALPHA and t["mean"] > 0 and hi["diverged"]["ppo"] > hi["diverged"]["vineppo"]
        return {
            "ours": f"T = 1.0, step 14: VinePPO {hi['vineppo']:.3f}, PPO {hi['ppo']:.3f}: {t['mean']:+.3f} ({_p(t)}); "
            f"diverged: VinePPO {hi['diverged']['vineppo']}/12, PPO {hi['diverged']['ppo']}/12",
            "ci": _fmt_ci(t["ci95"]),
            "verdict": "holds"
            if holds
            else ("does not hold" if t["p_holm"] < ALPHA and t["mean"] < 0 else "inconclusive"),
            "why": "stage 2, Holm over three temperatures",
        }
    raise ValueError(f"unknown measure {kind!r} in {CATALOGUE}")


def existing_row(entry: dict) -> dict:
    """A row answered by another study's committed result: its numbers read from the result file by key path."""
    source = entry["source"]
    data = json.loads((ROOT / source["file"]).read_text())
    values = {name: _dig(data, keys) for name, keys in source["values"].items()}
    return {
        "ours": source["ours"].format(**values),
        "ci": source.get("ci", "").format(**values),
        "verdict": entry["verdict"],
        "why": entry["why"],
    }


def build(root: Path = RUNS) -> dict:
    catalogue = json.loads(CATALOGUE.read_text())
    s1, s2 = stage1(root), stage2(root)
    claims = []
    for entry in catalogue["claims"]:
        if "measure" in entry:
            row = new_study_row(entry["measure"], s1, s2)
            command = {"stage1": STAGE1_COMMAND, "stage2": STAGE2_COMMAND}.get(
                entry["measure"].split(":")[0], ""
            )
        elif "source" in entry:
            row = existing_row(entry)
            command = entry["command"]
        else:
            row = {"ours": "", "ci": "", "verdict": "not measurable here", "why": entry["why"]}
            command = ""
        claims.append(
            {
                "id": entry["id"],
                "section": entry["section"],
                "claim": entry["claim"],
                "paper": entry["paper"],
                "where": entry["where"],
                **row,
                "command": command,
            }
        )
    return {
        "command": COMMAND,
        "protocol": "docs/paper-claims-protocol.md",
        "claims": claims,
        "studies": {"stage1": s1, "stage2": s2},
    }


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_page(result: dict) -> str:
    """``docs/paper-claims.md`` from ``paper_claims.json`` alone."""
    lines = [
        "# The paper's claims, side by side",
        "",
        "<!-- Generated by `python benchmarks/paper_claims.py` from benchmarks/results/paper_claims.json; do not edit. -->",
        "",
        "Every quantitative claim of the VinePPO paper (arXiv 2410.01679), the paper's number and setting, our",
        "measurement on the closest comparison we can run, and a verdict. The new measurements follow the",
        "[protocol](paper-claims-protocol.md), committed before any run; the others come from the studies named in",
        "each row's command. Our scale is a 1M-parameter policy on synthetic GSM8K-format arithmetic on 2 CPU cores,",
        "not a 1B-7B model on MATH and GSM8K on GPUs: a verdict says what holds here, not what holds there.",
        "",
    ]
    sections: dict[str, list[dict]] = {}
    for row in result["claims"]:
        sections.setdefault(row["section"], []).append(row)
    for section, rows in sections.items():
        lines += [f"## {section}", "", "| claim | paper | ours | 95% CI | verdict |", "|---|---|---|---|---|"]
        for row in rows:
            verdict = f"**{row['verdict']}**" + (f": {row['why']}" if row["why"] else "")
            lines.append(
                f"| {_cell(row['claim'])} ({_cell(row['where'])}) | {_cell(row['paper'])} | {_cell(row['ours'])} "
                f"| {_cell(row['ci'])} | {_cell(verdict)} |"
            )
        lines.append("")
    lines += ["## Commands", "", "| claim | command |", "|---|---|"]
    for row in result["claims"]:
        if row["command"]:
            lines.append(f"| `{row['id']}` | `{_cell(row['command'])}` |")
    lines.append("")
    s1 = result["studies"]["stage1"]
    lines += ["## Stage 1 in detail", ""]
    if not s1["complete"]:
        lines += [
            f"Not all runs have finished ({sum(s1['finished'].values())} of {s1['runs_expected']}); the protocol reads",
            "nothing until they have.",
            "",
        ]
    else:
        rep = s1["reproduction"]
        lines += [
            f"Reproduction check: {rep['identical']} of {rep['checked']} step-20 and step-40 records of the new `grpo` and "
            "`vineppo_k4` runs equal the regime study's records of the same seed"
            + (f" (different: {', '.join(rep['mismatches'])})." if rep["mismatches"] else "."),
            "",
            "| arm | step | held-out accuracy | KL to start | training accuracy | training s | sampled tokens |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for arm, points in s1["curves"].items():
            for pt in points:
                train = "" if pt["training_accuracy"] is None else f"{pt['training_accuracy']:.3f}"
                lines.append(
                    f"| `{arm}` | {pt['step']} | {pt['accuracy'][0]:.3f} ± {pt['accuracy'][1]:.3f} | "
                    f"{pt['kl_to_start'][0]:.3f} ± {pt['kl_to_start'][1]:.3f} | {train} | {pt['train_seconds']:.0f} | "
                    f"{pt['sampled_tokens']:,.0f} |"
                )
        cm = s1["cost_model"]
        ratio = s1["seconds_per_run_ratio"]
        lines += [
            "",
            "The curves, held-out accuracy against KL to the start (the accuracy-KL frontier) and against training "
            "accuracy (generalization): `benchmarks/results/paper_claims_stage1.png`.",
            "",
            f"Cost per run: VinePPO's training seconds over PPO's, on one CPU thread, {ratio['ratio']:.2f}x "
            f"{_fmt_ci(ratio['ci95'], '.2f')}; the cost model's GPU estimate (r = {cm['r']}) "
            f"{cm['vineppo_over_ppo']:.2f}x.",
            "",
        ]
    return "\n".join(lines)


FIGURE = RESULTS / "paper_claims_stage1.png"


def plot_stage1(study: dict, path: Path = FIGURE) -> Path:
    """Two panels from stage 1's mean curves: held-out accuracy against KL to the start (the accuracy-KL frontier,
    Fig 6 of the paper) and against training accuracy (generalization, Fig C.4), one line per arm, every evaluation a
    point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (frontier, general) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, (arm, points) in enumerate(study["curves"].items()):
        colour = f"C{i}"
        kl = [pt["kl_to_start"][0] for pt in points]
        acc = [pt["accuracy"][0] for pt in points]
        se = [pt["accuracy"][1] for pt in points]
        frontier.errorbar(kl, acc, yerr=se, fmt="o-", color=colour, label=arm, capsize=2)
        trained = [
            (pt["training_accuracy"], pt["accuracy"][0])
            for pt in points
            if pt["training_accuracy"] is not None
        ]
        general.plot([t for t, _ in trained], [a for _, a in trained], "o-", color=colour, label=arm)
    frontier.set_xlabel("KL(policy || start), nats per response (mean over seeds)")
    frontier.set_ylabel("held-out accuracy (mean ± SE over 12 seeds)")
    general.set_xlabel("training accuracy (mean reward of the 5 steps before)")
    for ax in (frontier, general):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Stage 1 on {study['task']}: accuracy against KL and against training accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(RUNS), help="the paper-claims study's run records")
    parser.add_argument("--json", default=str(OUT_JSON))
    parser.add_argument("--page", default=str(PAGE))
    args = parser.parse_args(argv)
    result = build(Path(args.root))
    tmp = Path(args.json).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, allow_nan=True), encoding="utf-8")
    os.replace(tmp, args.json)
    Path(args.page).write_text(render_page(result), encoding="utf-8")
    if result["studies"]["stage1"]["complete"]:
        print(f"wrote {plot_stage1(result['studies']['stage1'])}")
    for row in result["claims"]:
        print(f"{row['id']:<32} {row['verdict']:<20} {row['ours'][:90]}")
    print(f"wrote {args.json} and {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
