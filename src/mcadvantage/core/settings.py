"""One definition of every setting's validity: the Monte Carlo settings, the agent environments' settings and the
sampling settings.

:class:`MCSettings` is the one definition of the Monte Carlo settings: each field carries its default, its
``VinePPOConfig`` field name and its help, and :func:`validate_mc_settings` is their one validator. The config's
fields, the estimators that sample continuations (``vineppo``, ``hybrid``) and
:class:`~mcadvantage.mc.estimator.MCValueEstimator` all read them from there, so a setting is accepted or refused
the same way wherever it is given; only the parameter names in the messages differ (``num_mc_rollouts`` in the
config, ``num_rollouts`` in the estimator). The three samplers validate through :func:`validate_sampling_settings`.

Why this module is long: it is the one definition of every setting and its validity; split, a setting's default
and its check would live in two places.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mcadvantage._moved import warn_old_spelling

__all__ = [
    "ALLOCATIONS",
    "ENVIRONMENT_SETTINGS",
    "ROLLOUT_BUDGETS",
    "STEPS_AFTER_CAP",
    "MCSettings",
    "environment_setting_field",
    "mc_config_names",
    "needed_completion_room",
    "refuse_setting_assignment",
    "setting_attribute",
    "validate_environment_settings",
    "validate_mc_settings",
    "validate_sampling_settings",
]

logger = logging.getLogger(__name__)

#: How a Monte Carlo continuation's token budget is set (see :attr:`MCSettings.rollout_budget`).
ROLLOUT_BUDGETS = ("remaining", "fixed")
#: How Monte Carlo rollouts are spread over states (see :attr:`MCSettings.allocation`).
ALLOCATIONS = ("uniform", "variance")
#: What steps past ``max_estimated_steps`` get (see :attr:`MCSettings.steps_after_cap`).
STEPS_AFTER_CAP = ("merge", "zero", "spread")


def _setting(default: Any, help: str, *, config: str | None = None) -> Any:
    """One Monte Carlo setting: its default, the help of its config field, and the config field's name when it is
    not ``mc_<name>``."""
    return field(default=default, metadata={"help": help, "config": config})


@dataclass(frozen=True)
class MCSettings:
    """The Monte Carlo settings, in one object: built once (from a ``VinePPOConfig`` with :meth:`from_config`, or
    directly), validated when built, and passed whole to every estimator that samples continuations
    (:class:`~mcadvantage.estimators.VinePPOEstimator`, :class:`~mcadvantage.estimators.HybridEstimator`,
    :class:`~mcadvantage.mc.estimator.MCValueEstimator`).

    Each field is also a ``VinePPOConfig`` field, ``mc_<name>`` (``num_rollouts`` is ``num_mc_rollouts``), with the
    same default and the help given here (:func:`mc_config_names`). A setting that would have no effect where it is
    given (``fixed_rollout_budget`` without ``rollout_budget="fixed"``, ``min_rollouts`` without
    ``allocation="variance"``, ``steps_after_cap`` other than ``"merge"`` without ``max_estimated_steps``) is
    refused, never ignored.

    Attributes:
        num_rollouts: ``K``, continuations sampled from every state to estimate its value (paper: 9; larger is
            better, K=1 already beats PPO).
        rollout_budget: token budget of a continuation from the state after ``b`` completion tokens:
            ``"remaining"`` gives it ``max_completion_length - b`` tokens, so a continuation faces the same length
            limit as the response it estimates (a state with no budget left is not sampled: its value is the reward
            of the prefix itself, graded as a truncated response); ``"fixed"`` gives every continuation
            ``fixed_rollout_budget`` tokens (the official code's choice: a fresh 1024-token budget). Either is
            capped so prompt + prefix + continuation fit the policy's context.
        fixed_rollout_budget: tokens per continuation with ``rollout_budget="fixed"`` (required there, refused
            otherwise).
        max_estimated_steps: estimate at most the first ``m`` states ``S_0..S_{m-1}`` of a response; what its later
            steps get is ``steps_after_cap``'s choice. None: estimate every state.
        truncated_reward: reward of a continuation that hit its token budget without EOS (and of an unsampled
            no-budget state). None grades it with the reward functions like any other text; the official code
            used 0.0. Never dropped either way.
        steps_after_cap: what the steps past ``max_estimated_steps`` get: ``"merge"`` (one final step whose
            advantage is ``R - V(S_{m-1})``, keeping the telescoping sum ``R - V(S_0)``), ``"zero"`` (advantage 0,
            as the official code on GSM8K) or ``"spread"`` (keep ``max_estimated_steps`` states spread evenly by
            token position over the response instead of the first ones, so cost follows the cap, not the number of
            newlines).
        reuse_samples: count *free samples* in every state's value: the other responses of the batch that pass
            through the state (share its prompt, grading context and prefix tokens, and go on) and every rollout
            that passes through it, leave-one-out (a response's own outcome never enters its own values, which
            keeps the policy gradient unbiased). A state then gets only ``num_rollouts`` minus its free samples as
            new rollouts. Needs ``rollout_budget="remaining"``. ``allocation="variance"`` always pools free samples.
        allocation: ``"uniform"``: every state gets ``num_rollouts`` samples. ``"variance"``: a first wave tops
            every state up to ``min_rollouts`` samples (free ones count), then the rollout tokens ``num_rollouts``
            per state would cost are spent where they cut advantage error most
            (:func:`~mcadvantage.mc.budget.allocate_rollouts`). A state's value mixes its first-wave and
            second-wave means with a share fixed before any outcome is seen, so it is exactly unbiased whatever the
            allocation decides and whatever is masked (see :mod:`mcadvantage.mc.budget`).
        min_rollouts: the first wave of ``allocation="variance"``: samples (free ones included) every state has
            before the rest of the budget is allocated.
        min_step_tokens: merge steps shorter than this many tokens into the next one before estimating, so every
            estimated segment covers at least that many tokens. None: keep every step.
    """

    num_rollouts: int = _setting(
        9,
        "K: continuations sampled from every state to estimate its value (VinePPO paper: 9).",
        config="num_mc_rollouts",
    )
    rollout_budget: Literal["remaining", "fixed"] = _setting(
        "remaining",
        "Token budget of a Monte Carlo continuation: 'remaining' (max_completion_length minus the prefix length) "
        "or 'fixed' (mc_fixed_rollout_budget tokens).",
    )
    fixed_rollout_budget: int | None = _setting(
        None, "Tokens per continuation when mc_rollout_budget='fixed' (official code: 1024)."
    )
    max_estimated_steps: int | None = _setting(
        None,
        "Estimate at most the first m states of a response; mc_steps_after_cap says what later steps get "
        "(official code: 26 states on GSM8K). None: estimate every state.",
    )
    truncated_reward: float | None = _setting(
        None,
        "Reward of a continuation that ran out of budget without EOS. None: grade it with the reward functions "
        "(official code: 0.0).",
    )
    steps_after_cap: Literal["merge", "zero", "spread"] = _setting(
        "merge",
        "What steps past mc_max_estimated_steps get: 'merge' (one final step, R - V(S_{m-1})), 'zero' (advantage "
        "0, the official code on GSM8K) or 'spread' (keep the cap's number of states, spread evenly over the "
        "response).",
    )
    reuse_samples: bool = _setting(
        False,
        "Count the other responses and rollouts that pass through a state as samples of its value "
        "(leave-one-out); new rollouts only top each state up to num_mc_rollouts samples.",
    )
    allocation: Literal["uniform", "variance"] = _setting(
        "uniform",
        "'uniform' (num_mc_rollouts samples per state) or 'variance' (the same rollout tokens, spent where they "
        "cut advantage error most).",
    )
    min_rollouts: int = _setting(1, "mc_allocation='variance': samples every state gets in the first wave.")
    min_step_tokens: int | None = _setting(
        None, "Merge steps shorter than this many tokens into the next one. None: keep every step."
    )

    def __post_init__(self) -> None:
        validate_mc_settings(**self.as_dict())
        # Normalised once here, so every reader sees the same types (a reward of 0 is the float 0.0).
        if self.truncated_reward is not None:
            object.__setattr__(self, "truncated_reward", float(self.truncated_reward))
        object.__setattr__(self, "reuse_samples", bool(self.reuse_samples))

    @property
    def pools_free_samples(self) -> bool:
        """Whether the values pool free samples (the batch's other responses and every rollout through a state):
        with ``reuse_samples`` and with ``allocation="variance"``."""
        return self.reuse_samples or self.allocation == "variance"

    def as_dict(self) -> dict[str, Any]:
        """The settings by name, in definition order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> MCSettings:
        """A copy with ``changes`` applied (and validated), refusing a name that is not a Monte Carlo setting."""
        unknown = [name for name in changes if name not in _FIELD_NAMES]
        if unknown:
            raise TypeError(
                f"{', '.join(sorted(unknown))} is not a Monte Carlo setting; the settings are "
                f"{', '.join(_FIELD_NAMES)} (see mcadvantage.core.settings.MCSettings)."
            )
        return dataclasses.replace(self, **changes) if changes else self

    def check_completion_room(self, max_completion_length: int | None) -> None:
        """Refuse ``rollout_budget="remaining"`` without a response budget to share (``max_completion_length``)."""
        validate_mc_settings(**self.as_dict(), max_completion_length=max_completion_length)

    @classmethod
    def from_config(cls, config: Any) -> MCSettings:
        """The settings of a ``VinePPOConfig`` (or any object with its field names), validated with the config's
        names in the messages (including that ``rollout_budget="remaining"`` has a ``max_completion_length``)."""
        values = {name: getattr(config, config_name) for name, config_name in mc_config_names().items()}
        validate_mc_settings(
            **values, max_completion_length=getattr(config, "max_completion_length", None), names="config"
        )
        settings = cls(**values)
        logger.debug("Monte Carlo settings: %s", settings)
        return settings

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MCSettings:
        """The settings a mapping gives under their ``VinePPOConfig`` names (verl's ``vineppo`` config section, a YAML
        or JSON file), each missing one at its default from this definition, validated with those names; keys that
        are not Monte Carlo settings are left to the caller. One spelling everywhere: a key spelled as the
        estimator's argument where the config spells it otherwise (``num_rollouts`` for ``num_mc_rollouts``,
        ``max_estimated_steps`` for ``mc_max_estimated_steps``) is refused with the spelling to use.

        Raises:
            TypeError: a setting under its estimator spelling, or a value of the wrong type.
            ValueError: an invalid value (:func:`validate_mc_settings`).
        """
        config_names = mc_config_names()
        misspelled = [f"{name} (use {config_names[name]})" for name in values if name in config_names]
        if misspelled:
            raise TypeError(
                f"Monte Carlo settings are given under their VinePPOConfig names: {', '.join(sorted(misspelled))}."
            )
        chosen = {name: values[config] for name, config in config_names.items() if config in values}
        validate_mc_settings(**chosen, names="config")
        return cls(**chosen)

    @classmethod
    def config_field(cls, name: str) -> Any:
        """The ``VinePPOConfig`` dataclass field of setting ``name``: its default and help from this definition."""
        spec = _FIELDS[name]
        return field(default=spec.default, metadata={"help": spec.metadata["help"]})


_FIELDS = {f.name: f for f in dataclasses.fields(MCSettings)}
_FIELD_NAMES = tuple(_FIELDS)


def setting_attribute(owner: object, name: str) -> Any:
    """``owner.<setting>`` for an object that holds its Monte Carlo settings as ``owner.settings`` (its
    ``__getattr__``): the setting's value, so ``estimator.num_rollouts`` (0.1's spelling, with a ``FutureWarning``)
    reads ``estimator.settings.num_rollouts``."""
    settings = vars(owner).get("settings")
    if isinstance(settings, MCSettings) and name in _FIELDS:
        kind = type(owner).__name__
        # 4 frames up: warn_old_spelling, here, the owner's __getattr__, the line that read the alias.
        warn_old_spelling(f"{kind}.{name}", f"{kind}.settings.{name}", stacklevel=4)
        return getattr(settings, name)
    raise AttributeError(f"{type(owner).__name__!r} object has no attribute {name!r}")


def refuse_setting_assignment(owner: object, name: str) -> None:
    """Refuse ``owner.<setting> = value`` (its ``__setattr__``): the value would be stored beside the settings the
    estimator reads, and silently ignored."""
    if name in _FIELDS:
        owner_name = type(owner).__name__
        raise AttributeError(
            f"{owner_name}.{name} is read from its Monte Carlo settings, so setting it alone would be ignored; "
            f"replace them whole: estimator.settings = estimator.settings.replace({name}=...)."
        )


def mc_config_names() -> dict[str, str]:
    """Each Monte Carlo setting's ``VinePPOConfig`` field name: ``mc_<name>`` unless the definition names another."""
    return {name: f.metadata["config"] or f"mc_{name}" for name, f in _FIELDS.items()}


# Canonical setting -> the name a caller exposes (the estimator's own names are the canonical ones).
_CONFIG_NAMES = {**mc_config_names(), "max_completion_length": "max_completion_length"}

_UNCHECKED: Any = object()  # max_completion_length not given: the settings alone are checked


def validate_mc_settings(
    *,
    max_completion_length: int | None = _UNCHECKED,
    names: Mapping[str, str] | str | None = None,
    **settings: Any,
) -> None:
    """Refuse invalid or contradictory Monte Carlo settings, naming the parameter, its value and the fix: the one
    validator of :class:`MCSettings` (which calls it when built).

    Args:
        max_completion_length: the responses' token budget, which ``rollout_budget="remaining"`` needs; when not
            given, only the settings themselves are checked.
        names: the caller's parameter names: ``"config"`` for ``VinePPOConfig``'s field names, a mapping from
            the canonical names above, or None for the canonical (``MCValueEstimator``) names.
        **settings: :class:`MCSettings` fields; the ones left out take their defaults.
    Raises:
        TypeError: an unknown setting, or ``num_rollouts`` is not an int.
        ValueError: any other invalid value.
    """
    table = _CONFIG_NAMES if names == "config" else dict(names or {})

    def n(key: str) -> str:
        return table.get(key, key)

    unknown = [key for key in settings if key not in _FIELDS]
    if unknown:
        raise TypeError(
            f"{', '.join(sorted(unknown))} is not a Monte Carlo setting; the settings are "
            f"{', '.join(n(k) for k in _FIELD_NAMES)}."
        )
    values = {name: settings.get(name, f.default) for name, f in _FIELDS.items()}
    _check_rollouts(values, n)
    _check_budget(values, n, max_completion_length)
    _check_cap(values, n)
    _check_allocation(values, n)
    _check_samples_and_steps(values, n)


def _check_rollouts(values: dict[str, Any], n: Callable[[str], str]) -> None:
    """``num_rollouts``: an int >= 1 (``n`` gives the caller's name of a setting)."""
    num_rollouts = values["num_rollouts"]
    if isinstance(num_rollouts, bool) or not isinstance(num_rollouts, int):
        raise TypeError(
            f"{n('num_rollouts')} must be an int, got {num_rollouts!r}. Set it to the number of continuations "
            f"per state, e.g. {n('num_rollouts')}=9."
        )
    if num_rollouts < 1:
        raise ValueError(
            f"{n('num_rollouts')}={num_rollouts} is invalid: every state needs at least one Monte Carlo "
            f"continuation. Set {n('num_rollouts')} >= 1 (the paper uses 9)."
        )


def _check_budget(values: dict[str, Any], n: Callable[[str], str], max_completion_length: Any) -> None:
    """``rollout_budget`` and ``fixed_rollout_budget`` (and, for ``"remaining"``, ``max_completion_length``)."""
    rollout_budget = values["rollout_budget"]
    fixed_rollout_budget = values["fixed_rollout_budget"]
    if rollout_budget not in ROLLOUT_BUDGETS:
        raise ValueError(
            f"{n('rollout_budget')}={rollout_budget!r} is invalid. Use 'remaining' (continuations get what is "
            f"left of {n('max_completion_length')}) or 'fixed' (with {n('fixed_rollout_budget')})."
        )
    if rollout_budget == "fixed":
        if fixed_rollout_budget is None:
            raise ValueError(
                f"{n('rollout_budget')}='fixed' needs {n('fixed_rollout_budget')} (tokens per continuation), which "
                f"is None. Set {n('fixed_rollout_budget')}, e.g. 1024 (the official code), or use "
                f"{n('rollout_budget')}='remaining'."
            )
        if fixed_rollout_budget < 1:
            raise ValueError(
                f"{n('fixed_rollout_budget')}={fixed_rollout_budget} is invalid: a continuation needs at least one "
                f"token. Set {n('fixed_rollout_budget')} >= 1."
            )
    else:
        if fixed_rollout_budget is not None:
            raise ValueError(
                f"{n('fixed_rollout_budget')}={fixed_rollout_budget} is set but {n('rollout_budget')}="
                f"{rollout_budget!r} ignores it. Set {n('rollout_budget')}='fixed' to use it, or drop "
                f"{n('fixed_rollout_budget')}."
            )
        if max_completion_length is not _UNCHECKED and (
            max_completion_length is None or max_completion_length < 1
        ):
            raise ValueError(
                f"{n('rollout_budget')}='remaining' needs {n('max_completion_length')} >= 1 (the budget "
                f"continuations share with the response), got {max_completion_length!r}. Set it, or use "
                f"{n('rollout_budget')}='fixed'."
            )


def _check_cap(values: dict[str, Any], n: Callable[[str], str]) -> None:
    """``max_estimated_steps`` and ``steps_after_cap``."""
    max_estimated_steps = values["max_estimated_steps"]
    steps_after_cap = values["steps_after_cap"]
    if max_estimated_steps is not None and max_estimated_steps < 1:
        raise ValueError(
            f"{n('max_estimated_steps')}={max_estimated_steps} is invalid: at least the prompt state S_0 must be "
            f"estimated. Set {n('max_estimated_steps')} >= 1, or None to estimate every step."
        )
    if steps_after_cap not in STEPS_AFTER_CAP:
        raise ValueError(
            f"{n('steps_after_cap')}={steps_after_cap!r} is invalid. Use 'merge' (steps past the cap form one final "
            "step, R - V(S_{m-1})), 'zero' (they get advantage 0, as the official VinePPO code on GSM8K) or "
            "'spread' (keep the cap's number of states, spread evenly over the response)."
        )
    if steps_after_cap == "spread" and max_estimated_steps is None:
        raise ValueError(
            f"{n('steps_after_cap')}='spread' spreads {n('max_estimated_steps')} states over each response, but "
            f"{n('max_estimated_steps')} is None. Use {n('steps_after_cap')}='merge' (the default), or set "
            f"{n('max_estimated_steps')} (e.g. 8)."
        )
    if steps_after_cap == "zero" and max_estimated_steps is None:
        raise ValueError(
            f"{n('steps_after_cap')}='zero' gives the steps past {n('max_estimated_steps')} advantage 0, but "
            f"{n('max_estimated_steps')} is None (no cap), so it would change nothing. Use "
            f"{n('steps_after_cap')}='merge' (the default), or set {n('max_estimated_steps')} (the official code: 26 "
            "on GSM8K)."
        )


def _check_allocation(values: dict[str, Any], n: Callable[[str], str]) -> None:
    """``allocation`` and ``min_rollouts`` (against ``num_rollouts``)."""
    allocation = values["allocation"]
    min_rollouts = values["min_rollouts"]
    num_rollouts = values["num_rollouts"]
    if allocation not in ALLOCATIONS:
        raise ValueError(
            f"{n('allocation')}={allocation!r} is invalid. Use 'uniform' ({n('num_rollouts')} samples per state) "
            f"or 'variance' (the same rollout tokens, spent where they reduce advantage error most)."
        )
    if isinstance(min_rollouts, bool) or not isinstance(min_rollouts, int) or min_rollouts < 1:
        raise ValueError(
            f"{n('min_rollouts')}={min_rollouts!r} is invalid: every state needs at least one sample besides the "
            f"response's own. Set {n('min_rollouts')} to an int >= 1 (default 1)."
        )
    if allocation == "variance" and min_rollouts > num_rollouts:
        raise ValueError(
            f"{n('min_rollouts')}={min_rollouts} exceeds {n('num_rollouts')}={num_rollouts}: the first wave "
            f"would spend more than the whole budget. Set {n('min_rollouts')} <= {n('num_rollouts')}."
        )
    if allocation != "variance" and min_rollouts != 1:
        raise ValueError(
            f"{n('min_rollouts')}={min_rollouts} is set but {n('allocation')}={allocation!r} ignores it (it sizes "
            f"the first wave of {n('allocation')}='variance'). Set {n('allocation')}='variance' to use it, or "
            f"drop {n('min_rollouts')}."
        )


def _check_samples_and_steps(values: dict[str, Any], n: Callable[[str], str]) -> None:
    """``reuse_samples`` (against ``rollout_budget``), ``min_step_tokens`` and ``truncated_reward``."""
    reuse_samples = values["reuse_samples"]
    rollout_budget = values["rollout_budget"]
    min_step_tokens = values["min_step_tokens"]
    truncated_reward = values["truncated_reward"]
    if reuse_samples and rollout_budget != "remaining":
        raise ValueError(
            f"{n('reuse_samples')}=True needs {n('rollout_budget')}='remaining', got {rollout_budget!r}: a "
            "response is a draw of a state's value only when rollouts from that state get the budget the response "
            f"had left. Set {n('rollout_budget')}='remaining' or {n('reuse_samples')}=False."
        )
    if min_step_tokens is not None and (
        isinstance(min_step_tokens, bool) or not isinstance(min_step_tokens, int) or min_step_tokens < 1
    ):
        raise ValueError(
            f"{n('min_step_tokens')}={min_step_tokens!r} is invalid. Set it to an int >= 1 (steps shorter than "
            "this many tokens are merged into the next one) or None to keep every step."
        )
    if truncated_reward is not None and not math.isfinite(float(truncated_reward)):
        raise ValueError(
            f"{n('truncated_reward')}={truncated_reward} is invalid: it must be a finite reward (e.g. 0.0, the "
            "official code's) or None to grade truncated continuations normally."
        )


#: The agent environments' settings, defined once like the Monte Carlo settings above: each is a ``VinePPOConfig``
#: field of every estimator (default, help) and is validated by :func:`validate_environment_settings`.
ENVIRONMENT_SETTINGS: dict[str, tuple[Any, str]] = {
    "env_max_sessions": (
        16,
        "The most server sessions an OpenEnv environment class (mcadvantage.envs.openenv_environment) holds open at "
        "once, for the batch's episodes and every Monte Carlo continuation together: a continuation whose session "
        "was handed to another is rebuilt by replay on a free one, so the open sessions never grow with batch x "
        "num_mc_rollouts. Below the server's max_concurrent_envs (openenv-core's default is 1; "
        "python -m mcadvantage.envs.openenv_server serves 256).",
    ),
}


def environment_setting_field(name: str) -> Any:
    """The ``VinePPOConfig`` dataclass field of environment setting ``name``: its default and help from
    :data:`ENVIRONMENT_SETTINGS`."""
    default, help_text = ENVIRONMENT_SETTINGS[name]
    return field(default=default, metadata={"help": help_text})


def validate_environment_settings(*, env_max_sessions: int) -> None:
    """Refuse an invalid environment setting, naming it, its value and the fix."""
    if isinstance(env_max_sessions, bool) or not isinstance(env_max_sessions, int) or env_max_sessions < 1:
        raise ValueError(
            f"env_max_sessions={env_max_sessions!r} is invalid: an OpenEnv environment needs at least one server "
            f"session. Set it to an int >= 1 (default {ENVIRONMENT_SETTINGS['env_max_sessions'][0]}), at most the "
            "server's max_concurrent_envs."
        )


def needed_completion_room(
    max_completion_length: int | None, rollout_budget: str, fixed_rollout_budget: int | None
) -> tuple[int, str]:
    """Positions a prompt must leave free in the context (a full response, and a full fixed-budget rollout), and
    the name of the setting that decides it (for error messages)."""
    room, name = int(max_completion_length or 0), "max_completion_length"
    if rollout_budget == "fixed" and fixed_rollout_budget is not None and fixed_rollout_budget > room:
        room, name = int(fixed_rollout_budget), mc_config_names()["fixed_rollout_budget"]
    return room, name


def validate_sampling_settings(
    owner: str,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> None:
    """The one rule every sampler applies: ``temperature >= 0`` (0 = greedy: every continuation of a request is
    the policy's mode), ``top_p`` in (0, 1], ``top_k`` None (off) or >= 1, ``min_p`` None or in [0, 1],
    ``repetition_penalty > 0`` (1 = off). Raises ``ValueError`` naming ``owner``, the parameter and the fix."""
    if not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(
            f"{owner}: temperature={temperature!r} is invalid; it must be >= 0 (0 means greedy). Use the "
            "training responses' temperature so Monte Carlo values estimate the current policy."
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"{owner}: top_p={top_p!r} must be in (0, 1]; use 1.0 to disable nucleus sampling.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(
            f"{owner}: top_k={top_k!r} must be None (no top-k filtering) or an int >= 1; TRL's top_k=0 means "
            "None."
        )
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueError(f"{owner}: min_p={min_p!r} must be None (off) or in [0, 1].")
    if not repetition_penalty > 0:
        raise ValueError(
            f"{owner}: repetition_penalty={repetition_penalty!r} must be > 0 (1.0 means no penalty)."
        )
