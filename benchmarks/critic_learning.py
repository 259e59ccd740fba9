"""Does PPO's critic (``advantage_estimator="gae"``) learn on ``demo_plateau``? Fresh-state explained variance and
value error, offline (a fixed policy) and in PPO runs (issue 40, part 1).

    python benchmarks/critic_learning.py                        # both parts, then the table
    python benchmarks/critic_learning.py --part offline         # critic settings on the starting policy's batches
    python benchmarks/critic_learning.py --part online --seeds 0 1 2                   # the 'tuned' arm
    python benchmarks/critic_learning.py --part online --arms warmup40 --seeds 0 1 2   # a 40-step warm-up
    python benchmarks/critic_learning.py --report               # the table from what is there, run nothing

Every number is measured on FRESH states: a batch's values are read before the critic's update on that batch (the
estimator's ``explained_variance_fresh`` and ``value_error_fresh``), so they say how well the critic predicts, not
how well it fits what it has seen.

- **offline**: ``--batches`` batches of 4 prompts x 8 responses sampled once from the ``demo_plateau`` starting
  policy (temperature 0.6, the RL arms' setting), cached in ``<root>/pool.pt``. Each critic setting (:data:`OFFLINE`)
  trains a fresh ``CriticEstimator`` on the first 40 batches in order, one batch a step, as the trainer would; each
  batch is scored before its update. The last 12 batches are a held-out set scored after the 40 steps. The policy does
  not move, so this isolates what the critic can learn from what a moving policy adds. The learning-rate grid is the
  policy's ``rl_lr`` (1e-4) times 1, 10, 30 and 100.
- **online**: PPO runs (the learning-efficiency benchmark's ``ppo`` arm: ``mcadvantage.demo.arms.rl_training_args``)
  from the same start with the settings of :data:`ONLINE`, no held-out evaluation (it does not touch the critic).
  Per step: the logged ``critic/*`` metrics, and from the estimator's pre-update advantages (``R - V(s_t)`` at
  ``gamma = lambda = 1``) the sums that pool explained variance over a window of steps (4 prompts per batch make a
  single batch's number noisy).

Records go to ``<root>`` (``benchmarks/results/critic_learning_runs``; ``offline.jsonl``, ``online_<arm>_seed<N>.jsonl``
written step by step, a finished online run gets ``.done``, nothing finished is rerun); the summary to
``benchmarks/results/critic_learning.json``. The untuned critic's own fresh numbers are read from the paper-claims
study's ``ppo`` records (its logged ``critic/explained_variance`` was already measured before the update).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from _runs import load_runs  # noqa: E402  (beside this file)
from learning_efficiency import task_config, task_data  # noqa: E402  (after the root is on sys.path)

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_ROOT = RESULTS / "critic_learning_runs"
TASK = "demo_plateau"
START = ROOT / "src" / "mcadvantage" / "demo" / "warmup_plateau"  # the shared start of demo_plateau
OLD_PPO_RUNS = RESULTS / "paper_claims_runs"  # the untuned ppo arm's records: <TASK>/seed<N>/ppo.done.json
POLICY_LR = 1e-4  # the RL arms' rl_lr
TRAIN_BATCHES = 40
HELD_OUT_BATCHES = 12
PROMPTS_PER_BATCH, GENERATIONS = 4, 8
SAMPLE_SEED = 123
WINDOW = (31, 40)  # policy steps pooled for the "by step 40" number

#: Offline critic settings (CriticEstimator keyword arguments; "head": "zero" zeroes the new value head). The grid:
#: the critic's learning rate at the policy's times 1, 10, 30, 100, each arm of the study would get the same 4 tries.
OFFLINE: dict[str, dict[str, Any]] = {
    "lr1e-4 (x1, today's default)": {"learning_rate": 1e-4},
    "lr1e-3 (x10)": {"learning_rate": 1e-3},
    # The chosen rate goes on to 120 batches (its numbers at 40 are those of a 40-batch run): does the held-out
    # explained variance keep rising with the batches seen?
    "lr3e-3 (x30)": {"learning_rate": 3e-3, "batches": 120},
    "lr1e-2 (x100)": {"learning_rate": 1e-2},
    "lr1e-4 zero head": {"learning_rate": 1e-4, "head": "zero"},
    "lr3e-3 zero head": {"learning_rate": 3e-3, "head": "zero"},
    "lr3e-3 no value clip": {"learning_rate": 3e-3, "value_clip": 1e9},
    "lr1e-3 minibatch 8": {"learning_rate": 1e-3, "minibatch_size": 8},
}

#: What ``--part offline`` runs by default: the grid, the head's initialisation at the old default and value clipping
#: at the chosen rate (the other settings of :data:`OFFLINE` were tried too; pass them with ``--settings``).
DEFAULT_OFFLINE = [
    "lr1e-4 (x1, today's default)",
    "lr1e-3 (x10)",
    "lr3e-3 (x30)",
    "lr1e-2 (x100)",
    "lr1e-4 zero head",
]

#: Online PPO settings (VinePPOConfig overrides of the ppo arm); "policy_steps" policy steps follow the warm-up.
ONLINE: dict[str, dict[str, Any]] = {
    "tuned": {"critic_learning_rate": 3e-3, "critic_warmup_steps": 10},
    # The fixed-policy critic passed 0.3 on held-out batches after 40 batches (offline, lr 3e-3): the same critic
    # warmed up for 40 steps before the policy moves (issue 40, second online try).
    "warmup40": {"critic_learning_rate": 3e-3, "critic_warmup_steps": 40},
}
POLICY_STEPS = 40


# ---- offline -----------------------------------------------------------------------------------------------


def _load_pool(path: Path) -> list[dict[str, Any]]:
    import torch

    return torch.load(path, weights_only=False)  # our own file (sample_pool)


def sample_pool(path: Path, batches: int) -> list[dict[str, Any]]:
    """``batches`` batches sampled from the starting policy (cached in ``path``): one dict per response."""
    import torch

    if path.exists():
        pool = torch.load(path, weights_only=False)
        if max(r["b"] for r in pool) + 1 >= batches:
            return [r for r in pool if r["b"] < batches]
    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.arms import load_policy
    from mcadvantage.samplers.base import RolloutRequest
    from mcadvantage.samplers.hf import TransformersSampler

    config, data = task_config(TASK, 0), task_data(TASK, 0)
    policy, tok = load_policy(START)
    sampler = TransformersSampler(policy, tok, temperature=config.temperature, max_batch_sequences=1024)
    grade = GSM8KVerifier().score
    torch.manual_seed(SAMPLE_SEED)
    problems = data.rl_set[1000:]  # away from the first prompts the online runs draw
    pool: list[dict[str, Any]] = []
    for b in range(batches):
        chunk = problems[PROMPTS_PER_BATCH * b : PROMPTS_PER_BATCH * (b + 1)]
        prompt_ids = [tok(text=p.prompt)["input_ids"] for p in chunk]  # as GRPO tokenises a plain-text prompt
        samples = sampler.sample(
            [RolloutRequest(tuple(x), GENERATIONS, config.max_completion_length) for x in prompt_ids]
        )
        for problem, ids, continuations in zip(chunk, prompt_ids, samples, strict=True):
            for c in continuations:
                text = tok.decode(list(c.token_ids), skip_special_tokens=True)
                pool.append(
                    {
                        "b": b,
                        "operations": len(problem.operations),
                        "prompt_ids": list(ids),
                        "completion_ids": list(c.token_ids),
                        "reward": float(grade(text, problem.answer)),
                    }
                )
        print(f"sampled batch {b + 1}/{batches}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(pool, path)
    return pool


def _batch(rows: list[dict[str, Any]], mode: str = "train") -> Any:
    import torch

    from mcadvantage.estimators import AdvantageBatch

    width = max(len(r["completion_ids"]) for r in rows)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        mask[i, : len(r["completion_ids"])] = 1
    return AdvantageBatch(
        prompt_ids=[r["prompt_ids"] for r in rows],
        completion_ids=[r["completion_ids"] for r in rows],
        completion_mask=mask,
        rewards_per_func=torch.tensor([[r["reward"]] for r in rows]),
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, len(rows)),
        group_size=GENERATIONS,
        mode=mode,
    )


def _sums(values: list[list[float]], rewards: list[float]) -> dict[str, float]:
    """Sums that pool explained variance over batches: per token (``values[i]`` are response i's token values,
    its target the reward) and per response's first state."""
    out = dict.fromkeys(("n", "g", "gg", "e", "ee", "n0", "g0", "gg0", "e0", "ee0"), 0.0)
    for vs, r in zip(values, rewards, strict=True):
        for v in vs:
            out["n"] += 1
            out["g"] += r
            out["gg"] += r * r
            out["e"] += r - v
            out["ee"] += (r - v) ** 2
        if vs:
            out["n0"] += 1
            out["g0"] += r
            out["gg0"] += r * r
            out["e0"] += r - vs[0]
            out["ee0"] += (r - vs[0]) ** 2
    return out


def pooled(records: list[dict[str, float]], first_state: bool = False) -> dict[str, float]:
    """Explained variance ``1 - Var(G - V) / Var(G)`` and mean squared error ``mean((G - V)^2)`` over the tokens
    (or first states) of several batches' :func:`_sums`."""
    s = "0" if first_state else ""
    n = sum(r["n" + s] for r in records)
    if n < 2:
        return {"explained_variance": math.nan, "value_error": math.nan}
    mean_g = sum(r["g" + s] for r in records) / n
    var_g = sum(r["gg" + s] for r in records) / n - mean_g**2
    mean_e = sum(r["e" + s] for r in records) / n
    mse = sum(r["ee" + s] for r in records) / n
    var_e = mse - mean_e**2
    return {"explained_variance": 1 - var_e / var_g if var_g > 0 else math.nan, "value_error": mse}


def run_offline(name: str, settings: dict[str, Any], pool: list[dict[str, Any]]) -> dict[str, Any]:
    """Train a critic with ``settings`` on the pool's first 40 batches (``settings["batches"]`` to change it); fresh
    metrics per batch, the held-out batches after every 40."""
    import torch

    from mcadvantage.demo.arms import load_policy
    from mcadvantage.estimators import CriticEstimator, EstimatorContext

    settings = dict(settings)
    head = settings.pop("head", "default")
    count = settings.pop("batches", TRAIN_BATCHES)
    batches = [[r for r in pool if r["b"] == b] for b in range(max(r["b"] for r in pool) + 1)]
    if count + HELD_OUT_BATCHES > len(batches):
        raise ValueError(
            f"{name}: {count} training batches and {HELD_OUT_BATCHES} held out need a bigger pool."
        )
    train, held = batches[:count], batches[-HELD_OUT_BATCHES:]
    policy, tok = load_policy(START)
    context = EstimatorContext.single_process(None, [], tok, policy_model=policy, segmenter="newline")
    critic = CriticEstimator(seed=0, **{"minibatch_size": PROMPTS_PER_BATCH * GENERATIONS, **settings})
    critic.ensure_value_model(context)
    if head == "zero":
        with torch.no_grad():
            critic.value_model.score.weight.zero_()
            critic.value_model.score.bias.zero_()

    def token_values(rows: list[dict[str, Any]]) -> list[list[float]]:
        b = _batch(rows)
        width = b.completion_mask.shape[1]
        v = critic.token_values(b.prompt_ids, b.completion_ids, width, grad=False).cpu()
        return [v[i, : len(r["completion_ids"])].tolist() for i, r in enumerate(rows)]

    def held_out(seen: list[float]) -> dict[str, float]:
        held_sums = [_sums(token_values(rows), [r["reward"] for r in rows]) for rows in held]
        constant = statistics.mean(seen)
        held_rewards = [r["reward"] for rows in held for r in rows for _ in r["completion_ids"]]
        return pooled(held_sums) | {
            "batches": len(steps),
            "first_state_explained_variance": pooled(held_sums, first_state=True)["explained_variance"],
            "constant_value_error": statistics.mean((g - constant) ** 2 for g in held_rewards),
            "constant": constant,
        }

    steps: list[dict[str, Any]] = []
    seen: list[float] = []
    curve = []
    t0 = time.perf_counter()
    for step, rows in enumerate(train, start=1):
        sums = _sums(token_values(rows), [r["reward"] for r in rows])  # before the update: fresh
        metrics = critic.estimate(_batch(rows), context).metrics
        steps.append({"step": step, **{k: float(v) for k, v in metrics.items()}, "sums": sums})
        seen += [r["reward"] for r in rows]
        if step % TRAIN_BATCHES == 0:  # the held-out set after 40, 80, ... batches
            curve.append(held_out(seen))
    return {
        "name": name,
        "settings": {k: str(v) for k, v in {**settings, "head": head, "batches": len(train)}.items()},
        "steps": steps,
        "held_out": curve[0],
        "held_out_curve": curve,
        "seconds": time.perf_counter() - t0,
    }


# ---- online ------------------------------------------------------------------------------------------------


def run_online(arm: str, seed: int, root: Path) -> None:
    """One PPO run from the start with :data:`ONLINE` ``[arm]``; a record per step appended to its jsonl."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from mcadvantage import GSM8KVerifier, VinePPOTrainer
    from mcadvantage.demo.arms import rl_training_args
    from mcadvantage.demo.config import parse_arm

    settings = ONLINE[arm]
    warmup = int(settings.get("critic_warmup_steps", 0))
    config = replace(task_config(TASK, seed), rl_steps=warmup + POLICY_STEPS)
    data = task_data(TASK, seed)
    out = root / f"online_{arm}_seed{seed}.jsonl"
    if out.with_suffix(".done").exists():
        return
    out.unlink(missing_ok=True)
    # The ppo arm's config with the critic settings added (an arm's options are VinePPOConfig keyword arguments).
    spec = replace(parse_arm("ppo"), mc_options=tuple(sorted(settings.items())))
    args = rl_training_args(config, spec, root / f"online_{arm}_seed{seed}_trainer")

    class Record(TrainerCallback):
        # on_log: transformers logs a step after its on_step_end, with that step's critic metrics.
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not logs or "reward" not in logs:
                return
            result, critic = trainer.last_advantage_result, trainer.advantage_estimator
            # Pre-update advantages at gamma = lambda = 1 are R - V(s_t); last_values end with each response's R.
            rewards = [vals[-1] for vals in critic.last_values]
            values = [
                [rewards[k] - a for a in result.advantages[i][result.token_mask[i]].tolist()]
                for k, i in enumerate(critic.last_rows)
            ]
            step = int(state.global_step)
            row = {
                "step": step,
                "policy_step": step - warmup,
                # A metric that is NaN for the batch (e.g. explained variance when every reward is equal) is logged
                # as None by TRL: kept as NaN.
                **{
                    k: float(v) if isinstance(v, (int, float)) else math.nan
                    for k, v in logs.items()
                    if v is None or isinstance(v, (int, float))
                },
                "sums": _sums(values, rewards),
                # Rewards by prompt (responses to one prompt are consecutive, GENERATIONS of them): what share of
                # the reward's variance a prompt-level value could explain at this policy (explainable_share).
                "groups": [
                    [r for k, r in enumerate(rewards) if critic.last_rows[k] // GENERATIONS == g]
                    for g in sorted({i // GENERATIONS for i in critic.last_rows})
                ],
            }
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"[{arm} seed {seed}] step {step}: reward {logs['reward']:.2f} explained variance (fresh) "
                f"{row.get('critic/explained_variance_fresh', math.nan):+.2f}",
                flush=True,
            )

    trainer = VinePPOTrainer(
        model=str(START),
        reward_funcs=GSM8KVerifier(),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in data.rl_set]),
        processing_class=AutoTokenizer.from_pretrained(START),
        callbacks=[Record()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    from _machine import machine_info  # beside this file (on the path: see the imports)

    done = {"arm": arm, "seed": seed, "settings": settings, "environment": machine_info()}
    out.with_suffix(".done").write_text(json.dumps(done))


# ---- report ------------------------------------------------------------------------------------------------


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def _window(rows: list[dict[str, Any]], key: str = "step") -> list[dict[str, Any]]:
    return [r for r in rows if WINDOW[0] <= r[key] <= WINDOW[1]]


def _constant_error(rows: list[dict[str, Any]]) -> float:
    """The constant predictor's (mean reward of the earlier training batches) value error over ``rows``, token-weighted."""
    pairs = [
        (
            r["sums"]["n"],
            r[
                "critic/value_error_constant"
                if "critic/value_error_constant" in r
                else "value_error_constant"
            ],
        )
        for r in rows
    ]
    pairs = [(n, e) for n, e in pairs if not math.isnan(e)]
    return sum(n * e for n, e in pairs) / sum(n for n, _ in pairs) if pairs else math.nan


def summarize_offline(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for rec in records:
        window = _window(rec["steps"])
        fresh = pooled([r["sums"] for r in window])
        out.append(
            {
                "name": rec["name"],
                "settings": rec["settings"],
                "fresh_ev_median_31_40": _median([r["explained_variance_fresh"] for r in window]),
                "fresh_ev_pooled_31_40": fresh["explained_variance"],
                "fresh_value_error_31_40": fresh["value_error"],
                "constant_value_error_31_40": _constant_error(window),
                "fresh_first_state_ev_pooled_31_40": pooled([r["sums"] for r in window], first_state=True)[
                    "explained_variance"
                ],
                "held_out_ev": rec["held_out"]["explained_variance"],
                "held_out_value_error": rec["held_out"]["value_error"],
                "held_out_constant_value_error": rec["held_out"]["constant_value_error"],
                "held_out_first_state_ev": rec["held_out"]["first_state_explained_variance"],
                "held_out_curve": rec.get("held_out_curve", []),
                "fresh_ev_per_step": [round(r["explained_variance_fresh"], 4) for r in rec["steps"]],
            }
        )
    return out


def summarize_online(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in ONLINE:
        seeds = {}
        for path in sorted(root.glob(f"online_{arm}_seed*.jsonl")):
            seed = int(path.stem.rsplit("seed", 1)[1])
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            window = _window(rows, "policy_step")
            fresh = pooled([r["sums"] for r in window])
            last = [r for r in rows if r["policy_step"] == WINDOW[1]]
            # The warm-up's last 10 steps (policy still fixed): what the critic knew when the policy started moving.
            warm_end = [r for r in rows if -10 < r["policy_step"] <= 0]
            seeds[seed] = {
                "done": path.with_suffix(".done").exists(),
                "steps": len(rows),
                "fresh_ev_at_policy_step_40": last[0]["critic/explained_variance_fresh"]
                if last
                else math.nan,
                "fresh_ev_median_31_40": _median([r["critic/explained_variance_fresh"] for r in window]),
                "fresh_ev_pooled_31_40": fresh["explained_variance"],
                "fresh_value_error_31_40": fresh["value_error"],
                "constant_value_error_31_40": _constant_error(window),
                "fresh_first_state_ev_pooled_31_40": pooled([r["sums"] for r in window], first_state=True)[
                    "explained_variance"
                ],
                "fresh_ev_pooled_warmup_last_10": pooled([r["sums"] for r in warm_end])["explained_variance"]
                if len(warm_end) == 10
                else math.nan,
                "prompt_level_share_31_40": prompt_level_share(
                    [g for r in window for g in r.get("groups", [])]
                ),
                "prompt_level_share_first_10": prompt_level_share(
                    [g for r in rows[:10] for g in r.get("groups", [])]
                ),
                "mean_reward_31_40": statistics.mean(r["reward"] for r in window) if window else math.nan,
                "mean_value_31_40": statistics.mean(r["critic/mean_value"] for r in window)
                if window
                else math.nan,
                "fresh_ev_per_step": [round(r["critic/explained_variance_fresh"], 4) for r in rows],
                "policy_step_of_row": [r["policy_step"] for r in rows],
            }
        keys = [
            k
            for k in next(iter(seeds.values()), {})
            if k.startswith(("fresh_", "constant_", "mean_", "prompt_")) and "per_step" not in k
        ]
        out[arm] = {
            "settings": ONLINE[arm],
            "seeds": seeds,
            "median_over_seeds": {k: _median([s[k] for s in seeds.values()]) for k in keys},
        }
    return out


def summarize_untuned() -> dict[str, Any]:
    """The study's untuned ppo arm (critic lr = policy lr, no warm-up): its logged critic/explained_variance was read
    before the critic's update on the batch, so it is a fresh-state number too; one critic step per batch, so its
    value_loss is half the fresh mean squared error (the first minibatch's loss is computed before its step)."""
    seeds = {}
    for name, done in load_runs(OLD_PPO_RUNS, f"{TASK}/seed*/ppo.done.json").items():
        logs = done["logs"]
        window = [r for r in logs if WINDOW[0] <= r["step"] <= WINDOW[1]]
        rewards = [r["reward"] for r in logs]
        constant = []
        for r in window:
            earlier = rewards[: int(r["step"]) - 1]
            c = statistics.mean(earlier)
            # response-weighted: E[(R - c)^2] = Var(R) + (mean R - c)^2 (population variance of the batch)
            n = PROMPTS_PER_BATCH * GENERATIONS
            constant.append(r["reward_std"] ** 2 * (n - 1) / n + (r["reward"] - c) ** 2)
        seeds[int(name.split("/")[1][4:])] = {
            "fresh_ev_at_step_40": next(
                (r.get("critic/explained_variance", math.nan) for r in logs if r["step"] == 40), math.nan
            ),
            "fresh_ev_median_31_40": _median([r.get("critic/explained_variance", math.nan) for r in window]),
            "fresh_value_error_31_40": statistics.mean(2 * r["critic/value_loss"] for r in window),
            "constant_value_error_31_40_response_weighted": statistics.mean(constant),
        }
    keys = list(next(iter(seeds.values()), {}))
    return {"seeds": seeds, "median_over_seeds": {k: _median([s[k] for s in seeds.values()]) for k in keys}}


def prompt_level_share(groups: list[list[float]]) -> float:
    """Share of the reward's variance between prompts: the variance of the per-prompt mean rewards less its
    sampling noise (the mean unbiased within-prompt variance / group size) over the rewards' variance."""
    rewards = [r for g in groups for r in g]
    groups = [g for g in groups if len(g) > 1]
    if len(rewards) < 2 or not groups or statistics.pvariance(rewards) == 0:
        return math.nan
    size = statistics.mean(len(g) for g in groups)
    within = statistics.mean(statistics.variance(g) for g in groups)
    return (
        statistics.pvariance([statistics.mean(g) for g in groups]) - within / size
    ) / statistics.pvariance(rewards)


def explainable_share(pool: list[dict[str, Any]]) -> dict[str, float]:
    """How much of the reward's variance a critic could explain at the prompt (the first state), on the pool: the
    between-prompt variance of the success probability (the variance of the 8-sample means less its sampling noise,
    the mean within-prompt variance / 8) over the reward's variance; and what the number of operations alone explains
    (each response predicted by its operation count's mean reward)."""
    groups: dict[tuple[int, ...], list[float]] = {}
    for r in pool:
        groups.setdefault(tuple(r["prompt_ids"]), []).append(r["reward"])
    rewards = [r["reward"] for r in pool]
    var = statistics.pvariance(rewards)
    by_ops: dict[int, list[float]] = {}
    for r in pool:
        by_ops.setdefault(r["operations"], []).append(r["reward"])
    op_mean = {k: statistics.mean(v) for k, v in by_ops.items()}
    residual = statistics.pvariance([r["reward"] - op_mean[r["operations"]] for r in pool])
    return {
        "reward_mean": statistics.mean(rewards),
        "reward_variance": var,
        "prompt_level_ceiling": prompt_level_share(list(groups.values())),
        "operations_only": 1 - residual / var,
        "mean_reward_by_operations": {str(k): v for k, v in sorted(op_mean.items())},
    }


def report(root: Path) -> dict[str, Any]:
    offline_path = root / "offline.jsonl"
    offline = (
        [json.loads(line) for line in offline_path.read_text().splitlines() if line.strip()]
        if offline_path.exists()
        else []
    )
    summary = {
        "task": TASK,
        "policy_lr": POLICY_LR,
        "window": list(WINDOW),
        "learning_rate_grid": [POLICY_LR * m for m in (1, 10, 30, 100)],
        "offline": summarize_offline(offline),
        "offline_explainable": explainable_share(_load_pool(root / "pool.pt"))
        if (root / "pool.pt").exists()
        else {},
        "online": summarize_online(root),
        "untuned_ppo_study_records": summarize_untuned(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "critic_learning.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")

    f = "{:+.3f}".format
    print(
        f"\nOffline (the starting policy's batches; fresh = before each update; window = steps {WINDOW[0]}-{WINDOW[1]})"
    )
    print(
        f"{'setting':32s} {'EV med':>7s} {'EV pool':>7s} {'err':>6s} {'const':>6s} | {'held EV':>7s} {'err':>6s} {'const':>6s}"
    )
    for s in summary["offline"]:
        print(
            f"{s['name']:32s} {f(s['fresh_ev_median_31_40']):>7s} {f(s['fresh_ev_pooled_31_40']):>7s} "
            f"{s['fresh_value_error_31_40']:6.3f} {s['constant_value_error_31_40']:6.3f} | {f(s['held_out_ev']):>7s} "
            f"{s['held_out_value_error']:6.3f} {s['held_out_constant_value_error']:6.3f}"
        )
    e = summary["offline_explainable"]
    if e:
        print(
            f"The starting policy's rewards: mean {e['reward_mean']:.3f}, variance {e['reward_variance']:.3f}; share a "
            f"prompt-level value could explain {e['prompt_level_ceiling']:.2f}, the operation count alone "
            f"{e['operations_only']:.2f} (mean reward by operations {e['mean_reward_by_operations']})"
        )
    for arm, a in summary["online"].items():
        print(
            f"\nOnline PPO '{arm}' {a['settings']} (policy steps {WINDOW[0]}-{WINDOW[1]} after the warm-up)"
        )
        print(
            f"{'seed':>4s} {'EV@40':>7s} {'EV med':>7s} {'EV pool':>7s} {'err':>6s} {'const':>6s} {'EV s0':>7s} {'reward':>6s} {'value':>6s}"
            f" {'ceiling':>7s} {'EV warm-up end':>14s}"
        )
        for seed, s in sorted(a["seeds"].items()) + [("med", a["median_over_seeds"])]:
            print(
                f"{seed!s:>4s} {f(s['fresh_ev_at_policy_step_40']):>7s} {f(s['fresh_ev_median_31_40']):>7s} "
                f"{f(s['fresh_ev_pooled_31_40']):>7s} {s['fresh_value_error_31_40']:6.3f} "
                f"{s['constant_value_error_31_40']:6.3f} {f(s['fresh_first_state_ev_pooled_31_40']):>7s} "
                f"{s['mean_reward_31_40']:6.3f} {s['mean_value_31_40']:6.3f} {f(s['prompt_level_share_31_40']):>7s} "
                f"{f(s['fresh_ev_pooled_warmup_last_10']):>14s}"
            )
    u = summary["untuned_ppo_study_records"]["median_over_seeds"]
    if u:
        print(
            f"\nUntuned ppo arm of the study ({len(summary['untuned_ppo_study_records']['seeds'])} seeds, median): EV at "
            f"step 40 {f(u['fresh_ev_at_step_40'])}, median EV steps 31-40 {f(u['fresh_ev_median_31_40'])}, value "
            f"error {u['fresh_value_error_31_40']:.3f} vs constant {u['constant_value_error_31_40_response_weighted']:.3f}"
        )
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["offline", "online", "all"], default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--arms", nargs="+", default=list(ONLINE), help=f"online settings, of {sorted(ONLINE)}"
    )
    parser.add_argument(
        "--settings", nargs="+", default=DEFAULT_OFFLINE, help="offline settings (names of OFFLINE)"
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="only aggregate what is there")
    args = parser.parse_args(argv)
    if not args.report:
        import torch

        from mcadvantage.demo.run import _quiet_libraries

        _quiet_libraries()
        torch.set_num_threads(max(1, min(args.threads, os.cpu_count() or 1)))
        args.root.mkdir(parents=True, exist_ok=True)
        if args.part in ("offline", "all"):
            needed = max(OFFLINE[name].get("batches", TRAIN_BATCHES) for name in args.settings)
            pool = sample_pool(args.root / "pool.pt", needed + HELD_OUT_BATCHES)
            path = args.root / "offline.jsonl"
            done = (
                {json.loads(line)["name"] for line in path.read_text().splitlines()}
                if path.exists()
                else set()
            )
            for name in args.settings:
                if name in done:
                    continue
                record = run_offline(name, OFFLINE[name], pool)
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"offline {name}: {record['seconds']:.0f} s", flush=True)
        if args.part in ("online", "all"):
            for arm in args.arms:
                for seed in args.seeds:
                    run_online(arm, seed, args.root)
    report(args.root)


if __name__ == "__main__":
    main()
