"""What a verifier is, the TRL reward-function plumbing the verifiers share, and how to get one by name.

A verifier grades a model response against a gold answer and returns a reward in ``[0, 1]``. The two built-in
verifiers live with their tasks:

* :class:`~mcadvantage.tasks.gsm8k.GSM8KVerifier` reads the number after the last ``####`` and compares it
  exactly (``fractions.Fraction``) with the gold number; pure regular expressions, no worker process.
* :class:`~mcadvantage.tasks.math.MathVerifier` reads the last brace-matched ``\\boxed{...}`` (or
  ``\\fbox{...}``) and decides mathematical equivalence with
  `math-verify <https://github.com/huggingface/Math-Verify>`_ (sympy based), in a grading process
  (:mod:`mcadvantage.tasks.grading`).

Instances are TRL reward functions::

    verifier(prompts=..., completions=..., completion_ids=..., **dataset_columns) -> list[float]

for standard (string) and conversational (message list) completions; the gold answers come from the
dataset column named by ``answer_field``. Grading never raises: a missing, truncated or unparseable
answer scores 0.0. A missing gold *column* does raise, because that is a configuration bug.

Layering: this module is below the task modules (:mod:`~mcadvantage.tasks.gsm8k`,
:mod:`~mcadvantage.tasks.math`) and imports none of them; each adds its verifier to the registry behind
:func:`get_verifier` when it is imported (``mcadvantage.tasks`` imports them all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Verifier", "get_verifier", "completion_text"]

# Keyword arguments TRL passes to every reward function besides the dataset columns.
_TRL_EXTRA_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric"})


@runtime_checkable
class Verifier(Protocol):
    """A grader of final answers that is also a TRL reward function.

    ``score(response, gold)`` returns a reward in ``[0, 1]`` and never raises on bad model output.
    Calling the instance TRL-style grades a batch of completions against the gold column.
    """

    __name__: str

    def score(self, response: str, gold: str) -> float:
        """Reward in ``[0, 1]`` of one response against one gold answer; never raises on bad output."""
        ...

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]: ...


# --------------------------------------------------------------------------------------------
# Completions and gold columns (shared by both verifiers)
# --------------------------------------------------------------------------------------------


def _message_content(message: Any) -> str | None:
    content = message.get("content") if isinstance(message, dict) else None
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts)
    return None


def completion_text(completion: Any) -> str | None:
    """The text to grade from one TRL completion.

    Accepts a plain string (standard format), or a conversational completion: a list of
    ``{"role": ..., "content": ...}`` messages, of which the last assistant message is used (a single
    message dict is accepted too). Returns ``None`` when there is nothing to grade (``None``, or no
    assistant message), which scores 0.0.
    """
    if completion is None or isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _message_content(completion)
    if isinstance(completion, (list, tuple)):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                return _message_content(message)
        return None
    raise TypeError(
        f"completions must hold strings or lists of chat messages, got {type(completion).__name__}: "
        f"{completion!r:.100}. Pass the completions TRL gives reward functions."
    )


def _gold_column(
    kwargs: dict[str, Any], field: str, n: int, alternatives: Sequence[str] = ()
) -> tuple[str, list[Any]]:
    """Return ``(column name, values)`` for the first present of ``field`` and ``alternatives``."""
    for name in (field, *alternatives):
        if name in kwargs and kwargs[name] is not None:
            values = list(kwargs[name])
            if len(values) != n:
                raise ValueError(
                    f"gold column {name!r} has {len(values)} values for {n} completions; every "
                    "completion needs its own gold answer (TRL repeats dataset columns per generation)."
                )
            return name, values
    present = sorted(k for k in kwargs if k not in _TRL_EXTRA_KWARGS)
    wanted = " or ".join(repr(c) for c in (field, *alternatives))
    raise ValueError(
        f"no gold answer column {wanted} among the dataset columns passed to the reward function "
        f"(present: {present}). Add the column to the dataset or set answer_field= to the column "
        "that holds the gold answer."
    )


class _VerifierBase:
    """TRL reward-function plumbing shared by the verifiers."""

    __name__ = "verifier"
    answer_field: str

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """Grade a batch TRL-style; ``kwargs`` are the dataset columns (plus ignored TRL extras)."""
        if completions is None:
            raise ValueError(f"{self.__name__} needs completions=...; TRL passes them as a keyword argument.")
        texts = [completion_text(c) for c in completions]
        golds = self._golds(kwargs, len(texts))
        return self.score_batch(texts, golds)

    def _golds(self, kwargs: dict[str, Any], n: int) -> list[Any]:
        return _gold_column(kwargs, self.answer_field, n)[1]

    def score(self, response: str | None, gold: Any) -> float:
        """Reward in ``[0, 1]`` of one response against one gold answer; never raises on bad output."""
        return self.score_batch([response], [gold])[0]

    def score_batch(self, responses: Sequence[str | None], golds: Sequence[Any]) -> list[float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(answer_field={self.answer_field!r})"


# Longest number either verifier parses (GSM8K answers, MATH plain numbers). Python refuses to convert int
# strings longer than 4300 digits; no real answer is that long.
_MAX_NUMBER_CHARS = 1000


# --------------------------------------------------------------------------------------------

#: Verifier name -> class: ``"gsm8k"`` and ``"math"``. Each task module adds its own when imported
#: (``mcadvantage.tasks`` imports them all).
_VERIFIERS: dict[str, Callable[..., _VerifierBase]] = {}


def get_verifier(name: str, **kwargs: Any) -> Verifier:
    """A verifier by task name: ``"gsm8k"`` or ``"math"``; ``kwargs`` go to its constructor."""
    key = name.lower().strip() if isinstance(name, str) else name
    if key not in _VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; choose one of {sorted(_VERIFIERS)}.")
    return _VERIFIERS[key](**kwargs)  # type: ignore[return-value]
