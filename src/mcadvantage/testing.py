"""Public fakes for tests, examples and the CPU demo, as ``torch.testing`` has: tiny offline models and tokenizers,
and toy samplers whose true values (:class:`FakeSampler`, :class:`StepTreeSampler`) or true policy gradient
(:class:`TabularStepPolicy`) are known exactly. (The exact toy gradient *task* built on them, with the gradient
instrument, is the repository's research testbed's: ``testbed/toys.py``.)

Why this module is long: it is the one import path of the public test helpers, as ``torch.testing`` is: the fakes
above and :func:`check_advantage_estimator`, the contract check users run in their own test suites, whose rules are
written out one by one so a failure names the rule it broke.

Nothing here downloads anything: the tokenizer is a character-level ``tokenizers`` model (a BPE with
no merges, so every character is one token) wrapped in ``PreTrainedTokenizerFast``, and the model is
a randomly initialised Llama. They are small enough to train on a laptop CPU and large enough for
vLLM's CPU attention kernel (head_dim 64 by default: head_dim 16 is rejected there).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mcadvantage.samplers.base import Continuation, RolloutRequest

# Printable ASCII (letters, digits, punctuation, space) plus newline and tab: enough for GSM8K-style
# arithmetic, LaTeX answers and the demo's prompts.
DEFAULT_ALPHABET = string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", "")

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET, *, chat_template: bool = True) -> Any:
    """A character-level ``PreTrainedTokenizerFast``: one token per character, built offline.

    Special tokens: ``<pad>`` (0), ``<s>`` (1), ``</s>`` (2, EOS), ``<unk>`` (3). Characters outside
    ``alphabet`` map to ``<unk>``. With ``chat_template=True`` a minimal chat template is set so the
    tokenizer also serves conversational datasets.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
    chars = list(dict.fromkeys(alphabet))  # dedupe, keep order
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    # A BPE with no merges is a pure character vocabulary; Split on "" keeps every character
    # (including spaces and newlines) as its own token, and Fuse() concatenates them back on decode.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
    )
    if chat_template:
        tokenizer.chat_template = (
            "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}"
        )
    return tokenizer


#: The chat-turn markers of Qwen's chat templates, added to the character tokenizer as single tokens by
#: :func:`build_tool_calling_tokenizer` (``<|im_end|>`` ends a turn, so it is the EOS token).
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def build_tool_calling_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> Any:
    """The character tokenizer with a real tool-calling chat template: TRL's ``qwen3.jinja`` (shipped in
    ``trl/chat_templates/``), ``<|im_start|>`` / ``<|im_end|>`` as single special tokens (``<|im_end|>`` is EOS),
    and TRL's response parser for that template (``add_response_schema``), so ``GRPOTrainer`` can parse tool
    calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) from generated token ids. Offline.

    Prompts rendered with tools carry Qwen's tool instructions and the tools' JSON schemas (several hundred
    characters, one token each): give the model a context of 1024 or more (``build_tiny_llama(tokenizer,
    max_position_embeddings=1024)``).
    """
    from importlib.resources import files

    from trl.chat_template_utils import add_response_schema

    tokenizer = build_char_tokenizer(alphabet, chat_template=False)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.eos_token = IM_END
    tokenizer.chat_template = (files("trl") / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")
    return add_response_schema(tokenizer)


def build_tiny_llama(
    tokenizer: Any,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` sized for ``tokenizer`` (float32, CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def save_tiny_model(path: str | Path, **model_kwargs: Any) -> Path:
    """Build a character tokenizer and a tiny Llama and save both to ``path`` (a model directory
    that ``from_pretrained``, TRL trainers and ``vllm.LLM`` accept). Returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# --------------------------------------------------------------------------------------------------------------
# A toy policy with exactly known state values
# --------------------------------------------------------------------------------------------------------------
# A toy policy with exactly known state values, for testing estimators and training code.
#
# :class:`FakeSampler` implements the :class:`~mcadvantage.samplers.Sampler` protocol without a model:
# from a prefix, every continuation is ``num_filler_tokens`` filler tokens, then a success token with
# probability ``p(prefix)`` (a failure token otherwise), then EOS. Graded by :class:`OutcomeReward`
# (reward 1 when the response text ends with the success text), the true value of a state is exactly
# ``p(prefix)`` (when the budget fits the whole continuation), so Monte Carlo estimates can be checked
# against the truth: with ``K`` rollouts the estimate is ``Binomial(K, p) / K``, unbiased with
# variance ``p (1 - p) / K``.
#
# Every call records its requests in :attr:`FakeSampler.calls`, so tests can assert what an estimator
# asked for.


class FakeSampler:
    """Seeded toy sampler whose success probability is a known function of the prefix.

    Args:
        success_prob: ``p`` as a constant, or a function ``prefix_ids -> p`` (e.g. read a digit
            token encoded in the prefix).
        success_token_id: the token emitted on success.
        failure_token_id: the token emitted on failure.
        eos_token_id: appended after the outcome token (None: no EOS, continuations then end
            without one and are never marked truncated unless cut by the budget).
        filler_token_id: token emitted ``num_filler_tokens`` times before the outcome (to make
            continuations long enough to test budgets and truncation).
        num_filler_tokens: how many filler tokens precede the outcome.
        seed: seed of the private ``random.Random``; every continuation is a fresh draw from it,
            so continuations are independent and a sampler rebuilt with the same seed reproduces
            the same draws for the same calls.
    """

    def __init__(
        self,
        success_prob: float | Callable[[tuple[int, ...]], float],
        *,
        success_token_id: int,
        failure_token_id: int,
        eos_token_id: int | None = None,
        filler_token_id: int | None = None,
        num_filler_tokens: int = 0,
        seed: int = 0,
    ) -> None:
        if num_filler_tokens < 0:
            raise ValueError(f"num_filler_tokens={num_filler_tokens!r} must be >= 0.")
        if num_filler_tokens > 0 and filler_token_id is None:
            raise ValueError(
                f"num_filler_tokens={num_filler_tokens} needs a filler_token_id; pass the token to repeat."
            )
        self._prob = success_prob if callable(success_prob) else (lambda _prefix, p=float(success_prob): p)
        self.success_token_id = success_token_id
        self.failure_token_id = failure_token_id
        self.eos_token_id = eos_token_id
        self.filler_token_id = filler_token_id
        self.num_filler_tokens = num_filler_tokens
        self.rng = random.Random(seed)
        self.calls: list[list[RolloutRequest]] = []

    def success_prob(self, prefix_ids: Sequence[int]) -> float:
        """The true probability that a continuation of ``prefix_ids`` emits the success token."""
        p = float(self._prob(tuple(prefix_ids)))
        if not 0.0 <= p <= 1.0:
            raise ValueError(
                f"success_prob returned {p!r} for prefix {tuple(prefix_ids)!r}; it must be in [0, 1]."
            )
        return p

    @property
    def continuation_length(self) -> int:
        """Tokens in a full (untruncated) continuation."""
        return self.num_filler_tokens + 1 + (self.eos_token_id is not None)

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``n`` independent continuations per request, each cut at the request's ``max_tokens``."""
        self.calls.append(list(requests))
        out: list[list[Continuation]] = []
        for req in requests:
            p = self.success_prob(req.prefix_ids)
            conts = []
            for _ in range(req.n):
                outcome = self.success_token_id if self.rng.random() < p else self.failure_token_id
                tokens: list[Any] = [self.filler_token_id] * self.num_filler_tokens + [outcome]
                if self.eos_token_id is not None:
                    tokens.append(self.eos_token_id)
                cut = len(tokens) > req.max_tokens
                conts.append(Continuation(token_ids=tuple(tokens[: req.max_tokens]), truncated=cut))
            out.append(conts)
        return out


class OutcomeReward:
    """TRL-style reward function: 1.0 when the completion text ends with ``success_text``, else 0.0.

    Accepts standard (string) and conversational (``[{"role": "assistant", "content": ...}]``)
    completions and ignores every other keyword argument. ``calls`` records the keyword arguments
    of each call so tests can check what the reward function received.
    """

    def __init__(self, success_text: str, name: str = "outcome_reward") -> None:
        self.success_text = success_text
        self.__name__ = name
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), **kwargs: Any) -> list[float]:
        self.calls.append({"prompts": prompts, "completions": completions, **kwargs})
        rewards = []
        for c in completions:
            text = c[-1]["content"] if isinstance(c, list) else c
            rewards.append(1.0 if text.endswith(self.success_text) else 0.0)
        return rewards


class StepTreeSampler:
    """Seeded toy policy over multi-step responses, with exactly known state values: the toy for free samples.

    A response is ``depth`` step tokens, each drawn independently from ``step_token_ids`` with ``step_probs``,
    then a success token with probability ``success_prob(step indexes)`` (a failure token otherwise), then EOS.
    Cut into one step per step token (and the outcome with EOS as the last step), responses to one prompt share
    prefixes often, so the other responses of a group are real draws of a state's value, as are rollouts that pass
    through it. :meth:`value` enumerates every future exactly.

    The completion part of a prefix is read as its trailing step tokens, so prompts must not end with one.
    """

    def __init__(
        self,
        *,
        step_token_ids: Sequence[int],
        step_probs: Sequence[float],
        depth: int,
        success_prob: Callable[[tuple[int, ...]], float],
        success_token_id: int,
        failure_token_id: int,
        eos_token_id: int,
        seed: int = 0,
    ) -> None:
        if len(step_token_ids) != len(step_probs) or abs(sum(step_probs) - 1) > 1e-9:
            raise ValueError(
                f"step_probs={list(step_probs)!r} must give one probability per step token "
                f"({len(step_token_ids)}) and sum to 1."
            )
        if depth < 1:
            raise ValueError(f"depth={depth!r} must be >= 1.")
        self.step_token_ids = list(step_token_ids)
        self.step_probs = list(step_probs)
        self.depth = depth
        self._success = success_prob
        self.success_token_id = success_token_id
        self.failure_token_id = failure_token_id
        self.eos_token_id = eos_token_id
        self.rng = random.Random(seed)
        self.calls: list[list[RolloutRequest]] = []
        self._index = {tok: i for i, tok in enumerate(self.step_token_ids)}

    @property
    def response_length(self) -> int:
        """Tokens of a whole response: the steps, the outcome and EOS."""
        return self.depth + 2

    def steps_of(self, prefix_ids: Sequence[int]) -> tuple[int, ...]:
        """The step indexes already taken in ``prefix_ids`` (its trailing step tokens, at most ``depth``)."""
        taken: list[int] = []
        for tok in reversed(list(prefix_ids)):
            if tok not in self._index or len(taken) == self.depth:
                break
            taken.append(self._index[tok])
        return tuple(reversed(taken))

    def position_probs(self) -> list[list[float]]:
        """Per step position, the probabilities of the step tokens (the same at every position here)."""
        return [list(self.step_probs)] * self.depth

    def value(self, prefix_ids: Sequence[int]) -> float:
        """The exact probability of success from ``prefix_ids`` (a prompt plus some step tokens)."""
        probs = self.position_probs()
        taken = self.steps_of(prefix_ids)
        total = 0.0
        for future in itertools.product(range(len(self.step_token_ids)), repeat=self.depth - len(taken)):
            weight = math.prod(probs[len(taken) + d][i] for d, i in enumerate(future))
            total += weight * float(self._success(taken + future))
        return total

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``n`` independent continuations per request, each cut at the request's ``max_tokens``."""
        self.calls.append(list(requests))
        probs = self.position_probs()
        out: list[list[Continuation]] = []
        for req in requests:
            taken = self.steps_of(req.prefix_ids)
            conts = []
            for _ in range(req.n):
                future = tuple(
                    self.rng.choices(range(len(self.step_token_ids)), weights=probs[d])[0]
                    for d in range(len(taken), self.depth)
                )
                success = self.rng.random() < float(self._success(taken + future))
                tokens = [self.step_token_ids[i] for i in future]
                tokens += [self.success_token_id if success else self.failure_token_id, self.eos_token_id]
                cut = len(tokens) > req.max_tokens
                conts.append(Continuation(token_ids=tuple(tokens[: req.max_tokens]), truncated=cut))
            out.append(conts)
        return out


class TabularStepPolicy(StepTreeSampler):
    """A differentiable toy policy whose policy gradient is known in closed form: the exact toy of the gradient
    instrument (:mod:`mcadvantage.evaluation.gradient_quality`).

    A :class:`StepTreeSampler` whose step token at position ``d`` is drawn from ``softmax(logits[d])``: the
    parameters are the ``(depth, V)`` logits, so ``J = E[success]`` is a finite sum over ``V ** depth`` step
    sequences and :meth:`exact_gradient` is its exact gradient (autograd through the enumeration). The outcome and
    EOS tokens are the environment's. It samples from any prefix with the current logits (a
    :class:`~mcadvantage.samplers.Sampler`, as Monte Carlo rollouts need) and is a policy-gradient oracle
    (:meth:`token_logprobs`, :meth:`parameters`), so every estimator runs on it unchanged.
    """

    def __init__(
        self,
        *,
        step_token_ids: Sequence[int],
        depth: int,
        success_prob: Callable[[tuple[int, ...]], float],
        success_token_id: int,
        failure_token_id: int,
        eos_token_id: int,
        logits: Any = None,
        seed: int = 0,
    ) -> None:
        import torch

        if len(step_token_ids) < 2:
            raise ValueError("TabularStepPolicy: step_token_ids must hold >= 2 tokens.")
        super().__init__(
            step_token_ids=step_token_ids,
            step_probs=[1.0 / len(step_token_ids)] * len(step_token_ids),
            depth=depth,
            success_prob=success_prob,
            success_token_id=success_token_id,
            failure_token_id=failure_token_id,
            eos_token_id=eos_token_id,
            seed=seed,
        )
        shape = (depth, len(self.step_token_ids))
        init = torch.zeros(shape) if logits is None else torch.as_tensor(logits, dtype=torch.float64)
        if tuple(init.shape) != shape:
            raise ValueError(f"logits must have shape {shape} (depth, step tokens), got {tuple(init.shape)}.")
        self.logits = init.to(torch.float64).clone().requires_grad_(True)

    def parameters(self) -> list[Any]:
        return [self.logits]

    def position_probs(self) -> list[list[float]]:
        import torch

        with torch.no_grad():
            return torch.softmax(self.logits, dim=-1).tolist()

    def exact_objective(self) -> Any:
        """``J(logits) = E[success]``, differentiable."""
        import torch

        log_probs = torch.log_softmax(self.logits, dim=-1)
        total = torch.zeros((), dtype=torch.float64)
        for steps in itertools.product(range(len(self.step_token_ids)), repeat=self.depth):
            log_p = sum(log_probs[d, i] for d, i in enumerate(steps))
            total = total + torch.exp(log_p) * float(self._success(steps))
        return total

    def exact_gradient(self) -> Any:
        """``dJ / d logits``, flattened: the true policy gradient."""
        import torch

        (grad,) = torch.autograd.grad(self.exact_objective(), [self.logits])
        return grad.reshape(-1).to(torch.float32)

    def token_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> Any:
        """``(B, T)`` log-probabilities of the completion tokens under the current logits (differentiable). The
        outcome and EOS tokens are the environment's: they carry log-probability 0 and no gradient."""
        import torch

        log_probs = torch.log_softmax(self.logits, dim=-1)
        width = max((len(c) for c in completion_ids), default=0)
        rows = []
        for ids in completion_ids:
            row = [torch.zeros((), dtype=torch.float64)] * width
            for d, tok in enumerate(list(ids)[: self.depth]):
                if tok in self._index:
                    row[d] = log_probs[d, self._index[tok]]
            rows.append(torch.stack(row) if row else torch.zeros(0, dtype=torch.float64))
        return torch.stack(rows) if rows else torch.zeros((0, width), dtype=torch.float64)


# --------------------------------------------------------------------------------------------------------------
# The estimator contract, as a check a user runs in their own test suite
# --------------------------------------------------------------------------------------------------------------

#: The rules :func:`check_advantage_estimator` checks, in the order it checks them (an
#: :class:`EstimatorContractError` names the one broken).
CONTRACT_RULES = (
    "declares the contract",
    "(B, T) float advantages",
    "finite on the token mask",
    "zero on padding",
    "float metrics under its prefix",
    "a short training step",
    "state_dict round trip through a checkpoint",
)


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
    """

    estimator: str
    batches: int
    padding_tokens: int
    logged_metrics: tuple[str, ...]
    state_keys: tuple[str, ...]


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

    Args:
        estimator: a registered name, an estimator class, or an instance (used as the trainer's
            ``advantage_estimator=``; a class or a name is built with ``from_config``).
        workdir: where the tiny model, the run and the checkpoint go; a temporary directory when None.
        config_overrides: ``VinePPOConfig`` fields over the tiny run's (e.g. your estimator's own settings).
        reward_func: the reward function of the run (default: the share of vowels, which varies on random text).

    Returns:
        An :class:`EstimatorCheckReport`.

    Raises:
        EstimatorContractError: naming the broken rule and what was found.
    """
    import tempfile

    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="mcadvantage-estimator-check-") as tmp:
            return check_advantage_estimator(
                estimator, workdir=tmp, config_overrides=config_overrides, reward_func=reward_func
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
    prefix = used.metric_prefix
    for name in results[-1][1].metrics:
        if f"{prefix}/{name}" not in logged:
            raise EstimatorContractError(
                label, "float metrics under its prefix", f"metric {name!r} was not logged as {prefix}/{name}."
            )
    _check_training(label, trainer)
    state_keys = _check_state_round_trip(label, used, trainer.args, workdir / "checkpoint")
    return EstimatorCheckReport(
        estimator=label,
        batches=len(results),
        padding_tokens=padding,
        logged_metrics=tuple(sorted(k for k in logged if k.startswith(f"{prefix}/"))),
        state_keys=state_keys,
    )


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
