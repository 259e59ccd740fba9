"""The language-model agent map's FrozenLake start: the tiny tool-calling model of :mod:`testbed.lm_agent`, taught by
supervised steps on scripted episodes to play gymnasium's ``FrozenLake-v1`` (4x4, not slippery) through
:func:`mcadvantage.envs.gymnasium_environment`, with a known wrong-move rate, and a check of its success.

The recipe (docs/lm-agent-map-protocol.md, the FrozenLake amendment):

- the environment: ``FrozenLake-v1`` with the 4x4 map, ``is_slippery=False`` and an episode limit of
  :data:`EPISODE_LIMIT` moves (gymnasium's ``max_episode_steps``), through the adapter: the tool is ``act(action)``
  with ``action`` one of ``left, down, right, up``, the observation is the board as text, the reward 1 at the goal,
  and ``state_key`` the player's cell;
- the demonstrations: a noisy optimal plan computed from the map (:func:`optimal_plan`: a shortest way from the
  start, found from :func:`optimal_actions`, the moves that shorten the way to the goal), played open-loop: at turn
  ``t`` the plan's ``t``-th move with probability ``1 - wrong_rate``, else a uniform move (after the plan's 6 moves,
  uniform); the episode plays until the environment ends it, then answers ``done``; its success from the start is
  :func:`policy_success` (exact). Open-loop because the tiny model does not read the board: trained on a closed-loop
  noisy policy (``wrong_rate`` 0.5, success 0.199) it learned that policy's per-turn marginal (held-out success
  0.025 on 512 episodes, the per-turn marginal's 0.025); an open-loop demonstrator *is* a per-turn policy, so the
  fit reproduces its success;
- the model and the fit: :mod:`testbed.lm_agent`'s tiny Llama and :func:`~testbed.lm_agent.supervised_fit`, with a
  tokenizer whose compact phrases are this tool's (:func:`build_frozenlake_tokenizer`).

    python -m testbed.lm_frozenlake --output_dir benchmarks/results/lm_agent_map_warmup/frozenlake
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.agent_policy import FINAL_TEXT, SPECIAL_TOKENS, build_agent_model
from testbed.lm_agent import MAX_POSITIONS, MODEL_SIZES, play_episodes, save_warmup, supervised_fit

__all__ = [
    "EPISODE_LIMIT",
    "FrozenLakeWarmup",
    "build_frozenlake_tokenizer",
    "frozenlake_check",
    "frozenlake_environment",
    "frozenlake_rows",
    "load_frozenlake_warmup",
    "make_frozenlake_trainer",
    "max_completion_length",
    "optimal_actions",
    "optimal_plan",
    "policy_success",
    "train_frozenlake_warmup",
]

#: The episode limit: moves (accepted tool calls) before gymnasium truncates the episode. The shortest way is 6.
EPISODE_LIMIT = 8
ENV_ID = "FrozenLake-v1"
ENV_KWARGS: dict[str, Any] = {"map_name": "4x4", "is_slippery": False, "max_episode_steps": EPISODE_LIMIT}
TOOL = "act"
#: Seeds of the row sets (the seed column; FrozenLake's start does not depend on it when it is not slippery).
DEMO_ROW_SEED, TRAIN_ROW_SEED, EVAL_ROW_SEED = 111, 222, 333
_USER, _TOOL, _ARGUMENT = "\x01", "\x02", "zzqqzz"


@functools.cache
def frozenlake_environment() -> type:
    """The ``environment_factory`` class: ``gymnasium_environment("FrozenLake-v1", env_kwargs=ENV_KWARGS)``, its
    tool ``act(action)``, its ``state_key`` the player's cell (the adapter's default: the observation)."""
    from mcadvantage.envs import gymnasium_environment

    return gymnasium_environment(ENV_ID, env_kwargs=ENV_KWARGS, tool_name=TOOL, name="FrozenLake4x4")


def frozenlake_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` dataset rows (``prompt`` and ``seed``), as :func:`mcadvantage.envs.environment_dataset` builds them."""
    from mcadvantage.envs import environment_dataset

    return environment_dataset(frozenlake_environment(), n, seed).to_list()


def max_completion_length() -> int:
    """The episode's token budget: about 40 tokens per move with its board, and room for the end and the answer."""
    return 40 * EPISODE_LIMIT + 96


# --------------------------------------------------------------------------------------------------------------
# The scripted policy
# --------------------------------------------------------------------------------------------------------------
def _unwrapped() -> Any:
    import gymnasium as gym

    return gym.make(ENV_ID, **ENV_KWARGS).unwrapped


def optimal_actions() -> dict[int, tuple[int, ...]]:
    """Per non-terminal cell from which the goal can be reached: the moves that shorten the way to it (breadth-first
    distances over the map's deterministic moves)."""
    env = _unwrapped()
    ncell = env.observation_space.n
    nxt = {s: {a: env.P[s][a][0][1] for a in range(4)} for s in range(ncell)}
    kind = [c.decode() for row in env.desc for c in row]
    goal = kind.index("G")
    dist, queue = {goal: 0}, collections.deque([goal])
    while queue:
        cell = queue.popleft()
        for s in range(ncell):
            if s not in dist and kind[s] in "SF" and cell in nxt[s].values():
                dist[s] = dist[cell] + 1
                queue.append(s)
    return {
        s: tuple(a for a in range(4) if dist.get(nxt[s][a], math.inf) == dist[s] - 1)
        for s in dist
        if s != goal
    }


def optimal_plan() -> tuple[int, ...]:
    """A shortest way from the start to the goal as moves: at each cell the first (lowest-index) optimal move."""
    env, optimal = _unwrapped(), optimal_actions()
    cell, plan = 0, []
    while cell in optimal:
        plan.append(optimal[cell][0])
        cell = env.P[cell][plan[-1]][0][1]
    return tuple(plan)


def action_probs(turn: int, wrong_rate: float, plan: Sequence[int]) -> list[float]:
    """The scripted policy at ``turn``: the plan's move with ``1 - wrong_rate``, else uniform (uniform past the plan)."""
    if turn >= len(plan):
        return [0.25] * 4
    return [wrong_rate / 4 + (1 - wrong_rate if a == plan[turn] else 0.0) for a in range(4)]


def policy_success(wrong_rate: float, limit: int = EPISODE_LIMIT) -> float:
    """The scripted policy's exact success from the start within ``limit`` moves (dynamic programming over cells and
    turns)."""
    env, optimal, plan = _unwrapped(), optimal_actions(), optimal_plan()
    goal = env.observation_space.n - 1

    @functools.cache
    def value(cell: int, turn: int) -> float:
        if cell not in optimal:  # the goal or a hole (or a cell that cannot reach the goal)
            return 1.0 if cell == goal else 0.0
        if turn == limit:
            return 0.0
        probs = action_probs(turn, wrong_rate, plan)
        return sum(p * value(env.P[cell][a][0][1], turn + 1) for a, p in enumerate(probs))

    return value(0, 0)


# --------------------------------------------------------------------------------------------------------------
# Tokenizer, demonstrations, warm-up
# --------------------------------------------------------------------------------------------------------------
def _phrases(tokenizer: Any) -> list[str]:
    """Fixed text runs of a rendered FrozenLake conversation (each becomes one token; the text is unchanged): what
    lies between the template's special tokens, the instructions, the action names and the end-of-episode lines."""
    env_cls = frozenlake_environment()
    messages = [
        {"role": "user", "content": _USER},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": TOOL, "arguments": {"action": _ARGUMENT}}}
            ],
        },
        {"role": "tool", "name": TOOL, "content": _TOOL},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=[getattr(env_cls(), TOOL)], tokenize=False, add_generation_prompt=True
    )
    cuts = [*SPECIAL_TOKENS, _USER, _TOOL, _ARGUMENT]
    pieces = re.split("|".join(re.escape(c) for c in cuts), text)
    extra = [
        env_cls._instructions,
        *env_cls._spec.actions,
        "Reward: 1.",
        "The episode is over (it reached a terminal state), with a total reward of ",
        "The episode is over (it hit the step limit), with a total reward of ",
        f". Do not call {TOOL} again.",
        FINAL_TEXT,
    ]
    return [p for p in dict.fromkeys([*pieces, *extra]) if len(p) > 1]


def build_frozenlake_tokenizer() -> Any:
    """:mod:`testbed.agent_policy`'s character tokenizer (Qwen3's tool-calling template) with this tool's phrases."""
    from mcadvantage.testing import build_tool_calling_tokenizer

    return build_tool_calling_tokenizer(special_tokens=SPECIAL_TOKENS, phrases=_phrases)


def episode_ids(
    tokenizer: Any, row: dict[str, Any], wrong_rate: float, rng: random.Random
) -> tuple[list[int], list[int], float]:
    """One scripted episode as token ids (TRL's training chat template), its model-turn mask and its reward."""
    from trl.chat_template_utils import get_training_chat_template

    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    env = frozenlake_environment()()
    plan = optimal_plan()
    messages = [{"role": "user", "content": row["prompt"][0]["content"] + env.reset(**row)}]
    tool = getattr(env, TOOL)

    def render(msgs: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        return tokenizer.apply_chat_template(
            msgs,
            tools=[tool],
            chat_template=template,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            return_dict=False,
        )

    turns: list[dict[str, Any]] = []
    while not env.done:
        move = rng.choices(range(4), weights=action_probs(len(turns) // 2, wrong_rate, plan))[0]
        name = env._spec.actions[move]
        call = {"type": "function", "function": {"name": TOOL, "arguments": {"action": name}}}
        turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        turns.append({"role": "tool", "name": TOOL, "content": tool(name)})
    turns.append({"role": "assistant", "content": FINAL_TEXT})
    ids = render(messages + turns, False)
    mask = [0] * len(ids)
    for k, message in enumerate(turns):
        if message["role"] == "assistant":
            start = len(render(messages + turns[:k], True))
            end = start + ids[start:].index(tokenizer.eos_token_id) + 1
            mask[start:end] = [1] * (end - start)
    return ids, mask, env.get_reward()


@dataclass(frozen=True)
class FrozenLakeWarmup:
    """The FrozenLake warm-up's recipe (recorded in ``warmup.json``)."""

    wrong_rate: float = 0.3
    demos: int = 512
    steps: int = 400
    batch_size: int = 16
    learning_rate: float = 3e-3
    seed: int = 0
    episode_limit: int = EPISODE_LIMIT
    sizes: dict[str, int] = field(default_factory=lambda: dict(MODEL_SIZES))

    def __post_init__(self) -> None:
        if not 0 < self.wrong_rate <= 1:
            raise ValueError(
                f"wrong_rate={self.wrong_rate} must lie in (0, 1]: the start must err sometimes."
            )
        for name in ("demos", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1.")
        if self.episode_limit != EPISODE_LIMIT:
            raise ValueError(
                f"episode_limit={self.episode_limit}: this module's environment has {EPISODE_LIMIT}."
            )


def build_model(config: FrozenLakeWarmup) -> tuple[Any, Any]:
    """The tokenizer and a fresh tiny Llama (seeded with ``config.seed``)."""
    import torch

    torch.manual_seed(config.seed)
    tokenizer = build_frozenlake_tokenizer()
    return tokenizer, build_agent_model(tokenizer, max_position_embeddings=MAX_POSITIONS, **config.sizes)


def train_frozenlake_warmup(
    config: FrozenLakeWarmup, *, progress: bool = True
) -> tuple[Any, Any, list[float], float]:
    """Supervised steps on ``config.demos`` scripted episodes. Returns the tokenizer, the model (eval mode), the
    loss of every step and the demonstrations' success."""
    tokenizer, model = build_model(config)
    rng = random.Random(config.seed)
    demos = [
        episode_ids(tokenizer, row, config.wrong_rate, rng)
        for row in frozenlake_rows(config.demos, DEMO_ROW_SEED)
    ]
    losses = supervised_fit(
        model,
        tokenizer,
        [(ids, mask) for ids, mask, _ in demos],
        steps=config.steps,
        batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        seed=config.seed,
        progress=progress,
    )
    return tokenizer, model, losses, sum(r for *_, r in demos) / len(demos)


def load_frozenlake_warmup(output_dir: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """The saved FrozenLake warm-up (:func:`testbed.lm_agent.load_saved_policy`)."""
    from testbed.lm_agent import load_saved_policy

    return load_saved_policy(
        output_dir, lambda config: build_model(FrozenLakeWarmup(**config)), "python -m testbed.lm_frozenlake"
    )


# --------------------------------------------------------------------------------------------------------------
# Playing and checking
# --------------------------------------------------------------------------------------------------------------
def make_frozenlake_trainer(model: Any, tokenizer: Any, output_dir: str | Path) -> Any:
    """A never-training ``VinePPOTrainer`` on the FrozenLake environment whose tool loop drives the episodes."""
    from testbed.lm_agent import make_tool_trainer

    return make_tool_trainer(
        model,
        tokenizer,
        EPISODE_LIMIT,
        output_dir,
        environment=frozenlake_environment(),
        rows=frozenlake_rows(2, 0),
        max_completion_length=max_completion_length(),
    )


def _moves(env: Any) -> int:
    return len(env._actions)


def play_frozenlake(trainer: Any, rows: Sequence[dict[str, Any]], *, seed: int) -> list[Any]:
    """:func:`testbed.lm_agent.play_episodes` on the FrozenLake environment (``tool_calls``: accepted moves)."""
    return play_episodes(trainer, rows, seed=seed, environment=frozenlake_environment(), calls=_moves)


def frozenlake_check(trainer: Any, *, n: int, seed: int) -> dict[str, Any]:
    """Success on ``n`` held-out rows with its binomial SE, moves per episode, the share of episodes that the
    environment ended (goal, hole or limit) and model tokens per episode."""
    rows = frozenlake_rows(n, EVAL_ROW_SEED)
    env_cls = frozenlake_environment()
    ended = []

    def moves(env: Any) -> int:
        ended.append(env.done)
        return _moves(env)

    played = play_episodes(trainer, rows, seed=seed, environment=env_cls, calls=moves)
    success = sum(p.reward for p in played) / n
    return {
        "episodes": n,
        "success": success,
        "se": math.sqrt(success * (1 - success) / n),
        "tool_calls_per_episode": sum(p.tool_calls for p in played) / n,
        "ended_share": sum(ended) / n,
        "model_tokens_per_episode": sum(p.model_tokens for p in played) / n,
    }


COMMAND = "python -m testbed.lm_frozenlake"


def main(argv: Sequence[str] | None = None) -> int:
    """Train the FrozenLake warm-up, check it on held-out rows, save it with ``warmup.json``."""
    import os
    import tempfile

    import torch

    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--wrong_rate", type=float, default=FrozenLakeWarmup.wrong_rate)
    parser.add_argument("--steps", type=int, default=FrozenLakeWarmup.steps)
    parser.add_argument("--seed", type=int, default=FrozenLakeWarmup.seed)
    parser.add_argument("--check_episodes", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(args.threads)
    config = FrozenLakeWarmup(wrong_rate=args.wrong_rate, steps=args.steps, seed=args.seed)
    started = time.perf_counter()
    tokenizer, model, losses, demo_success = train_frozenlake_warmup(config)
    seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        check = frozenlake_check(
            make_frozenlake_trainer(model, tokenizer, tmp), n=args.check_episodes, seed=10_000
        )
    from testbed.machine import machine_info

    meta = {
        "config": asdict(config),
        "env": {"id": ENV_ID, **ENV_KWARGS, "tool": TOOL},
        "scripted_success_exact": policy_success(config.wrong_rate),
        "demonstrations_success": demo_success,
        "loss_first_last": [losses[0], losses[-1]],
        "train_seconds": seconds,
        "check": check,
        "command": f"{COMMAND} --output_dir {args.output_dir} --wrong_rate {config.wrong_rate} --steps {config.steps} "
        f"--seed {config.seed} --check_episodes {args.check_episodes} --threads {args.threads}",
        "machine": machine_info(),
    }
    save_warmup(model, args.output_dir, meta)
    print(
        f"FrozenLake: success {check['success']:.3f} +- {check['se']:.3f} ({check['episodes']} held-out episodes), "
        f"{check['tool_calls_per_episode']:.2f} moves per episode, {100 * check['ended_share']:.1f}% ended by the "
        f"environment, {check['model_tokens_per_episode']:.1f} model tokens per episode; scripted "
        f"{meta['scripted_success_exact']:.3f}; warm-up {config.steps} steps in {seconds:.0f} s, loss "
        f"{losses[0]:.3f} -> {losses[-1]:.3f}; wrote {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
