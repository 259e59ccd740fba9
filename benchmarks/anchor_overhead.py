"""Wall-clock overhead of ``advantage_estimator="anchor"`` over GRPO's advantage computation, at H = 16 (issue 49).

    python benchmarks/anchor_overhead.py [--rounds 200] [--out benchmarks/results/anchor_overhead.json]

The anchor credit samples nothing, so its only cost is CPU time in the advantage phase (grouping the turns by key,
the step-group statistics, writing per-turn values into the token tensor) and the ``state_key`` reads during GRPO's
tool loop. On one batch of the testbed's shape at H = 16 (``--prompts`` x ``--group`` episodes of
:class:`testbed.agent_env.AgentTask` played by :class:`~testbed.agent_env.KeyPolicy`; each model turn
``--turn-tokens`` tokens, each tool result ``--tool-tokens``; keys the true ``(turn, state)`` the environment's
``state_key`` gives), every round times, in a rotating order:

* ``grpo``: :class:`~mcadvantage.estimators.GRPOEstimator` ``.estimate`` (GRPO's advantage computation);
* ``anchor``, ``anchor_pooled``, ``anchor_observation``: :class:`~mcadvantage.estimators.anchor.AnchorEstimator`
  ``.estimate`` (normalized with state keys, pooled, and keys from the tool results' tokens), each plus the
  recording's reads of ``AgentEnv.state_key`` (one per episode per turn: what the trainer adds to the tool loop);
* ``step``: one forward and backward pass of the testbed's tiny agent model (:func:`testbed.agent_policy.build_agent_model`,
  a random 1M-parameter Llama) over the batch's tokens: a lower bound on a training step's time (a real model, the
  generation and the optimizer only add to it).

Reported per arm: the median time per round; per anchor arm, its overhead over ``grpo`` (paired by round: the mean
difference with a 95% Student-t interval) and that overhead as a share of ``step`` (the goal: under 2%).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _machine import machine_info, uptime  # noqa: E402

from mcadvantage.estimators import AdvantageBatch, EstimatorContext, GRPOEstimator  # noqa: E402
from mcadvantage.estimators.anchor import AnchorEstimator  # noqa: E402
from testbed.agent_env import AgentEnv, AgentTask, KeyPolicy, simulate_episode  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "anchor_overhead.json"
T_CRIT = 1.96  # rounds >= 100: the normal quantile stands in for Student's t


def build_batch(horizon: int, prompts: int, group: int, turn_tokens: int, tool_tokens: int, seed: int):
    """``(batch, tasks, choices)``: a batch of the testbed's shape with true state keys, the tasks and each
    episode's choices (to replay the environments' ``state_key`` reads)."""
    rng = random.Random(seed)
    tasks = [AgentTask("recovery", horizon, key=rng.randrange(4)) for _ in range(prompts)]
    policy = KeyPolicy(0.5)
    ids, masks, keys, rewards, prompt_ids, choices = [], [], [], [], [], []
    for p, task in enumerate(tasks):
        for _ in range(group):
            ep = simulate_episode(task, policy, rng)
            seq, mask = [], []
            for t in range(len(ep.choices) + 1):
                if t:
                    seq += [50 + ep.states[t]] * tool_tokens
                    mask += [0] * tool_tokens
                seq += [10 + (ep.choices[t] if t < len(ep.choices) else 9)] * turn_tokens
                mask += [1] * turn_tokens
            ids.append(seq)
            masks.append(mask)
            keys.append([(t, s) for t, s in enumerate(ep.states)])
            rewards.append(ep.reward)
            prompt_ids.append([1, 2, 3 + p] * 20)
            choices.append(ep.choices)
    width = max(len(s) for s in ids)
    completion_mask = torch.zeros(len(ids), width)
    tool_mask = torch.ones(len(ids), width, dtype=torch.long)
    for r, (seq, mask) in enumerate(zip(ids, masks, strict=True)):
        completion_mask[r, : len(seq)] = 1
        tool_mask[r, : len(seq)] = torch.tensor(mask)
    batch = AdvantageBatch(
        prompt_ids=prompt_ids, completion_ids=ids, completion_mask=completion_mask,
        rewards_per_func=torch.tensor(rewards).view(-1, 1), reward_weights=torch.ones(1),
        local_slice=slice(0, len(ids)), group_size=group, tool_mask=tool_mask, turn_keys=keys,
    )  # fmt: skip
    return batch, tasks, choices


def key_reads(tasks: list[AgentTask], group: int, choices: list[tuple[int, ...]]) -> Callable[[], list]:
    """The recording's work: each episode's environment read once per model turn (environments replayed outside
    the timing; only the property reads are timed)."""
    envs = []
    for i, cs in enumerate(choices):
        env = AgentEnv()
        env.reset(**tasks[i // group].row())
        envs.append((env, len(cs) + 1))

    def read() -> list:
        return [[env.state_key for _ in range(turns)] for env, turns in envs]

    return read


def arms(batch: AdvantageBatch, reads: Callable[[], list], model: Any) -> dict[str, Callable[[], Any]]:
    context = EstimatorContext.single_process(None, [lambda **kw: None], tokenizer=None)
    grpo, normalized = GRPOEstimator(), AnchorEstimator()
    pooled, observation = AnchorEstimator(credit="pooled"), AnchorEstimator(state_source="observation")
    tokens = torch.tensor([s + [0] * (batch.completion_mask.shape[1] - len(s)) for s in batch.completion_ids])
    tokens = tokens.clamp(max=model.config.vocab_size - 1)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).backward()

    return {
        "grpo": lambda: grpo.estimate(batch, context),
        "anchor": lambda: (reads(), normalized.estimate(batch, context)),
        "anchor_pooled": lambda: (reads(), pooled.estimate(batch, context)),
        "anchor_observation": lambda: observation.estimate(batch, context),
        "step": step,
    }


def paired(diffs: list[float]) -> dict[str, float]:
    mean = statistics.fmean(diffs)
    half = T_CRIT * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"mean_s": mean, "ci95_s": [mean - half, mean + half]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=24)
    parser.add_argument("--tool-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    from testbed.agent_policy import build_agent_model, build_agent_tokenizer

    batch, tasks, choices = build_batch(
        args.horizon, args.prompts, args.group, args.turn_tokens, args.tool_tokens, args.seed
    )
    model = build_agent_model(build_agent_tokenizer(), max_position_embeddings=2048)
    work = arms(batch, key_reads(tasks, args.group, choices), model)
    names = list(work)
    times: dict[str, list[float]] = {n: [] for n in names}
    uptime_before = uptime()
    for fn in work.values():  # one untimed call each: one-off costs
        fn()
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            work[name]()
            times[name].append(time.perf_counter() - start)
    uptime_after = uptime()
    step = statistics.median(times["step"])
    overheads = {}
    for name in ("anchor", "anchor_pooled", "anchor_observation"):
        diff = paired([a - g for a, g in zip(times[name], times["grpo"], strict=True)])
        overheads[name] = {
            **diff,
            "share_of_step": diff["mean_s"] / step,
            "share_of_step_ci95": [x / step for x in diff["ci95_s"]],
        }
    record = {
        "command": "python benchmarks/anchor_overhead.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(load_before=uptime_before, load_after=uptime_after),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "batch": {
            "episodes": len(batch.completion_ids),
            "completion_tokens": int(batch.completion_mask.sum()),
            "model_turns": sum(len(k) for k in batch.turn_keys),
        },
        "median_s": {n: statistics.median(v) for n, v in times.items()},
        "overhead_over_grpo": overheads,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    for n in names:
        print(f"{n:20s} median {1e3 * record['median_s'][n]:9.3f} ms")
    for n, o in overheads.items():
        lo, hi = o["share_of_step_ci95"]
        print(
            f"{n:20s} over grpo {1e3 * o['mean_s']:.3f} ms [{1e3 * o['ci95_s'][0]:.3f}, {1e3 * o['ci95_s'][1]:.3f}]"
            f" = {100 * o['share_of_step']:.2f}% of a step [{100 * lo:.2f}, {100 * hi:.2f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
