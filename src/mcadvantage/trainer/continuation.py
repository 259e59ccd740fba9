"""``continuation_func``: Monte Carlo credit for a ``rollout_func``'s episodes.

TRL's ``rollout_func(prompts, trainer)`` plays whole episodes the trainer cannot see inside (its own engine,
environment, tool loop). A Monte Carlo estimator needs more: to continue an episode from a prefix of its completion,
``num_mc_rollouts`` times per state. ``continuation_func`` is that counterpart, passed to
:class:`~mcadvantage.trainer.vineppo_trainer.VinePPOTrainer` next to ``rollout_func``::

    def continuation_func(requests: list[ContinuationRequest], trainer) -> dict:
        return {"completion_ids": [tokens generated after request.completion_ids, for each request], **extra_fields}

It receives one :class:`ContinuationRequest` per continuation (a state is repeated ``num_mc_rollouts`` times in a
row, as TRL repeats a prompt ``num_generations`` times for ``rollout_func``) and returns, like ``rollout_func``, a
dict with ``"completion_ids"`` (one list of token ids per request: what follows the prefix, EOS included when the
episode ended, at most ``request.max_tokens`` tokens) and the same extra fields ``rollout_func`` returns (one value
per request, or one value for all), which reach the reward functions for that continuation as ``rollout_func``'s
reach them for a response. A plain list of token-id lists is accepted when ``rollout_func`` returns no extra fields.

:class:`ContinuationSampler` wraps the function as a :class:`~mcadvantage.samplers.Sampler`, so the whole Monte
Carlo pipeline (every ``mc_*`` setting) runs unchanged; continuations are graded by the trainer's reward functions
on ``decode(prefix + continuation)``, exactly as other rollouts. A continuation that does not end with an EOS (or
padding) token counts as truncated (TRL's rule for a response).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mcadvantage.samplers.base import Continuation, RolloutRequest

if TYPE_CHECKING:
    from mcadvantage.estimators.base import AdvantageEstimator
    from mcadvantage.estimators.batch import AdvantageBatch
    from mcadvantage.samplers.base import Sampler

__all__ = [
    "ContinuationRequest",
    "ContinuationSampler",
    "RolloutContinuation",
    "RolloutFields",
    "attach_continuation",
    "check_continuation_func",
    "rollout_extra_fields",
]

#: Keys of a ``rollout_func`` output that are not reward-function fields: TRL's required keys, the log-probabilities'
#: token ids and ``env_mask`` (TRL pops it as the tool mask).
ROLLOUT_OWN_KEYS = frozenset({"prompt_ids", "completion_ids", "logprobs", "logprob_token_ids", "env_mask"})


@dataclass(frozen=True)
class ContinuationRequest:
    """One continuation to generate: resume the episode ``prompt`` + ``completion_ids`` and return what follows.

    Attributes:
        prompt: the prompt as ``rollout_func`` received it (a string or a message list).
        prompt_ids: the prompt's token ids as ``rollout_func`` returned them.
        completion_ids: the episode's completion so far (the prefix), environment tokens included.
        max_tokens: the most tokens the continuation may have (``max_completion_length`` minus the prefix, or
            ``mc_fixed_rollout_budget``, capped by the model's context); always >= 1.
        row: the episode's dataset row (its ``prompt`` and every other column; ``rollout_func``'s extra fields are
            not in it: they described the original response, not this continuation).
        env_mask: ``rollout_func``'s ``env_mask`` over the prefix (0 on tokens the model did not generate), or
            None when ``rollout_func`` returned none.
    """

    prompt: Any
    prompt_ids: list[int]
    completion_ids: list[int]
    max_tokens: int
    row: dict[str, Any]
    env_mask: list[int] | None = None


ContinuationFunc = Callable[[list[ContinuationRequest], Any], Any]


class RolloutFields:
    """Wraps a ``rollout_func`` to record which extra fields it returns (the keys a continuation must return too),
    passing its output through unchanged."""

    def __init__(self, rollout_func: Callable[..., Any]) -> None:
        self.rollout_func = rollout_func
        self.keys: set[str] = set()
        self.__name__ = getattr(rollout_func, "__name__", type(rollout_func).__name__)

    def __call__(self, prompts: list[Any], trainer: Any) -> Any:
        output = self.rollout_func(prompts, trainer)
        if isinstance(output, Mapping):
            self.keys = rollout_extra_fields(output)
        return output


def rollout_extra_fields(output: Mapping[str, Any]) -> set[str]:
    """The keys of a ``rollout_func`` (or ``continuation_func``) output that reach the reward functions."""
    return {str(k) for k in output if k not in ROLLOUT_OWN_KEYS}


def check_continuation_func(
    continuation_func: Any, kwargs: Mapping[str, Any], estimator: AdvantageEstimator
) -> None:
    """Refuse a ``continuation_func`` that would be silently ignored: without ``rollout_func=``, under an estimator
    that does not continue episodes (``"grpo"`` / ``"rloo"`` / ``"gae"`` sample nothing; ``"tree"`` does not take a
    ``rollout_func``; ``"vineppo"`` and ``"hybrid"`` continue them), next to ``tools=`` / ``environment_factory=`` (those episodes are continued through
    TRL's tool loop), or not callable."""
    if continuation_func is None:
        return
    from mcadvantage.estimators.base import ContinuesEpisodes

    if not callable(continuation_func):
        raise TypeError(
            f"continuation_func={continuation_func!r} is not callable; pass a function "
            "f(requests: list[ContinuationRequest], trainer) -> {'completion_ids': [...], ...}."
        )
    if kwargs.get("rollout_func") is None:
        raise ValueError(
            "continuation_func= is given without rollout_func=: it continues a rollout_func's episodes for Monte Carlo "
            "credit, and the trainer's own generation is continued by its engine already. Drop continuation_func, or "
            "pass the rollout_func whose episodes it continues."
        )
    agents = [k for k in ("tools", "environment_factory") if kwargs.get(k) is not None]
    if agents:
        raise ValueError(
            f"continuation_func= is given with {' and '.join(f'{k}=' for k in agents)}: those episodes are continued "
            "through TRL's tool loop, so continuation_func would be ignored. Drop continuation_func, or drop "
            f"{' / '.join(agents)} and let your rollout_func run its tools."
        )
    name = estimator.name or type(estimator).__name__
    if not isinstance(estimator, ContinuesEpisodes):
        why = (
            "samples no continuations, so it would never be called"
            if not estimator.uses_rollouts
            else "does not take a rollout_func"
        )
        raise ValueError(
            f"continuation_func= is given with advantage_estimator={name!r}, which {why}. Use "
            "advantage_estimator='vineppo' or 'hybrid' for Monte Carlo credit on rollout_func episodes, or drop "
            "continuation_func "
            "(advantage_estimator='grpo', 'rloo' and 'gae' train rollout_func episodes as trl.GRPOTrainer does)."
        )


def _is_token_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


class ContinuationSampler:
    """A :class:`~mcadvantage.samplers.Sampler` that draws Monte Carlo continuations with a user's
    ``continuation_func`` (one call per wave of the estimator: every request of the wave in one list).

    Args:
        func: the ``continuation_func``.
        trainer: passed to ``func`` as its second argument (as TRL passes itself to ``rollout_func``).
        stop_token_ids: tokens that end an episode (EOS, padding): a continuation ending otherwise is truncated.
        required_fields: the extra fields ``rollout_func`` returned, which every output must hold too (a callable is
            read at each call, as ``rollout_func`` may run after the sampler is built).
    """

    #: The estimator may give it states whose prefix holds environment tokens (``env_mask`` 0): it continues
    #: episodes, not just text.
    continues_episodes = True

    def __init__(
        self,
        func: ContinuationFunc,
        trainer: Any,
        stop_token_ids: Iterable[int | None],
        required_fields: Iterable[str] | Callable[[], Iterable[str]] = (),
    ) -> None:
        self.func = func
        self.trainer = trainer
        self.stop_token_ids = {int(t) for t in stop_token_ids if t is not None}
        self._required = required_fields

    @property
    def required_fields(self) -> set[str]:
        required = self._required() if callable(self._required) else self._required
        return set(required)

    @staticmethod
    def continuation_request(request: RolloutRequest) -> ContinuationRequest:
        """What ``continuation_func`` receives for one sample of ``request`` (from its ``origin``)."""
        if request.origin is None:
            raise ValueError(
                "ContinuationSampler: a RolloutRequest without origin; continuation_func continues a Monte Carlo "
                "state and needs the trajectory it belongs to (MCValueEstimator sets RolloutRequest.origin). Sample "
                "other requests with an engine sampler (mcadvantage.samplers)."
            )
        traj, prefix_len = request.origin
        mask = traj.tool_mask
        return ContinuationRequest(
            prompt=traj.prompt,
            prompt_ids=list(traj.prompt_ids),
            completion_ids=list(traj.completion_ids[:prefix_len]),
            max_tokens=request.max_tokens,
            row={"prompt": traj.prompt, **traj.fields},
            env_mask=None if mask is None else [int(m) for m in mask[:prefix_len]],
        )

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``request.n`` continuations of every request, from one ``continuation_func`` call."""
        asks: list[ContinuationRequest] = []
        for request in requests:
            asks.extend([self.continuation_request(request)] * request.n)
        if not asks:
            return []
        tokens, fields = self._read_output(self.func(asks, self.trainer), asks)
        out: list[list[Continuation]] = []
        start = 0
        for request in requests:
            conts = []
            for j in range(start, start + request.n):
                ids = tokens[j]
                truncated = not ids or ids[-1] not in self.stop_token_ids
                conts.append(Continuation(tuple(ids), truncated=truncated, fields=fields[j]))
            out.append(conts)
            start += request.n
        return out

    def _read_output(
        self, output: Any, asks: list[ContinuationRequest]
    ) -> tuple[list[list[int]], list[dict[str, Any]]]:
        """The token ids and the reward-function fields of each continuation, checked against the requests."""
        completion_ids, extra = _split_output(output)
        self._check_fields(extra)
        tokens = _checked_tokens(completion_ids, asks)
        return tokens, _fields_per_item(output, sorted(extra), len(asks))

    def _check_fields(self, extra: set[str]) -> None:
        """Refuse an output whose extra fields are not exactly those ``rollout_func`` returns."""
        required = self.required_fields
        if extra != required:
            missing, unknown = sorted(required - extra), sorted(extra - required)
            raise ValueError(
                "continuation_func must return the extra fields rollout_func returns (they reach the reward "
                f"functions for each continuation as for each response): rollout_func returns {sorted(required)}, "
                f"continuation_func returned {sorted(extra)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; not returned by rollout_func {unknown}" if unknown else "")
                + ". Return the same keys, one value per request."
            )


def _split_output(output: Any) -> tuple[Any, set[str]]:
    """``(completion_ids, extra field names)`` of a ``continuation_func``'s output (a dict as ``rollout_func``
    returns, or a bare list of token-id lists)."""
    if isinstance(output, Mapping):
        if "completion_ids" not in output:
            raise ValueError(
                f"continuation_func returned a dict without 'completion_ids' (keys: {sorted(output)}); return "
                "{'completion_ids': [token ids after each request's prefix], ...} as rollout_func does."
            )
        return output["completion_ids"], rollout_extra_fields(output)
    if _is_token_list(output):
        return output, set()
    raise TypeError(
        f"continuation_func returned {type(output).__name__}; return a dict {{'completion_ids': [...], "
        "<rollout_func's extra fields>}} (or a list of token-id lists, one per request)."
    )


def _checked_tokens(completion_ids: Any, asks: list[ContinuationRequest]) -> list[list[int]]:
    """One list of token ids per request, in order, each within its request's ``max_tokens``."""
    size = len(asks)
    if not _is_token_list(completion_ids) or len(completion_ids) != size:
        got = len(completion_ids) if _is_token_list(completion_ids) else type(completion_ids).__name__
        raise ValueError(
            f"continuation_func returned {got} completion_ids for {size} requests; return one list of token ids "
            "per request, in order (a state asked num_mc_rollouts times appears that many times)."
        )
    tokens: list[list[int]] = []
    for j, (ids, ask) in enumerate(zip(completion_ids, asks, strict=True)):
        if not _is_token_list(ids):
            raise TypeError(
                f"continuation_func: completion_ids[{j}] is {type(ids).__name__}, not a list of token ids."
            )
        ids = [int(t) for t in ids]
        if len(ids) > ask.max_tokens:
            raise ValueError(
                f"continuation_func returned {len(ids)} tokens for request {j}, whose max_tokens is "
                f"{ask.max_tokens}; a continuation must stay within the episode's remaining budget (stop, or cut "
                "it, at request.max_tokens)."
            )
        tokens.append(ids)
    return tokens


def _fields_per_item(output: Any, keys: list[str], size: int) -> list[dict[str, Any]]:
    """Each continuation's extra fields: TRL's rule for ``rollout_func``'s fields (a list holds one value per row,
    any other value is every row's)."""
    per_item: list[dict[str, Any]] = [{} for _ in range(size)]
    for key in keys:
        values = output[key]
        if isinstance(values, list):
            if len(values) != size:
                raise ValueError(
                    f"continuation_func returned {len(values)} values of {key!r} for {size} requests; return "
                    "one per request (or a single non-list value for all)."
                )
            for j in range(size):
                per_item[j][key] = values[j]
        else:
            for j in range(size):
                per_item[j][key] = values
    return per_item


class RolloutContinuation:
    """What :class:`~mcadvantage.trainer.vineppo_trainer.VinePPOTrainer` holds for its ``continuation_func`` (None:
    none given, and every method leaves things as they are).

    Args:
        func: the ``continuation_func``, or None.
        fields: the wrapped ``rollout_func`` that records its extra fields (None without ``func``).
    """

    def __init__(self, func: ContinuationFunc | None, fields: RolloutFields | None = None) -> None:
        self.func = func
        self.fields = fields

    @property
    def active(self) -> bool:
        return self.func is not None

    def sampler(self, trainer: Any, default: Sampler | None = None) -> Sampler | None:
        """The Monte Carlo sampler around ``func`` for ``trainer`` (called after GRPO's init: it reads the stop
        tokens), or ``default`` (the trainer's ``mc_sampler``) without a ``continuation_func``; both is refused."""
        if self.func is None:
            return default
        if default is not None:
            raise ValueError(
                f"continuation_func= and mc_sampler={default!r} are both given; both would draw the Monte Carlo "
                "continuations. Pass one: continuation_func for rollout_func episodes."
            )
        fields = self.fields
        return ContinuationSampler(
            self.func,
            trainer,
            trainer.stop_token_ids(),
            required_fields=lambda: fields.keys if fields is not None else (),
        )

    def dataset_rows(self, batch: AdvantageBatch) -> AdvantageBatch:
        """``batch`` with rows holding only the dataset's columns: ``rollout_func``'s extra fields described its
        responses, not their continuations (which return their own). So identical states of two responses to one
        prompt are estimated once, and ``continuation_func`` gets the dataset row."""
        if self.fields is None:
            return batch
        own = self.fields.keys | {"logprob_token_ids"}
        return replace(batch, rows=[{k: v for k, v in row.items() if k not in own} for row in batch.rows])


def attach_continuation(
    continuation_func: Any, kwargs: dict[str, Any], estimator: AdvantageEstimator, args: Any
) -> RolloutContinuation:
    """The trainer's agent checks with a ``continuation_func``: refuse one that would be ignored
    (:func:`check_continuation_func`), run :func:`~mcadvantage.trainer.checks.check_agent_kwargs` on the other agent
    arguments (with a ``continuation_func``, ``rollout_func`` episodes go through the single-turn Monte Carlo
    pipeline, where every ``mc_*`` setting works), and wrap ``kwargs["rollout_func"]`` in place to record its extra
    fields. ``args`` is the trainer's config (``max_completion_length``)."""
    from mcadvantage.trainer.checks import check_agent_kwargs

    check_continuation_func(continuation_func, kwargs, estimator)
    agent_kwargs = kwargs if continuation_func is None else {**kwargs, "rollout_func": None}
    check_agent_kwargs(agent_kwargs, estimator, args.max_completion_length)
    if continuation_func is None:
        return RolloutContinuation(None)
    fields = kwargs["rollout_func"] = RolloutFields(kwargs["rollout_func"])
    return RolloutContinuation(continuation_func, fields)
