"""The estimator contract as a check users run in their own test suites (:func:`check_advantage_estimator`): a tiny
offline training run, every rule written out once so a failure names the rule it broke (:data:`CONTRACT_RULES`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mcadvantage.testing.fakes import save_tiny_model
from mcadvantage.testing.multi_turn import (
    MULTI_TURN_RULES,
    MultiTurnRuleBroken,
    check_multi_turn,
    multi_turn_batch,
    multi_turn_skip_reason,
)

#: The rules of the tiny training run, in the order they are checked.
SINGLE_TURN_RULES = (
    "declares the contract",
    "(B, T) float advantages",
    "finite on the token mask",
    "zero on padding",
    "float metrics under its prefix",
    "a short training step",
    "state_dict round trip through a checkpoint",
)
#: The rules :func:`check_advantage_estimator` checks, in the order it checks them (an
#: :class:`EstimatorContractError` names the one broken): the tiny run's, then the multi-turn part's
#: (:mod:`mcadvantage.testing.multi_turn`).
CONTRACT_RULES = SINGLE_TURN_RULES + MULTI_TURN_RULES


class EstimatorContractError(AssertionError):
    """An advantage estimator broke a rule of the contract (:data:`CONTRACT_RULES`). An ``AssertionError``, so test
    frameworks report it as a failed check.

    Attributes:
        estimator: the estimator's name (or class name when unregistered).
        rule: the broken rule, one of :data:`CONTRACT_RULES`.
    """

    def __init__(self, estimator: str, rule: str, detail: str) -> None:
        self.estimator, self.rule = estimator, rule
        super().__init__(f"advantage estimator {estimator!r} breaks the contract rule {rule!r}: {detail}")


@dataclasses.dataclass(frozen=True)
class EstimatorCheckReport:
    """What :func:`check_advantage_estimator` checked, for a test to assert more on.

    Attributes:
        estimator: the estimator's name (or class name when unregistered).
        batches: generation batches whose advantage results were checked.
        padding_tokens: padding positions checked to be zero (the check fails when there were none).
        logged_metrics: the metric names logged under the estimator's prefix (``"prefix/name"``).
        state_keys: the keys of its ``state_dict()`` after training (empty for a stateless estimator).
        multi_turn_rules: the rules of the multi-turn part it passed (empty when skipped; the state-key rules only
            for an estimator that reads ``batch.turn_keys``).
        multi_turn_skipped: why the multi-turn part was skipped (None: it ran).
    """

    estimator: str
    batches: int
    padding_tokens: int
    logged_metrics: tuple[str, ...]
    state_keys: tuple[str, ...]
    multi_turn_rules: tuple[str, ...] = ()
    multi_turn_skipped: str | None = None


def chunk4(text: str) -> str | list[str]:
    """A step segmenter for tiny runs: steps of 4 characters, so a Monte Carlo estimator sees several steps in an
    8-token response (module level: the config pickles its segmenter)."""
    return [text[i : i + 4] for i in range(0, len(text), 4)] or [text]


def vowel_share(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """A reward with variance on a random tiny model's text: the share of vowels in each completion."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


#: Values that keep a tiny run affordable, for the config fields an estimator reads (applied only to those: a
#: setting another estimator reads would be refused). Groups of 4 responses: a tree's branching must multiply to 4.
TINY_RUN_SETTINGS: dict[str, Any] = {"num_mc_rollouts": 2, "step_segmenter": chunk4, "tree_branching": [2, 2]}


def check_advantage_estimator(
    estimator: Any,
    *,
    workdir: str | Path | None = None,
    config_overrides: dict[str, Any] | None = None,
    reward_func: Callable[..., list[float]] = vowel_share,
    multi_turn: bool = True,
) -> EstimatorCheckReport:
    """Check an advantage estimator against the contract, in your own test suite.

    A tiny offline ``VinePPOTrainer`` (a character tokenizer and a random 1M-parameter Llama, built here, nothing
    downloaded) trains two optimizer steps from one generation batch with the estimator, on CPU, in seconds. Every
    :class:`~mcadvantage.estimators.AdvantageResult` it returns on the way is checked as it is returned, then the
    run and the estimator's state:

    1. *declares the contract*: a subclass of (or adaptable to) :class:`~mcadvantage.estimators.AdvantageEstimator`
       that implements ``estimate``, with typed class attributes;
    2. *(B, T) float advantages*: the shape of the batch's completion mask (so is ``token_mask``, when given);
    3. *finite on the token mask*;
    4. *zero on padding*, on a batch that really has padding (responses are pushed toward early EOS);
    5. *float metrics under its prefix*: plain names, float values, known reductions, each logged as
       ``metric_prefix/name``;
    6. *a short training step*: two steps with finite losses and finite weights;
    7. *state_dict round trip through a checkpoint*: saved into a checkpoint file, loaded into a fresh estimator
       (``from_config``), the same state back.

    Then the multi-turn part (:mod:`mcadvantage.testing.multi_turn`): a hand-built batch of agent episodes (two
    prompt groups, one to three model turns, tool results inside the completions with ``tool_mask`` 0, ``turn_keys``
    that recur within a group) goes to copies of the trained estimator, each result through rules 2 to 5, then:

    8. *accepts multi-turn episodes*: ``estimate`` returns on it;
    9. *tool-result tokens: zero and outside the token mask* (so they stay out of the whitening statistics);
    10. *finite on the model's tokens* (``completion_mask * tool_mask``), inside or outside ``token_mask``;
    11. *the same batch twice, the same advantages* (a stateless estimator called twice; one with state, two copies
        of the same state), and the batch left as given;
    12. *episodes reordered within a group, advantages reordered alike* (responses to a prompt are exchangeable);

    and for an estimator that reads state keys (:class:`~mcadvantage.estimators.base.ReadsStateKeys` with a source
    other than ``"observation"``, e.g. ``"anchor"``):

    13. *unhashable state keys refused with TypeError*;
    14. *state keys renamed one-to-one, the same advantages* (keys compare by value: new objects of another type,
        all printing alike).

    Comparisons hold within ``rtol=1e-5, atol=1e-6``. The multi-turn part is skipped, with the reason in the
    report, for estimators that sample continuations (``uses_rollouts=True``: ``"vineppo"``, ``"hybrid"``): their
    turn credit continues episodes through their tool calls, which needs ``EstimatorContext.episodes`` (a live
    environment and policy) that a hand-built batch cannot give.

    Args:
        estimator: a registered name, an estimator class, or an instance (used as the trainer's
            ``advantage_estimator=``; a class or a name is built with ``from_config``).
        workdir: where the tiny model, the run and the checkpoint go; a temporary directory when None.
        config_overrides: ``VinePPOConfig`` fields over the tiny run's (e.g. your estimator's own settings).
        reward_func: the reward function of the run (default: the share of vowels, which varies on random text).
        multi_turn: run the multi-turn part (False: skip it, for an estimator never trained on agent episodes).

    Returns:
        An :class:`EstimatorCheckReport`.

    Raises:
        EstimatorContractError: naming the broken rule and what was found.
    """
    import tempfile

    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="mcadvantage-estimator-check-") as tmp:
            return check_advantage_estimator(
                estimator,
                workdir=tmp,
                config_overrides=config_overrides,
                reward_func=reward_func,
                multi_turn=multi_turn,
            )
    from mcadvantage.estimators import AdvantageEstimator, as_advantage_estimator, get_advantage_estimator

    workdir = Path(workdir)
    instance: AdvantageEstimator | None = None
    if isinstance(estimator, str):
        cls = get_advantage_estimator(estimator)
    elif isinstance(estimator, type):
        cls = estimator
    else:
        instance = as_advantage_estimator(estimator)
        cls = type(instance)
    # A subclass of a registered estimator inherits its name: only the class registered under it is that name.
    registered = cls.name is not None and get_advantage_estimator(cls.name) is cls
    label = cls.name if registered else cls.__name__
    _check_declaration(cls, label)

    args = _tiny_run_config(cls, workdir / "run", registered, config_overrides or {})
    if instance is None and not registered:
        instance = cls.from_config(args)
    trainer, results = _train_tiny(args, workdir, instance, reward_func, label)
    used = trainer.advantage_estimator

    padding, logged = _check_results(label, results, trainer)
    prefix = used.metric_prefix
    _check_training(label, trainer)
    state_keys = _check_state_round_trip(label, used, trainer.args, workdir / "checkpoint")
    skipped = multi_turn_skip_reason(used) if multi_turn else "multi_turn=False"
    return EstimatorCheckReport(
        estimator=label,
        batches=len(results),
        padding_tokens=padding,
        logged_metrics=tuple(sorted(k for k in logged if k.startswith(f"{prefix}/"))),
        state_keys=state_keys,
        multi_turn_rules=() if skipped else _check_multi_turn(label, trainer),
        multi_turn_skipped=skipped,
    )


def _check_results(label: str, results: list[tuple[Any, Any]], trainer: Any) -> tuple[int, set[str]]:
    """Every result of the run through rules 2 to 4, and its metrics logged under the prefix (rule 5); returns the
    padding tokens seen and the keys the trainer logged."""
    padding = 0
    for batch, result in results:
        padding += _check_result(label, batch, result)
    if not results:
        raise EstimatorContractError(
            label, "a short training step", "estimate() was never called in two steps."
        )
    if padding == 0:
        raise EstimatorContractError(
            label, "zero on padding", "the run's batches had no padding, so the rule could not be checked."
        )
    logged = {key for entry in trainer.state.log_history for key in entry}
    prefix = trainer.advantage_estimator.metric_prefix
    for name in results[-1][1].metrics:
        if f"{prefix}/{name}" not in logged:
            raise EstimatorContractError(
                label, "float metrics under its prefix", f"metric {name!r} was not logged as {prefix}/{name}."
            )
    return padding, logged


def _check_multi_turn(label: str, trainer: Any) -> tuple[str, ...]:
    """The multi-turn part on copies of the trained estimator, with the trainer's context and device."""
    used, args = trainer.advantage_estimator, trainer.args
    batch = multi_turn_batch(
        used,
        trainer.processing_class,
        args.num_generations,
        args.max_completion_length,
        trainer.accelerator.device,
    )
    try:
        return check_multi_turn(
            used, trainer.estimator_context(), batch, lambda b, result: _check_result(label, b, result)
        )
    except MultiTurnRuleBroken as broken:
        raise EstimatorContractError(label, broken.rule, broken.detail) from broken


def _check_declaration(cls: type, label: str) -> None:
    from mcadvantage.estimators import AdvantageEstimator

    rule = "declares the contract"
    if not issubclass(cls, AdvantageEstimator):
        raise EstimatorContractError(label, rule, f"{cls.__qualname__} does not subclass AdvantageEstimator.")
    if cls.estimate is AdvantageEstimator.estimate:
        raise EstimatorContractError(label, rule, "estimate(batch, context) is not implemented.")
    for attr in ("whiten_by_default", "uses_rollouts"):
        if not isinstance(getattr(cls, attr), bool):
            raise EstimatorContractError(label, rule, f"{attr} must be a bool, got {getattr(cls, attr)!r}.")
    if cls.default_scale_rewards not in ("group", "batch", "none"):
        raise EstimatorContractError(
            label,
            rule,
            f"default_scale_rewards={cls.default_scale_rewards!r} is not 'group', 'batch' or 'none'.",
        )
    if not isinstance(cls.metric_prefix, str) or not cls.metric_prefix or "/" in cls.metric_prefix:
        raise EstimatorContractError(
            label, rule, f"metric_prefix={cls.metric_prefix!r} must be a non-empty string without '/'."
        )
    if not all(isinstance(f, str) for f in cls.config_fields) or not all(
        callable(r) for r in cls.config_rules
    ):
        raise EstimatorContractError(
            label,
            rule,
            "config_fields must be field names (str) and config_rules callables rule(config, name).",
        )


def _tiny_run_config(cls: type, output_dir: Path, registered: bool, overrides: dict[str, Any]) -> Any:
    from mcadvantage import VinePPOConfig

    reads = set(cls.config_fields)
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir),
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        save_strategy="no",
        seed=0,
        max_completion_length=8,
        beta=0.0,
        learning_rate=1e-3,
        num_iterations=2,
        gradient_accumulation_steps=2,
        max_steps=2,
        logging_steps=1,
        # A bias toward EOS (token 2 of the character tokenizer) ends some responses early: padding to check.
        generation_kwargs={"sequence_bias": [[[2], 4.0]]},
        **{name: value for name, value in TINY_RUN_SETTINGS.items() if name in reads},
    )
    # An unregistered estimator is passed to the trainer as an instance; the config then names a settings-free
    # built-in and takes the estimator's own whitening default.
    settings["advantage_estimator"] = cls.name if registered else "rloo"
    if not registered:
        settings["whiten_advantages"] = bool(cls.whiten_by_default)
    settings.update(overrides)
    return VinePPOConfig(**settings)


def _train_tiny(
    args: Any, workdir: Path, instance: Any, reward_func: Callable, label: str
) -> tuple[Any, list]:
    from datasets import Dataset

    from mcadvantage import VinePPOTrainer

    model_dir = workdir / "tiny_model"
    if not (model_dir / "config.json").exists():
        save_tiny_model(model_dir)
    dataset = Dataset.from_dict({"prompt": [f"{a}+{a}=" for a in range(4)]})
    trainer = VinePPOTrainer(
        model=str(model_dir),
        reward_funcs=reward_func,
        args=args,
        train_dataset=dataset,
        advantage_estimator=instance,
    )
    results: list[tuple[Any, Any]] = []
    used = trainer.advantage_estimator
    original = used.estimate

    def checked_estimate(batch: Any, context: Any) -> Any:
        result = original(batch, context)
        _check_result(label, batch, result)  # before the trainer uses it: a broken rule is named, not a crash
        results.append((batch, result))
        return result

    # An instance attribute shadows the method for this run only (the estimator's class is left untouched).
    object.__setattr__(used, "estimate", checked_estimate)
    try:
        trainer.train()
    except EstimatorContractError:
        raise
    except Exception as err:
        raise EstimatorContractError(
            label, "a short training step", f"training raised {type(err).__name__}: {err}"
        ) from err
    finally:
        object.__delattr__(used, "estimate")
    return trainer, results


def _check_result(label: str, batch: Any, result: Any) -> int:
    """The rules on one result; returns the number of padding positions checked."""
    import torch

    mask = batch.completion_mask.bool()
    advantages = result.advantages
    if not isinstance(advantages, torch.Tensor) or not advantages.is_floating_point():
        raise EstimatorContractError(
            label,
            "(B, T) float advantages",
            f"advantages must be a float tensor, got {type(advantages).__name__} {getattr(advantages, 'dtype', '')}.",
        )
    if tuple(advantages.shape) != tuple(mask.shape):
        raise EstimatorContractError(
            label,
            "(B, T) float advantages",
            f"advantages have shape {tuple(advantages.shape)}; the batch's completion mask is {tuple(mask.shape)}.",
        )
    valid = mask.clone()
    if result.token_mask is not None:
        if tuple(result.token_mask.shape) != tuple(mask.shape):
            raise EstimatorContractError(
                label, "(B, T) float advantages", f"token_mask has shape {tuple(result.token_mask.shape)}."
            )
        valid &= result.token_mask.to(mask.device).bool()
    advantages = advantages.to(mask.device)
    bad = ~torch.isfinite(advantages) & valid
    if bool(bad.any()):
        raise EstimatorContractError(
            label,
            "finite on the token mask",
            f"{int(bad.sum())} valid tokens are not finite (rows {sorted({int(r) for r in bad.nonzero()[:, 0]})}).",
        )
    padding = advantages[~mask]
    if bool((padding != 0).any()):
        raise EstimatorContractError(
            label,
            "zero on padding",
            f"{int((padding != 0).sum())} of {padding.numel()} padding positions are not zero "
            "(multiply by batch.completion_mask).",
        )
    reductions = ("mean", "sum", "max", "min")
    for key, value in result.metrics.items():
        if not isinstance(key, str) or "/" in key:
            raise EstimatorContractError(
                label, "float metrics under its prefix", f"metric name {key!r} must be a string without '/'."
            )
        if not isinstance(value, float):
            raise EstimatorContractError(
                label,
                "float metrics under its prefix",
                f"metric {key!r} is {type(value).__name__}, not float.",
            )
    for key, how in result.metric_reductions.items():
        if how not in reductions:
            raise EstimatorContractError(
                label,
                "float metrics under its prefix",
                f"metric {key!r} reduces by {how!r}, not one of {reductions}.",
            )
    return int(padding.numel())


def _check_training(label: str, trainer: Any) -> None:
    import torch

    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if trainer.state.global_step != 2 or len(losses) != 2 or not all(math.isfinite(loss) for loss in losses):
        raise EstimatorContractError(
            label,
            "a short training step",
            f"expected 2 steps with finite losses, got {losses} at step {trainer.state.global_step}.",
        )
    if not all(torch.isfinite(p).all() for p in trainer.model.parameters()):
        raise EstimatorContractError(label, "a short training step", "the policy's weights are not finite.")


def _check_state_round_trip(label: str, estimator: Any, args: Any, checkpoint: Path) -> tuple[str, ...]:
    from mcadvantage.trainer.checkpoints import load_estimator_state, save_estimator_state

    rule = "state_dict round trip through a checkpoint"
    state = estimator.state_dict()
    if not isinstance(state, dict):
        raise EstimatorContractError(
            label, rule, f"state_dict() returned {type(state).__name__}, not a dict."
        )
    try:
        save_estimator_state(estimator, checkpoint)
        fresh = type(estimator).from_config(args)
        load_estimator_state(fresh, checkpoint)
    except Exception as err:
        raise EstimatorContractError(label, rule, f"{type(err).__name__}: {err}") from err
    if not _same_state(fresh.state_dict(), state):
        raise EstimatorContractError(
            label, rule, "a fresh estimator loaded from the checkpoint returns a different state_dict()."
        )
    return tuple(sorted(state))


def _same_state(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b
