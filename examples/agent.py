"""Train a tool-using agent with ``VinePPOTrainer`` on the testbed's multi-turn environment
(``testbed.agent_env.AgentEnv``, passed as TRL's ``environment_factory``).

Each episode is ``--horizon`` turns; every turn the model calls the environment's one tool, ``act(choice)``, and
after the last turn it answers ``done``. The reward is the environment's own ``get_reward()`` (no reward function):
1 when every turn was played and the final state is good, which depends on one decisive turn only (sparse and final,
the setting where credit per turn matters; see docs/agent-testbed.md).

    # CPU, offline, about a minute: a tiny model built here, taught the tool-call format first, then a few RL steps
    python examples/agent.py --quick
    # a real model on a GPU, with a colocated vLLM engine (the default without --quick)
    accelerate launch --config_file examples/accelerate_configs/single_gpu.yaml examples/agent.py \\
        --model Qwen/Qwen3-0.6B --estimator grpo

``--estimator`` (alias of ``--advantage_estimator``) picks the advantage estimator, ``grpo`` by default. An
estimator that does not take tool and environment episodes is refused before any model is loaded: the script
prints the library's reason and the fix and exits with status 2. Every ``mcadvantage.VinePPOConfig`` /
``trl.GRPOConfig`` field is a flag (``--max_tool_calling_iterations``, ``--num_generations``, ``--use_vllm``, ...), as
are ``trl.ModelConfig``'s (``--model`` is ``--model_name_or_path``) and the task flags of :class:`AgentArguments`
(``--structure``, ``--horizon``, ...). See examples/README.md.

The environment lives in the repository's research testbed (``testbed/``, not in the installed package), so run the
script from a checkout.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import logger, setup_logging
from trl import ModelConfig, TrlParser

from mcadvantage import VinePPOConfig
from mcadvantage.estimators import BUILTIN_ESTIMATORS

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))

from testbed.agent_env import STRUCTURES, AgentEnv, KeyPolicy, agent_rows, make_agent_dataset  # noqa: E402
from testbed.agent_policy import scripted_episode_ids  # noqa: E402

#: The model a real run starts from: small, with a chat template TRL parses tool calls for.
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
#: Exit status of a refused configuration (an estimator that does not take agent episodes).
EXIT_REFUSED = 2
#: The last line the script prints for a refused estimator (examples/README.md quotes it): every built-in estimator
#: takes environment episodes.
REFUSAL_FIX = "Fix: pass --estimator grpo (or {}).".format(
    ", ".join(n for n in BUILTIN_ESTIMATORS if n != "grpo")
)


@dataclass
class AgentArguments:
    """The task and the example's own switches (training settings are :class:`AgentConfig` flags, model settings
    :class:`AgentModelConfig` flags)."""

    env: str = field(
        default="testbed",
        metadata={
            "help": "The environment: 'testbed' (the research testbed's AgentEnv, default), a gymnasium id with discrete "
            "actions (FrozenLake-v1, Taxi-v4, CliffWalking-v1: mcadvantage.envs.gymnasium_environment), or "
            "'openenv:<url>' (an OpenEnv server: mcadvantage.envs.openenv_environment). The task flags below "
            "(--structure, --horizon, ...) and the --quick format warm-up apply to the testbed only; other "
            "environments take --train_rows rows seeded from --task_seed. Needs pip install 'mcadvantage[envs]'."
        },
    )
    quick: bool = field(
        default=False,
        metadata={
            "help": "Run on CPU, offline: a tiny model and tokenizer built here (testbed.agent_policy), taught the "
            "tool-call format with --format_warmup_steps supervised steps, then a few RL steps. Sets small "
            "defaults for the training flags (flags given still win)."
        },
    )
    structure: str = field(
        default="delayed",
        metadata={"help": "Task structure (docs/agent-testbed.md).", "choices": list(STRUCTURES)},
    )
    horizon: int = field(default=3, metadata={"help": "Turns per episode (tool calls before the answer)."})
    choices: int = field(default=4, metadata={"help": "How many choices act() accepts."})
    decisive_turn: int = field(
        default=0, metadata={"help": "The 0-based turn whose choice decides the outcome."}
    )
    train_rows: int = field(
        default=512, metadata={"help": "Training episodes' rows (tasks with random keys)."}
    )
    task_seed: int = field(default=0, metadata={"help": "Seed of the rows' keys (random per row)."})
    format_warmup_steps: int = field(
        default=100,
        metadata={
            "help": "--quick only: supervised steps on scripted episodes that teach the tiny random model the "
            "tool-call format (a stand-in for the SFT checkpoint a real run starts from); 0 skips them."
        },
    )


@dataclass
class AgentConfig(VinePPOConfig):
    """``VinePPOConfig`` with the example's estimator default (``grpo``) and its short flag ``--estimator``."""

    advantage_estimator: str = field(
        default="grpo",
        metadata={
            "aliases": ["--estimator"],
            "help": "The advantage estimator (as VinePPOConfig's advantage_estimator): 'grpo' (default), 'rloo' or "
            "'gae' train tool and environment episodes exactly as trl.GRPOTrainer does, 'vineppo' with Monte Carlo "
            "credit per turn, 'hybrid' with GRPO's advantage plus that credit for tied groups, 'tree' with groups "
            "branching in the first turn, 'anchor' with per-turn credit from the turns that start from the same "
            "environment state (AgentEnv.state_key), no extra samples; an estimator that does not take them is "
            "refused with the reason and the fix.",
        },
    )


@dataclass
class AgentModelConfig(ModelConfig):
    """``trl.ModelConfig`` with the example's model default and its short flag ``--model``."""

    model_name_or_path: str | None = field(
        default=DEFAULT_MODEL,
        metadata={
            "aliases": ["--model"],
            "help": "Model id or local directory; its chat template must support tool calls (ignored with --quick, "
            "which builds its own tiny model).",
        },
    )


#: Defaults of a real run (flags and --config win): a colocated vLLM engine, 8 episodes per task, the model's answer
#: without a thinking block (a small model would spend its whole budget thinking before its first tool call).
REAL_DEFAULTS: dict[str, Any] = {
    "use_vllm": True,
    "vllm_mode": "colocate",
    "num_generations": 8,
    "per_device_train_batch_size": 8,
    "max_completion_length": 512,
    "learning_rate": 1e-6,
    "max_steps": 200,
    "temperature": 1.0,
    "logging_steps": 1,
    "chat_template_kwargs": {"enable_thinking": False},
}

#: Defaults of ``--quick`` (flags win): CPU, transformers generation, a tiny batch, a few steps.
QUICK_DEFAULTS: dict[str, Any] = {
    "use_cpu": True,
    "use_vllm": False,
    "bf16": False,
    "gradient_checkpointing": False,
    "report_to": "none",
    "save_strategy": "no",
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 192,  # room for 4 turns of the tiny model (a turn and its result: about 40 tokens)
    "learning_rate": 1e-4,
    "max_steps": 4,
    "temperature": 1.0,
    "logging_steps": 1,
    "disable_tqdm": True,
    "seed": 0,
    "train_rows": 64,
    "horizon": 2,
}


def make_parser() -> TrlParser:
    """The example's parser: :class:`AgentArguments`, :class:`AgentConfig` and :class:`AgentModelConfig` flags."""
    return TrlParser((AgentArguments, AgentConfig, AgentModelConfig))


def _early(argv: Sequence[str]) -> argparse.Namespace:
    """``--quick`` and ``--model`` as given on the command line, read before the full parse (the defaults of other
    flags depend on them)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--quick", nargs="?", const="true", default="false")
    early.add_argument("--model", "--model_name_or_path", dest="model")
    known, _ = early.parse_known_args(list(argv))
    known.quick = str(known.quick).lower() in ("true", "1", "yes")
    return known


def parse_args(argv: Sequence[str] | None = None) -> tuple[AgentArguments, AgentConfig, AgentModelConfig]:
    """Parse ``argv`` (default ``sys.argv[1:]``) over the real-run or ``--quick`` defaults (``--quick`` is read from
    the command line; flags and ``--config`` win over both) with ``outputs/agent-<model name>`` as the output
    directory; derive ``max_tool_calling_iterations`` unless given: ``--horizon`` + 1, one call past the last turn,
    which the environment refuses."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    early = _early(argv)
    if early.quick and early.model is not None:
        raise ValueError(
            f"--quick builds its own tiny offline model, so --model {early.model} would be ignored. Drop --quick to "
            "train that model, or drop --model."
        )
    parser = make_parser()
    name = "quick" if early.quick else str(early.model or DEFAULT_MODEL).rstrip("/").split("/")[-1]
    output_dir = str(Path("outputs") / f"agent-{name}")
    parser.set_defaults_with_config(
        **(QUICK_DEFAULTS if early.quick else REAL_DEFAULTS), output_dir=output_dir
    )
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    if training_args.max_tool_calling_iterations is None:
        training_args.max_tool_calling_iterations = script_args.horizon + 1
    for name in ("horizon", "train_rows"):
        if getattr(script_args, name) < 1:
            raise ValueError(f"--{name} {getattr(script_args, name)} is invalid: set it >= 1.")
    return script_args, training_args, model_args


def make_environment(script_args: AgentArguments) -> tuple[Any, Any]:
    """The ``environment_factory`` class and the training rows for ``--env``."""
    if script_args.env == "testbed":
        return AgentEnv, agent_dataset(script_args)
    from mcadvantage.envs import environment_dataset, gymnasium_environment, openenv_environment

    if script_args.env.startswith("openenv:"):
        environment = openenv_environment(script_args.env.removeprefix("openenv:"))
    else:
        environment = gymnasium_environment(script_args.env)
    return environment, environment_dataset(environment, script_args.train_rows, script_args.task_seed)


def agent_dataset(script_args: AgentArguments) -> Any:
    """The training rows: one task per row (random keys), the columns ``AgentEnv.reset`` reads."""
    return make_agent_dataset(
        script_args.structure,
        script_args.horizon,
        script_args.train_rows,
        script_args.task_seed,
        choices=script_args.choices,
        decisive_turn=script_args.decisive_turn,
    )


# --------------------------------------------------------------------------------------------------------------
# --quick: a tiny offline model that knows the tool-call format
# --------------------------------------------------------------------------------------------------------------
def quick_model(max_position_embeddings: int = 512) -> tuple[Any, Any]:
    """The testbed's character tokenizer with Qwen3's tool-calling template (compact: a turn is a few tokens) and a
    tiny random Llama for it, built offline."""
    from testbed.agent_policy import build_agent_model, build_agent_tokenizer

    tokenizer = build_agent_tokenizer()
    model = build_agent_model(
        tokenizer,
        max_position_embeddings=max_position_embeddings,
        num_layers=1,
        hidden_size=64,
        head_dim=32,
        intermediate_size=128,
    )
    return tokenizer, model


def teach_format(
    model: Any,
    tokenizer: Any,
    script_args: AgentArguments,
    *,
    steps: int,
    seed: int,
    chat_template_kwargs: dict[str, Any],
    batch_size: int = 8,
    learning_rate: float = 3e-3,
) -> list[float]:
    """Supervised steps on scripted episodes (choices uniform at random, so the key is right 1 time in
    ``--choices``: RL has something to learn) until the tiny model writes well-formed ``act`` calls and its
    ``done``. Returns the loss of each step."""
    import random

    import torch

    from testbed.agent_env import AgentTask, simulate_episode
    from testbed.agent_policy import fit_model_turns

    rng = random.Random(seed)
    torch.manual_seed(seed)
    policy = KeyPolicy(1.0 / script_args.choices)
    rows = agent_rows(
        script_args.structure,
        script_args.horizon,
        64,
        seed + 1,  # other keys than the RL rows'
        choices=script_args.choices,
        decisive_turn=script_args.decisive_turn,
    )
    episodes = []
    for row in rows:
        choices = simulate_episode(AgentTask.from_row(row), policy, rng).choices
        episodes.append(scripted_episode_ids(tokenizer, row, choices, chat_template_kwargs))
    return fit_model_turns(
        model,
        episodes,
        tokenizer.pad_token_id,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        rng=rng,
    )


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------
def build_trainer(
    model: Any, tokenizer: Any, training_args: AgentConfig, train_dataset: Any, environment: Any = AgentEnv
) -> Any:
    """``VinePPOTrainer`` with the environment as ``environment_factory`` and no reward function (the environment's
    ``get_reward`` is the reward). An estimator that refuses agent episodes ends the script with the library's
    message and the flag that fixes it (exit status :data:`EXIT_REFUSED`)."""
    from mcadvantage import VinePPOTrainer

    try:
        return VinePPOTrainer(
            model=model,
            reward_funcs=None,
            args=training_args,
            train_dataset=train_dataset,
            processing_class=tokenizer,
            environment_factory=environment,
        )
    except NotImplementedError as err:
        if training_args.advantage_estimator not in str(err):  # not the refusal of this estimator
            raise
        print(
            f"examples/agent.py: --estimator {training_args.advantage_estimator} cannot train this environment's "
            f"episodes: {err}\n{REFUSAL_FIX}",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_REFUSED) from err


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train the agent, save it, and return a summary (also in ``--output_dir``: the model and tokenizer,
    ``train_results.json``, ``trainer_state.json`` with every logged metric, ``tools/*`` and the environment's
    reward ``rewards/AgentEnv/mean`` included)."""
    os.environ.setdefault(
        "TRL_EXPERIMENTAL_SILENCE", "1"
    )  # environment_factory is marked experimental in TRL
    script_args, training_args, model_args = parse_args(argv)
    setup_logging(training_args)
    environment, train_dataset = make_environment(script_args)
    testbed = environment is AgentEnv

    if script_args.quick:
        # Another environment's prompts carry its rules and tool schema, one character per token: a longer context.
        tokenizer, model = quick_model(512 if testbed else 2048)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        model = model_args.model_name_or_path
        training_args.model_init_kwargs = {
            "revision": model_args.model_revision,
            "dtype": model_args.dtype,
            "attn_implementation": model_args.attn_implementation,
            **(training_args.model_init_kwargs or {}),
        }

    # The trainer first: a refused estimator stops here, before the warm-up or any model is loaded.
    trainer = build_trainer(model, tokenizer, training_args, train_dataset, environment)
    summary: dict[str, Any] = {
        "model": "tiny (--quick)" if script_args.quick else model_args.model_name_or_path,
        "estimator": training_args.advantage_estimator,
        "output_dir": training_args.output_dir,
    }
    if script_args.quick and script_args.format_warmup_steps > 0 and testbed:
        losses = teach_format(
            trainer.model,
            tokenizer,
            script_args,
            steps=script_args.format_warmup_steps,
            seed=training_args.seed,
            chat_template_kwargs=training_args.chat_template_kwargs or {},
        )
        if (
            trainer.ref_model is not None
        ):  # with --beta > 0 the KL reference is the taught model, not the random one
            trainer.ref_model.load_state_dict(trainer.model.state_dict())
        logger.info("Format warm-up: loss %.3f -> %.3f in %d steps", losses[0], losses[-1], len(losses))
        summary["format_warmup_loss"] = [losses[0], losses[-1]]

    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()

    history = trainer.state.log_history
    rewards = [e["reward"] for e in history if "reward" in e]
    calls = [e["tools/call_frequency"] for e in history if "tools/call_frequency" in e]
    failures = [e["tools/failure_frequency"] for e in history if "tools/failure_frequency" in e]
    summary.update(
        steps=trainer.state.global_step,
        reward_first=rewards[0] if rewards else math.nan,
        reward_last=rewards[-1] if rewards else math.nan,
        tool_calls_per_episode=sum(calls) / len(calls) if calls else 0.0,
        tool_failure_rate=sum(failures) / len(failures) if failures else 0.0,
    )
    logger.info(
        "Trained %d steps with --estimator %s: reward %.3f (first step) -> %.3f (last), %.2f tool calls per episode, "
        "%.1f%% of them failed. Saved to %s",
        summary["steps"],
        summary["estimator"],
        summary["reward_first"],
        summary["reward_last"],
        summary["tool_calls_per_episode"],
        100 * summary["tool_failure_rate"],
        training_args.output_dir,
    )
    # End trackers and the process group now, as examples/math.py does (not with a colocated vLLM engine, whose
    # shutdown still needs the group).
    if not (trainer.use_vllm and trainer.vllm_mode == "colocate"):
        trainer.accelerator.end_training()
    return summary


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers warns after fork otherwise
    main()
