"""What Monte Carlo turn credit costs against the horizon of an agent's episodes.

On the testbed's multi-turn environment (``testbed.agent_env.AgentEnv``, ``H`` tool-calling turns then an answer) and
the tiny tool-calling policy of ``examples/agent.py --quick`` (the testbed tokenizer with Qwen3's chat template, a
1-layer random Llama taught the tool-call format with a few supervised steps here), for each horizon ``H``:

1. a batch of episodes is generated as GRPO's tool loop generates them: every turn of the active episodes goes to the
   engine in one call, its tool calls run on the episode's environment, and the tool results' tokens are appended
   (the library's :func:`~mcadvantage.agents.tool_loop.continue_episodes` from the empty state, with the trainer's own
   parser and tool-result tokens, ``VinePPOTrainer.agents.parse_turn`` / ``tool_result_ids``);
2. VinePPO's turn credit (:class:`~mcadvantage.agents.episode_sampler.EpisodeSampler` under the Monte Carlo estimator, what
   ``advantage_estimator="vineppo"`` runs) estimates every turn boundary's value with K continuations.

The engine is transformers ``generate`` on the CPU (:class:`~mcadvantage.samplers.hf.TransformersSampler`, one
``sample`` call per turn for the whole batch); vLLM is not usable on this CPU machine for this workload. Every
``generate`` call is timed (the engine), every tool call (``act``) and every environment replay, so the table gives
per episode: GRPO's sampled tokens and wall, Monte Carlo's sampled model tokens and tool-result tokens (counted
apart) and wall, the estimator's overhead ``(estimator wall - tool time) / engine wall`` (a 95% Student-t interval
over repeats of the same work: the seed is reset, so every repeat samples the same tokens), and what bringing an
environment to a state costs per continuation: replaying it (``reset`` + the prefix's tool calls, what the estimator
does) and, for comparison, forking one with ``copy.deepcopy``.

    python benchmarks/agent_turn_credit.py            # writes benchmarks/results/agent_turn_credit.json

With ``--settings K`` it measures instead every Monte Carlo setting of :data:`SETTING_ARMS` at K against the default
on the same episodes (arms interleaved, wall ratios paired by repeat):

    python benchmarks/agent_turn_credit.py --settings 4 --horizons 2 8 16 --episodes 4 --repeats 2 \\
        --out benchmarks/results/agent_turn_credit_settings.json

Runs offline (the tokenizer and the model are built here): about 3.5 minutes on a shared 2-core CPU (one torch
thread), longer under load.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))

from testbed.agent_env import AgentEnv, AgentTask, KeyPolicy, agent_rows, simulate_episode  # noqa: E402

#: Room for the longest episode (H = 16: a ~70-token prompt, 16 turns of ~40 tokens with their results, the answer).
MAX_POSITIONS = 1024
MAX_COMPLETION_LENGTH = 900


# --------------------------------------------------------------------------------------------------------------
# Clocks
# --------------------------------------------------------------------------------------------------------------
@dataclass
class Clock:
    """Seconds spent in the engine, in tool calls and in environment replays, and what the engine returned."""

    engine: float = 0.0
    engine_calls: int = 0
    engine_tokens: int = 0
    tools: float = 0.0
    tool_calls: int = 0
    replay: float = 0.0
    replays: int = 0

    def reset(self) -> None:
        for name, value in Clock().__dict__.items():
            setattr(self, name, value)


CLOCK = Clock()


class TimedAgentEnv(AgentEnv):
    """The testbed environment with its tool timed (the tool's result is AgentEnv's, unchanged)."""

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: The choice for this turn.
        """
        started = time.perf_counter()
        try:
            return super().act(choice)
        finally:
            CLOCK.tools += time.perf_counter() - started
            CLOCK.tool_calls += 1


def timed_generate(
    generate: Callable[[list[list[int]], list[int]], list[list[int]]],
) -> Callable[[list[list[int]], list[int]], list[list[int]]]:
    """``generate`` (the engine) with its calls timed and the tokens it returned counted."""

    def timed(contexts: list[list[int]], budgets: list[int]) -> list[list[int]]:
        started = time.perf_counter()
        out = generate(contexts, budgets)
        CLOCK.engine += time.perf_counter() - started
        CLOCK.engine_calls += 1
        CLOCK.engine_tokens += sum(min(len(t), max(b, 0)) for t, b in zip(out, budgets, strict=True))
        return out

    return timed


@contextlib.contextmanager
def timed_replay() -> Iterator[None]:
    """Time every :func:`~mcadvantage.agents.rebuild.replay_environment` the estimator makes (``reset`` and the
    prefix's tool calls; the tool calls' own time is also in ``CLOCK.tools``)."""
    import mcadvantage.agents.rebuild as rebuild

    original = rebuild.replay_environment

    def replay(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            CLOCK.replay += time.perf_counter() - started
            CLOCK.replays += 1

    rebuild.replay_environment = replay
    try:
        yield
    finally:
        rebuild.replay_environment = original


# --------------------------------------------------------------------------------------------------------------
# The policy and the trainer's tool loop pieces
# --------------------------------------------------------------------------------------------------------------
def _agent_example() -> Any:
    """``examples/agent.py`` as a module (its scripted episodes render the format the policy is taught)."""
    name = "agent_turn_credit_example"
    if name in sys.modules:
        return sys.modules[name]
    examples = str(ROOT / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "agent.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def teach_policy(horizons: Sequence[int], steps: int, seed: int) -> tuple[Any, Any, list[float]]:
    """``examples/agent.py --quick``'s tokenizer and tiny model (room for ``MAX_POSITIONS`` tokens), taught the
    tool-call format with ``steps`` supervised steps on scripted episodes of every horizon (uniform choices).
    Returns the tokenizer, the model and the first and last loss."""
    import torch

    from testbed.agent_policy import build_agent_model, build_agent_tokenizer, fit_model_turns

    example = _agent_example()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_agent_tokenizer()
    model = build_agent_model(
        tokenizer,
        max_position_embeddings=MAX_POSITIONS,
        num_layers=1,
        hidden_size=64,
        head_dim=32,
        intermediate_size=128,
    )
    episodes = []
    for horizon in horizons:
        for row in agent_rows("delayed", horizon, 16, seed + 1):
            choices = simulate_episode(AgentTask.from_row(row), KeyPolicy(0.25), rng).choices
            episodes.append(example.scripted_episode_ids(tokenizer, row, choices, {}))
    losses = fit_model_turns(
        model, episodes, tokenizer.pad_token_id, steps=steps, batch_size=8, learning_rate=3e-3, rng=rng
    )
    model.eval()
    return tokenizer, model, [losses[0], losses[-1]] if losses else []


@dataclass
class Harness:
    """The trainer's pieces of GRPO's tool loop for the policy: the prompt renderer, the parser and the tool-result
    tokens (``VinePPOTrainer``'s own, built once), and the engine."""

    tokenizer: Any
    model: Any
    trainer: Any
    sampler: Any
    max_completion_length: int = MAX_COMPLETION_LENGTH

    def prompt(self, row: dict[str, Any]) -> tuple[Any, list[int], TimedAgentEnv]:
        """The episode's prompt after ``reset``'s observation (as GRPO appends it), its ids as GRPO renders them
        (the tools' schemas included), and the reset environment."""
        env = TimedAgentEnv()
        observation = env.reset(**row)
        prompt = [
            *row["prompt"][:-1],
            {**row["prompt"][-1], "content": row["prompt"][-1]["content"] + observation},
        ]
        [ids] = self.trainer.tokenize_prompt_ids([prompt], [None])
        return prompt, list(ids), env


def build_harness(
    tokenizer: Any, model: Any, output_dir: str, max_completion_length: int = MAX_COMPLETION_LENGTH
) -> Harness:
    """A ``VinePPOTrainer(advantage_estimator="grpo", environment_factory=AgentEnv)`` for its parser and tool-result
    tokens (it never trains), and a transformers sampler at temperature 1."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from mcadvantage.samplers.hf import TransformersSampler
    from testbed.agent_env import make_agent_dataset

    args = VinePPOConfig(
        output_dir=output_dir,
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=max_completion_length,
        max_steps=1,
        advantage_estimator="grpo",
        disable_tqdm=True,
    )
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=None,
        args=args,
        train_dataset=make_agent_dataset("delayed", 2, 2, seed=0),
        processing_class=tokenizer,
        environment_factory=AgentEnv,
    )
    sampler = TransformersSampler(trainer.model, tokenizer, temperature=1.0, max_batch_sequences=256)
    return Harness(tokenizer, trainer.model, trainer, sampler, max_completion_length)


def get_reward(environments: Sequence[Any], **kwargs: Any) -> list[float]:
    """What TRL appends to the reward functions for an environment with ``get_reward``."""
    return [env.get_reward() for env in environments]


# --------------------------------------------------------------------------------------------------------------
# One horizon
# --------------------------------------------------------------------------------------------------------------
@dataclass
class Timing:
    """One timed run: its wall and what the clock recorded inside it."""

    wall: float
    engine: float
    engine_calls: int
    engine_tokens: int
    tools: float
    tool_calls: int
    replay: float = 0.0
    replays: int = 0

    @classmethod
    def of(cls, wall: float) -> Timing:
        return cls(
            wall,
            CLOCK.engine,
            CLOCK.engine_calls,
            CLOCK.engine_tokens,
            CLOCK.tools,
            CLOCK.tool_calls,
            CLOCK.replay,
            CLOCK.replays,
        )

    @property
    def overhead_ratio(self) -> float:
        """(wall - tool time) / engine wall."""
        return (self.wall - self.tools) / self.engine if self.engine > 0 else math.nan


def generate_episodes(
    harness: Harness, rows: Sequence[dict[str, Any]], horizon: int, seed: int
) -> tuple[list, Timing]:
    """The rows' episodes as GRPO's tool loop plays them (see the module docstring), and the timing."""
    import torch

    from mcadvantage.agents.tool_loop import Episode, ToolLoop, continue_episodes, sampler_generate

    prompts, prompt_ids, envs = zip(*(harness.prompt(row) for row in rows), strict=True)
    loop = ToolLoop(
        generate=timed_generate(sampler_generate(harness.sampler)),
        parse=harness.trainer.agents.parse_turn,
        tool_suffix_ids=harness.trainer.tool_result_ids,
        max_completion_length=harness.max_completion_length,
        max_tool_calling_iterations=horizon + 1,  # examples/agent.py's default
    )
    torch.manual_seed(seed)
    CLOCK.reset()
    started = time.perf_counter()
    outs = continue_episodes(list(prompt_ids), [[] for _ in rows], [[] for _ in rows], list(envs), loop=loop)
    timing = Timing.of(time.perf_counter() - started)
    episodes = [
        Episode(
            prompt_ids=list(ids),
            completion_ids=out.completion_ids,
            tool_mask=out.tool_mask,
            messages=out.messages,
            reward=out.environment.get_reward(),
            prompt=prompt,
            row=dict(row),
        )
        for prompt, ids, out, row in zip(prompts, prompt_ids, outs, rows, strict=True)
    ]
    return episodes, timing


@dataclass
class EpisodeEstimate:
    """One episode's part of an estimate: its estimated states' ``boundaries`` (and its end), ``values`` and the
    samples behind them (``rollouts``: an identical state shared with another episode counts for both)."""

    boundaries: list[int]
    values: list[float]
    rollouts: int


def estimate(
    harness: Harness,
    episodes: Sequence[Any],
    horizon: int,
    k: int,
    seed: int,
    settings: dict[str, Any] | None = None,
) -> tuple[list[EpisodeEstimate], Any, Timing]:
    """VinePPO's turn credit of the episodes (every turn boundary a state, K continuations each, ``settings`` over
    the Monte Carlo defaults), timed: the library's :class:`~mcadvantage.mc.estimator.MCValueEstimator` around an
    :class:`~mcadvantage.agents.episode_sampler.EpisodeSampler`, as ``advantage_estimator="vineppo"`` runs it. Returns the
    per-episode estimates, the estimate's :class:`~mcadvantage.mc.stats.MCStats` and the timing."""
    import torch

    from mcadvantage.agents.episode_sampler import EpisodeSampler
    from mcadvantage.agents.tool_loop import AgentEpisodes
    from mcadvantage.agents.turns import episode_step_boundaries
    from mcadvantage.core.settings import MCSettings
    from mcadvantage.mc.estimator import MCValueEstimator, Trajectory
    from mcadvantage.mc.planning import estimated_boundaries

    agent = AgentEpisodes(
        episodes=list(episodes),
        factories={None: TimedAgentEnv},
        parse=harness.trainer.agents.parse_turn,
        tool_suffix_ids=harness.trainer.tool_result_ids,
        max_tool_calling_iterations=horizon + 1,
    )
    mc = MCSettings(num_rollouts=k, **(settings or {}))
    trajectories = [
        Trajectory(
            prompt_ids=list(ep.prompt_ids),
            completion_ids=list(ep.completion_ids),
            step_boundaries=episode_step_boundaries(ep.tool_mask),
            reward=ep.reward,
            prompt=ep.prompt,
            fields={k: v for k, v in ep.row.items() if k != "prompt"},
            tool_mask=list(ep.tool_mask),
            episode=ep,
        )
        for ep in episodes
    ]
    estimator = MCValueEstimator(
        EpisodeSampler(TimedEngine(harness.sampler), agent),
        [get_reward],
        harness.trainer.processing_class,
        settings=mc,
        max_completion_length=harness.max_completion_length,
    )
    torch.manual_seed(seed)
    CLOCK.reset()
    with timed_replay():
        started = time.perf_counter()
        result = estimator.estimate(trajectories)
        timing = Timing.of(time.perf_counter() - started)
    per_episode = [
        EpisodeEstimate(estimated_boundaries(t.step_boundaries, mc), list(v), int(sum(c)))
        for t, v, c in zip(trajectories, result.values, result.sample_counts, strict=True)
    ]
    return per_episode, result.stats, timing


class TimedEngine:
    """The engine (a :class:`~mcadvantage.samplers.Sampler`) with its calls timed and the tokens it returned
    counted."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def sample(self, requests: Sequence[Any]) -> list[list[Any]]:
        started = time.perf_counter()
        out = self.sampler.sample(requests)
        CLOCK.engine += time.perf_counter() - started
        CLOCK.engine_calls += 1
        CLOCK.engine_tokens += sum(len(c.token_ids) for conts in out for c in conts)
        return out


def fork_seconds(episodes: Sequence[Any], credits: Sequence[Any], copies: int) -> tuple[float, int]:
    """Seconds and count of ``copy.deepcopy`` forks of an environment at every estimated state (``copies`` per
    state, as the estimator would fork one per continuation instead of replaying)."""
    from mcadvantage.agents.rebuild import recorded_tool_turns, replay_environment
    from mcadvantage.agents.turns import tool_turns_before

    total, forks = 0.0, 0
    for episode, credit in zip(episodes, credits, strict=True):
        turns = recorded_tool_turns(episode.messages)
        for b in credit.boundaries[:-1]:
            env = replay_environment(AgentEnv, episode.row, turns[: tool_turns_before(episode.tool_mask, b)])
            started = time.perf_counter()
            for _ in range(copies):
                copy.deepcopy(env)
            total += time.perf_counter() - started
            forks += copies
    return total, forks


def t_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean with a Student-t interval (None bounds for one value)."""
    from mcadvantage.evaluation.stats import student_t_quantile

    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "low": None, "high": None, "level": level, "n": len(values)}
    half = (
        student_t_quantile(0.5 + level / 2, len(values) - 1)
        * statistics.stdev(values)
        / math.sqrt(len(values))
    )
    return {"mean": mean, "low": mean - half, "high": mean + half, "level": level, "n": len(values)}


def measure_horizon(
    harness: Harness, horizon: int, ks: Sequence[int], n_episodes: int, repeats: int, seed: int
) -> dict[str, Any]:
    """GRPO's episodes and VinePPO's turn credit at one horizon: tokens, walls, overhead, replay and fork costs."""
    rows = agent_rows("delayed", horizon, n_episodes, seed + horizon)
    grpo_timings, episodes = [], None
    for _ in range(repeats):
        episodes, timing = generate_episodes(harness, rows, horizon, seed)
        grpo_timings.append(timing)
    n = len(episodes)
    model_tokens = [sum(ep.tool_mask) for ep in episodes]
    record: dict[str, Any] = {
        "horizon": horizon,
        "episodes": n,
        "grpo": {
            "model_tokens_per_episode": statistics.fmean(model_tokens),
            "tool_result_tokens_per_episode": statistics.fmean(
                len(ep.tool_mask) - m for ep, m in zip(episodes, model_tokens, strict=True)
            ),
            "model_turns_per_episode": statistics.fmean(
                len(ep.messages) - sum(m["role"] == "tool" for m in ep.messages) for ep in episodes
            ),
            "tool_rounds_per_episode": statistics.fmean(
                sum(m["role"] == "tool" for m in ep.messages) for ep in episodes
            ),
            "reward_mean": statistics.fmean(ep.reward for ep in episodes),
            "engine_tokens": grpo_timings[0].engine_tokens,
            "wall_per_episode_s": [t.wall / n for t in grpo_timings],
            "engine_per_episode_s": [t.engine / n for t in grpo_timings],
            "tools_per_episode_s": [t.tools / n for t in grpo_timings],
            "overhead_ratio": t_interval([t.overhead_ratio for t in grpo_timings]),
        },
        "vineppo": {},
    }
    for k in ks:
        timings, values = [], []
        for _ in range(repeats):
            credits, stats, timing = estimate(harness, episodes, horizon, k, seed + 1)
            timings.append(timing)
            values.append([list(c.values) for c in credits])
        forks, fork_count = fork_seconds(episodes, credits, k)
        generated = stats.generated_tokens
        record["vineppo"][str(k)] = {
            "k": k,
            "states_per_episode": statistics.fmean(len(c.boundaries) - 1 for c in credits),
            "rollouts_per_episode": stats.rollouts / n,
            "unique_states": stats.unique_states,
            "model_tokens_per_episode": generated / n,
            "tool_result_tokens_per_episode": (stats.tool_result_tokens or 0) / n,
            "engine_tokens": timings[0].engine_tokens,
            "model_tokens_vs_grpo": generated / sum(model_tokens) if sum(model_tokens) else math.nan,
            "same_values_every_repeat": all(v == values[0] for v in values),
            # The estimates themselves, to compare runs of different code on the same seed (a refactor changes none).
            "values_sha256": hashlib.sha256(repr(values[0]).encode()).hexdigest(),
            "wall_per_episode_s": [t.wall / n for t in timings],
            "engine_per_episode_s": [t.engine / n for t in timings],
            "tools_per_episode_s": [t.tools / n for t in timings],
            "engine_calls": timings[0].engine_calls,
            "overhead_ratio": t_interval([t.overhead_ratio for t in timings]),
            "replay_per_continuation_ms": statistics.fmean(
                1000 * t.replay / t.replays if t.replays else 0.0 for t in timings
            ),
            "replays": timings[0].replays,
            "fork_per_continuation_ms": 1000 * forks / fork_count if fork_count else 0.0,
        }
    return record


# --------------------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------------------
def _interval(iv: dict[str, Any]) -> str:
    if iv["low"] is None:
        return f"{iv['mean']:.3f}"
    return f"{iv['mean']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}]"


def table(records: Sequence[dict[str, Any]]) -> str:
    """The markdown table: one row per horizon and K (GRPO's own row with K = -)."""
    lines = [
        "| H | K | model turns / ep | states / ep | sampled model tokens / ep | tool-result tokens / ep | x GRPO tokens "
        "| wall / ep s (median) | engine / ep s | (wall - tools) / engine, 95% CI | replay ms / cont. | fork ms / cont. |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for rec in records:
        g = rec["grpo"]
        lines.append(
            f"| {rec['horizon']} | GRPO | {g['model_turns_per_episode']:.1f} | - | {g['model_tokens_per_episode']:.0f} "
            f"| {g['tool_result_tokens_per_episode']:.0f} | 1 | {statistics.median(g['wall_per_episode_s']):.3f} "
            f"| {statistics.median(g['engine_per_episode_s']):.3f} | {_interval(g['overhead_ratio'])} | - | - |"
        )
        for k, v in rec["vineppo"].items():
            lines.append(
                f"| {rec['horizon']} | {k} | - | {v['states_per_episode']:.1f} | {v['model_tokens_per_episode']:.0f} "
                f"| {v['tool_result_tokens_per_episode']:.0f} | {v['model_tokens_vs_grpo']:.1f} "
                f"| {statistics.median(v['wall_per_episode_s']):.3f} | {statistics.median(v['engine_per_episode_s']):.3f} "
                f"| {_interval(v['overhead_ratio'])} | {v['replay_per_continuation_ms']:.3f} "
                f"| {v['fork_per_continuation_ms']:.3f} |"
            )
    return "\n".join(lines)


#: The Monte Carlo settings whose cost on agent episodes ``--settings`` measures, each against the default on the same
#: episodes and seed (``truncated_reward`` saves nothing alone: it is measured with the fixed budget it grades).
SETTING_ARMS: dict[str, dict[str, Any]] = {
    "default": {},
    "reuse_samples": {"reuse_samples": True},
    "variance": {"allocation": "variance", "min_rollouts": 1},
    "fixed_budget_32": {"rollout_budget": "fixed", "fixed_rollout_budget": 32},
    "fixed_budget_32_truncated_0": {
        "rollout_budget": "fixed",
        "fixed_rollout_budget": 32,
        "truncated_reward": 0.0,
    },
    "max_estimated_steps_2": {"max_estimated_steps": 2},
    "min_step_tokens_64": {"min_step_tokens": 64},
}


def ratio_interval(ratios: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Geometric mean of paired ratios with a Student-t interval on their logs (:func:`t_interval`; None bounds for
    one ratio)."""
    iv = t_interval([math.log(r) for r in ratios], level)
    return {
        "ratio": math.exp(iv["mean"]),
        "low": None if iv["low"] is None else math.exp(iv["low"]),
        "high": None if iv["high"] is None else math.exp(iv["high"]),
        "level": level,
        "n": iv["n"],
    }


def _settings_arm(stats: Any, n: int, settings: dict[str, Any]) -> dict[str, Any]:
    """One arm's per-episode work from its estimate's :class:`~mcadvantage.mc.stats.MCStats`."""
    return {
        "settings": settings,
        "states_per_episode": stats.states / n,
        "unique_states": stats.unique_states,
        "rollouts_per_episode": stats.rollouts / n,
        "sampled_tokens_per_episode": stats.generated_tokens / n,
        "tool_result_tokens_per_episode": (stats.tool_result_tokens or 0) / n,
        "free_samples": stats.free_samples,
        "truncated_rollouts": stats.truncated_rollouts,
        "wall_per_episode_s": [],
        "engine_per_episode_s": [],
        "values_sha256": [],
    }


def measure_settings(
    harness: Harness, horizon: int, k: int, n_episodes: int, repeats: int, seed: int
) -> dict[str, Any]:
    """Every arm of :data:`SETTING_ARMS` on one horizon's episodes: sampled model tokens, tool-result tokens,
    rollouts and wall per episode, and their ratios to the default's (the same episodes, the same seed).

    The arms are interleaved: each repeat runs every arm once, in an order rotated by one arm per repeat, and an arm's
    wall ratio is the geometric mean of its per-repeat ratios to the default of the same repeat, with a 95%
    Student-t interval on their logs (:func:`ratio_interval`). The seed is reset before every estimate, so every
    repeat of an arm samples the same tokens (``same_work_every_repeat`` checks it)."""
    rows = agent_rows("delayed", horizon, n_episodes, seed + horizon)
    episodes, _ = generate_episodes(harness, rows, horizon, seed)
    n, names, out = len(episodes), list(SETTING_ARMS), {}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            credits, stats, timing = estimate(harness, episodes, horizon, k, seed + 1, SETTING_ARMS[name])
            arm = out.setdefault(name, _settings_arm(stats, n, SETTING_ARMS[name]))
            arm["same_work_every_repeat"] = arm.get("same_work_every_repeat", True) and (
                stats.generated_tokens / n == arm["sampled_tokens_per_episode"]
                and stats.rollouts / n == arm["rollouts_per_episode"]
            )
            arm["wall_per_episode_s"].append(timing.wall / n)
            arm["engine_per_episode_s"].append(timing.engine / n)
            values = [list(c.values) for c in credits]
            arm["values_sha256"].append(hashlib.sha256(repr(values).encode()).hexdigest())
    out = {name: out[name] for name in names}  # SETTING_ARMS order, whatever order ran first
    base = out["default"]
    for arm in out.values():
        arm["same_work_every_repeat"] &= len(set(arm["values_sha256"])) == 1
        arm["values_sha256"] = arm["values_sha256"][0]
        for key in ("rollouts", "sampled_tokens", "tool_result_tokens"):
            mine, theirs = arm[f"{key}_per_episode"], base[f"{key}_per_episode"]
            arm[f"{key}_vs_default"] = mine / theirs if theirs else math.nan
        arm["wall_vs_default"] = ratio_interval(
            [w / d for w, d in zip(arm["wall_per_episode_s"], base["wall_per_episode_s"], strict=True)]
        )
    return {"horizon": horizon, "k": k, "episodes": n, "arms": out}


def _ratio(iv: dict[str, Any]) -> str:
    if iv["low"] is None:
        return f"{iv['ratio']:.2f}"
    return f"{iv['ratio']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}]"


def settings_table(records: Sequence[dict[str, Any]]) -> str:
    """The markdown tables of :func:`measure_settings`: one per horizon (its heading line first), one row per arm."""
    blocks = []
    for rec in records:
        lines = [
            f"H = {rec['horizon']}, K = {rec['k']}, {rec['episodes']} episodes:",
            "",
            "| setting | states / ep | rollouts / ep | x default | sampled model tokens / ep | x default "
            "| tool-result tokens / ep | x default | wall / ep s (median) | x default wall, 95% CI |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, arm in rec["arms"].items():
            lines.append(
                f"| {name} | {arm['states_per_episode']:.1f} | {arm['rollouts_per_episode']:.1f} "
                f"| {arm['rollouts_vs_default']:.2f} | {arm['sampled_tokens_per_episode']:.0f} "
                f"| {arm['sampled_tokens_vs_default']:.2f} | {arm['tool_result_tokens_per_episode']:.0f} "
                f"| {arm['tool_result_tokens_vs_default']:.2f} | {statistics.median(arm['wall_per_episode_s']):.3f} "
                f"| {_ratio(arm['wall_vs_default'])} |"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def run(
    horizons: Sequence[int],
    ks: Sequence[int],
    n_episodes: int,
    repeats: int,
    teach_steps: int,
    seed: int,
    output_dir: str,
    max_completion_length: int = MAX_COMPLETION_LENGTH,
    settings_k: int | None = None,
) -> dict[str, Any]:
    """Teach the policy, build the harness, measure every horizon (with ``settings_k``, every Monte Carlo setting
    at that K instead of the default at each of ``ks``); the JSON record."""
    started = time.perf_counter()
    tokenizer, model, losses = teach_policy(horizons, teach_steps, seed)
    harness = build_harness(tokenizer, model, output_dir, max_completion_length)
    print(
        f"taught ({losses}) and built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True
    )
    records = []
    for horizon in horizons:
        if settings_k is None:
            records.append(measure_horizon(harness, horizon, ks, n_episodes, repeats, seed))
        else:
            records.append(measure_settings(harness, horizon, settings_k, n_episodes, repeats, seed))
        print(f"H={horizon} done at {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return {
        "settings": {
            "horizons": list(horizons),
            "k": list(ks) if settings_k is None else [settings_k],
            "setting_arms": None if settings_k is None else SETTING_ARMS,
            "episodes_per_horizon": n_episodes,
            "repeats": repeats,
            "teach_steps": teach_steps,
            "teach_loss_first_last": losses,
            "seed": seed,
            "max_completion_length": max_completion_length,
            "max_tool_calling_iterations": "H + 1",
            "engine": "transformers generate (TransformersSampler, temperature 1), one call per turn",
        },
        "horizons": records,
        "total_seconds": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per horizon")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of the same work")
    parser.add_argument("--teach-steps", type=int, default=150, help="supervised steps teaching the format")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--settings",
        type=int,
        default=None,
        metavar="K",
        help="measure every Monte Carlo setting (SETTING_ARMS) at this K against the default",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "agent_turn_credit.json"
    )
    args = parser.parse_args(argv)

    import torch
    from _machine import machine_info

    torch.set_num_threads(args.threads)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(
            args.horizons,
            args.k,
            args.episodes,
            args.repeats,
            args.teach_steps,
            args.seed,
            tmp,
            settings_k=args.settings,
        )
    result["machine"] = machine_info(
        load_before=load, load_after=subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    )
    result["command"] = "python benchmarks/agent_turn_credit.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    result["table"] = (table if args.settings is None else settings_table)(result["horizons"])
    print(result["table"])
    print(f"total {result['total_seconds']:.0f} s; {result['machine']['load_before']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
