"""The language-model agent map's start: a tiny tool-calling model taught, by supervised steps on scripted episodes,
to play the agent testbed's ``chain`` task with a known wrong-choice rate, and a check of its success.

The map (docs/lm-agent-map-protocol.md, ``benchmarks/lm_agent_map.py``) asks whether turn credit pays for a language
model trained through ``VinePPOTrainer`` on a multi-turn environment. That needs a start whose success is low but not
zero (else every reward is 0 and no arm has a signal) and which plays every turn (an episode that stops early fails
whatever its choices). The recipe here:

- the task: :mod:`testbed.agent_env`'s ``chain`` structure with :data:`DECISIVE_TURNS` (H = 2: both turns decisive;
  H = 8 and 16: the last 3), so a policy that picks the key with probability ``p`` succeeds with ``p ** m``;
- one key for every row (:data:`KEY`): the model need not copy it from the prompt;
- the demonstrations: episodes of :class:`~testbed.agent_env.KeyPolicy` ``(key_prob)``, every turn played, then
  ``done``; the cross-entropy fit of a categorical is its frequencies, so the model learns to pick the key with about
  ``key_prob`` and the other choices evenly;
- the model: ``examples/agent.py --quick``'s tokenizer (compact Qwen3 tool-calling template) and a tiny Llama
  (:data:`MODEL_SIZES`), trained on the demonstrations of every horizon at once (one start for the whole map).

    python -m testbed.lm_agent --output_dir benchmarks/results/lm_agent_map_warmup   # trains, checks, saves

:func:`play_episodes` plays a model's episodes through the trainer's own tool loop (the library's
:func:`~mcadvantage.agents.tool_loop.continue_episodes` with ``VinePPOTrainer``'s parser and tool-result tokens, sampling
at temperature 1 from a private seed), and :func:`success_check` measures success and tool calls per episode on
held-out rows.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.agent_env import AgentEnv, AgentTask, KeyPolicy, agent_rows, simulate_episode
from testbed.agent_policy import build_agent_model, build_agent_tokenizer, scripted_episode_ids

__all__ = [
    "DECISIVE_TURNS",
    "KEY",
    "MODEL_SIZES",
    "WarmupConfig",
    "decisive_turn_for",
    "eval_rows",
    "load_warmup",
    "make_tool_trainer",
    "max_completion_length_for",
    "play_episodes",
    "success_check",
    "task_rows",
    "train_warmup",
]

#: ``chain``'s first decisive turn per horizon: H = 2 has 2 decisive turns, H = 8 and 16 the last 3.
DECISIVE_TURNS: dict[int, int] = {2: 0, 4: 1, 8: 5, 16: 13}
#: The tiny Llama's sizes (``build_agent_model`` keywords): two layers, so the turn count can be read.
MODEL_SIZES: dict[str, int] = {"num_layers": 2, "hidden_size": 64, "head_dim": 32, "intermediate_size": 128}
#: Room for the longest episode (H = 16: a ~100-token prompt, 16 turns with their results, the answer).
MAX_POSITIONS = 1024
#: The key of every row (see :func:`task_rows`).
KEY = 2
#: Seeds of the row sets: the warm-up's demonstrations, RL's training rows, and the held-out evaluation rows.
DEMO_ROW_SEED, TRAIN_ROW_SEED, EVAL_ROW_SEED = 101, 202, 303


def decisive_turn_for(horizon: int) -> int:
    """``chain``'s first decisive turn at ``horizon`` (:data:`DECISIVE_TURNS`)."""
    if horizon not in DECISIVE_TURNS:
        raise ValueError(f"horizon={horizon} has no decisive turn set; use one of {sorted(DECISIVE_TURNS)}.")
    return DECISIVE_TURNS[horizon]


def max_completion_length_for(horizon: int) -> int:
    """The episode's token budget: about 30 tokens per turn with its tool result, and room for the answer."""
    return 32 * horizon + 48


def task_rows(horizon: int, n: int, seed: int, *, choices: int = 4) -> list[dict[str, Any]]:
    """``n`` rows of the ``chain`` task at ``horizon``, every one with the key :data:`KEY` (``seed`` is kept for the
    row sets' bookkeeping; the rows are identical). One key for all rows: the tiny model need not learn to copy the
    key from the prompt (a 2-layer character model did not within 1,000 supervised steps), so the warm-up's key rate
    is set by its demonstrations and RL moves a preference, turn by turn."""
    rows = agent_rows("chain", horizon, n, seed, choices=choices, decisive_turn=decisive_turn_for(horizon))
    return [{**row, "key": KEY} for row in rows]


def eval_rows(horizon: int, n: int, *, choices: int = 4) -> list[dict[str, Any]]:
    """The fixed held-out evaluation rows (seed :data:`EVAL_ROW_SEED`, disjoint in seed from training's)."""
    return task_rows(horizon, n, EVAL_ROW_SEED, choices=choices)


@dataclass(frozen=True)
class WarmupConfig:
    """The warm-up's recipe (recorded in ``warmup.json``)."""

    horizons: tuple[int, ...] = (2, 8)
    key_prob: float = 0.5
    choices: int = 4
    demos_per_horizon: int = 256
    steps: int = 600
    batch_size: int = 16
    learning_rate: float = 3e-3
    seed: int = 0
    sizes: dict[str, int] = field(default_factory=lambda: dict(MODEL_SIZES))

    def __post_init__(self) -> None:
        if not 0 < self.key_prob < 1:
            raise ValueError(f"key_prob={self.key_prob} must lie in (0, 1): the start must err sometimes.")
        for name in ("demos_per_horizon", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1.")
        for horizon in self.horizons:
            decisive_turn_for(horizon)


def build_policy(config: WarmupConfig) -> tuple[Any, Any]:
    """The tokenizer and a fresh tiny Llama (seeded with ``config.seed``)."""
    import torch

    torch.manual_seed(config.seed)
    tokenizer = build_agent_tokenizer()
    model = build_agent_model(tokenizer, max_position_embeddings=MAX_POSITIONS, **config.sizes)
    return tokenizer, model


def demonstrations(config: WarmupConfig, tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """Scripted episodes of ``KeyPolicy(key_prob)`` for every horizon, as token ids and the model-turn mask."""
    rng = random.Random(config.seed)
    policy = KeyPolicy(config.key_prob)
    episodes = []
    for horizon in config.horizons:
        for row in task_rows(
            horizon, config.demos_per_horizon, DEMO_ROW_SEED + horizon, choices=config.choices
        ):
            choices = simulate_episode(AgentTask.from_row(row), policy, rng).choices
            episodes.append(scripted_episode_ids(tokenizer, row, choices, {}))
    return episodes


def train_warmup(config: WarmupConfig, *, progress: bool = True) -> tuple[Any, Any, list[float]]:
    """Supervised steps (AdamW, constant rate) on :func:`demonstrations`, loss on the model's own turns only.
    Returns the tokenizer, the model (in eval mode) and the loss of every step."""
    tokenizer, model = build_policy(config)
    episodes = demonstrations(config, tokenizer)
    losses = supervised_fit(
        model,
        tokenizer,
        episodes,
        steps=config.steps,
        batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        seed=config.seed,
        progress=progress,
    )
    return tokenizer, model, losses


def supervised_fit(
    model: Any,
    tokenizer: Any,
    episodes: Sequence[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    progress: bool = True,
) -> list[float]:
    """``steps`` supervised steps (AdamW, constant rate) on episodes drawn with replacement (``Random(seed + 1)``),
    the loss on the masked (model's own) tokens only; leaves the model in eval mode and returns every step's loss."""
    from testbed.agent_policy import fit_model_turns

    losses = fit_model_turns(
        model,
        episodes,
        tokenizer.pad_token_id,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        rng=random.Random(seed + 1),
        progress=progress,
    )
    model.eval()
    return losses


def save_warmup(model: Any, output_dir: str | Path, meta: dict[str, Any]) -> None:
    """The weights (``model.pt``) and ``warmup.json`` (recipe, check, command, machine)."""
    import torch

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    (out / "warmup.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def load_saved_policy(
    output_dir: str | Path, build: Callable[[dict[str, Any]], tuple[Any, Any]], command: str
) -> tuple[Any, Any, dict[str, Any]]:
    """A saved warm-up: the tokenizer and model ``build(recorded config)`` makes, with the weights of ``model.pt``
    loaded (eval mode), and its ``warmup.json``.

    Raises:
        FileNotFoundError: when ``output_dir`` holds no warm-up, naming ``command``, which trains one.
    """
    import torch

    out = Path(output_dir)
    if not (out / "model.pt").exists() or not (out / "warmup.json").exists():
        raise FileNotFoundError(
            f"{out} holds no warm-up (model.pt and warmup.json); train it with {command} --output_dir {out}"
        )
    meta = json.loads((out / "warmup.json").read_text(encoding="utf-8"))
    tokenizer, model = build(meta["config"])
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    model.eval()
    return tokenizer, model, meta


def load_warmup(output_dir: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """The saved chain warm-up (:func:`load_saved_policy`, rebuilt with the recorded sizes)."""
    return load_saved_policy(
        output_dir,
        lambda config: build_policy(WarmupConfig(**{**config, "horizons": tuple(config["horizons"])})),
        "python -m testbed.lm_agent",
    )


# --------------------------------------------------------------------------------------------------------------
# Playing episodes through the trainer's tool loop
# --------------------------------------------------------------------------------------------------------------
def make_tool_trainer(
    model: Any,
    tokenizer: Any,
    horizon: int,
    output_dir: str | Path,
    *,
    environment: Any = AgentEnv,
    rows: Sequence[dict[str, Any]] | None = None,
    max_completion_length: int | None = None,
) -> Any:
    """A ``VinePPOTrainer(advantage_estimator="grpo", environment_factory=environment)`` that never trains: its
    parser, tool-result tokens and prompt renderer drive :func:`play_episodes`. ``horizon`` sets the tool rounds
    (``horizon + 1``); ``rows`` (two dataset rows; default the ``chain`` task's) and ``max_completion_length``
    (default :func:`max_completion_length_for`) are for other environments."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    args = VinePPOConfig(
        output_dir=str(output_dir),
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=max_completion_length or max_completion_length_for(horizon),
        max_tool_calling_iterations=horizon + 1,
        max_steps=1,
        advantage_estimator="grpo",
        disable_tqdm=True,
        save_strategy="no",
    )
    return VinePPOTrainer(
        model=model,
        reward_funcs=None,
        args=args,
        train_dataset=Dataset.from_list(list(rows) if rows is not None else task_rows(horizon, 2, 0)),
        processing_class=tokenizer,
        environment_factory=environment,
    )


@dataclass(frozen=True)
class Played:
    """One played episode: its reward, how many ``act`` calls ran, and its model (sampled) tokens."""

    reward: float
    tool_calls: int
    model_tokens: int


def play_episodes(
    trainer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    seed: int,
    batch: int = 128,
    environment: Any = AgentEnv,
    calls: Any = None,
) -> list[Played]:
    """Play one episode per row with ``trainer.model`` through GRPO's tool loop (TRL's parser and tool-result tokens,
    ``max_completion_length`` and ``max_tool_calling_iterations`` of ``trainer.args``), sampling at temperature 1
    under a forked RNG seeded with ``seed`` (so the caller's random stream is untouched and one model gives the same
    episodes). The reward is the environment's ``get_reward()``; ``environment`` is the class played (default
    ``AgentEnv``) and ``calls(env)`` counts an episode's accepted tool calls (default ``env.turn``)."""
    import torch

    from mcadvantage.agents.tool_loop import ToolLoop, continue_episodes, sampler_generate
    from mcadvantage.samplers.hf import TransformersSampler

    model = trainer.model
    was_training = model.training
    model.eval()
    sampler = TransformersSampler(model, trainer.processing_class, temperature=1.0, max_batch_sequences=batch)
    loop = ToolLoop(
        generate=sampler_generate(sampler),
        parse=trainer.agents.parse_turn,
        tool_suffix_ids=trainer.tool_result_ids,
        max_completion_length=trainer.args.max_completion_length,
        max_tool_calling_iterations=trainer.args.max_tool_calling_iterations,
    )
    played: list[Played] = []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch):
                chunk = rows[start : start + batch]
                envs, prompt_ids = [], []
                for row in chunk:
                    env = environment()
                    observation = env.reset(**row)
                    prompt = [
                        *row["prompt"][:-1],
                        {**row["prompt"][-1], "content": row["prompt"][-1]["content"] + observation},
                    ]
                    [ids] = trainer.tokenize_prompt_ids([prompt], [None])
                    envs.append(env)
                    prompt_ids.append(list(ids))
                outs = continue_episodes(
                    prompt_ids, [[] for _ in chunk], [[] for _ in chunk], envs, loop=loop
                )
                played += [
                    Played(
                        out.environment.get_reward(),
                        calls(out.environment) if calls is not None else out.environment.turn,
                        sum(out.tool_mask),
                    )
                    for out in outs
                ]
    finally:
        model.train(was_training)
    return played


def success_check(trainer: Any, horizon: int, *, n: int, seed: int) -> dict[str, Any]:
    """Success on ``n`` held-out rows (:func:`eval_rows`) with its binomial SE, ``act`` calls per episode, the share
    of episodes that played every turn, and model tokens per episode."""
    played = play_episodes(trainer, eval_rows(horizon, n), seed=seed)
    success = sum(p.reward for p in played) / n
    return {
        "horizon": horizon,
        "episodes": n,
        "success": success,
        "se": math.sqrt(success * (1 - success) / n),
        "tool_calls_per_episode": sum(p.tool_calls for p in played) / n,
        "completed_share": sum(p.tool_calls == horizon for p in played) / n,
        "model_tokens_per_episode": sum(p.model_tokens for p in played) / n,
    }


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------
COMMAND = "python -m testbed.lm_agent"


def main(argv: Sequence[str] | None = None) -> int:
    """Train the warm-up, check its success on held-out rows at every horizon, save it with ``warmup.json``."""
    import os
    import tempfile

    import torch

    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--horizons", type=int, nargs="+", default=list(WarmupConfig.horizons))
    parser.add_argument("--key_prob", type=float, default=WarmupConfig.key_prob)
    parser.add_argument("--steps", type=int, default=WarmupConfig.steps)
    parser.add_argument("--seed", type=int, default=WarmupConfig.seed)
    parser.add_argument("--check_episodes", type=int, default=512, help="held-out episodes per horizon")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    config = WarmupConfig(
        horizons=tuple(args.horizons), key_prob=args.key_prob, steps=args.steps, seed=args.seed
    )
    started = time.perf_counter()
    tokenizer, model, losses = train_warmup(config)
    seconds = time.perf_counter() - started
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        for horizon in config.horizons:
            trainer = make_tool_trainer(model, tokenizer, horizon, tmp)
            checks.append(success_check(trainer, horizon, n=args.check_episodes, seed=10_000 + horizon))
    from testbed.machine import machine_info

    meta = {
        "config": asdict(config),
        "loss_first_last": [losses[0], losses[-1]],
        "train_seconds": seconds,
        "check": checks,
        "command": f"{COMMAND} --output_dir {args.output_dir} --horizons {' '.join(map(str, config.horizons))} "
        f"--key_prob {config.key_prob} --steps {config.steps} --seed {config.seed} "
        f"--check_episodes {args.check_episodes} --threads {args.threads}",
        "machine": machine_info(),
    }
    save_warmup(model, args.output_dir, meta)
    for c in checks:
        print(
            f"H={c['horizon']}: success {c['success']:.3f} +- {c['se']:.3f} ({c['episodes']} held-out episodes), "
            f"{c['tool_calls_per_episode']:.2f} act calls per episode, {100 * c['completed_share']:.1f}% played "
            f"every turn, {c['model_tokens_per_episode']:.1f} model tokens per episode"
        )
    print(
        f"warm-up: {config.steps} steps in {seconds:.0f} s; loss {losses[0]:.3f} -> {losses[-1]:.3f}; wrote {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
