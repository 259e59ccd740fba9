"""The public fakes for tests, examples and the CPU demo, as ``torch.testing`` has: tiny offline models and tokenizers,
and toy samplers whose true values (:class:`FakeSampler`, :class:`StepTreeSampler`) or true policy gradient
(:class:`TabularStepPolicy`) are known exactly. (The exact toy gradient *task* built on them, with the gradient
instrument, is the repository's research testbed's: ``testbed/toys.py``.)

Nothing here downloads anything: the tokenizer is a character-level ``tokenizers`` model (a BPE with
no merges, so every character is one token) wrapped in ``PreTrainedTokenizerFast``, and the model is
a randomly initialised Llama. They are small enough to train on a laptop CPU and large enough for
vLLM's CPU attention kernel (head_dim 64 by default: head_dim 16 is rejected there).
"""

from __future__ import annotations

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


def build_tool_calling_tokenizer(
    alphabet: str = DEFAULT_ALPHABET,
    *,
    special_tokens: Sequence[str] = (IM_START, IM_END),
    phrases: Callable[[Any], Sequence[str]] | None = None,
) -> Any:
    """The character tokenizer with a real tool-calling chat template: TRL's ``qwen3.jinja`` (shipped in
    ``trl/chat_templates/``), ``special_tokens`` as single special tokens (``<|im_end|>`` must be one of them: it
    ends a turn and is EOS), and TRL's response parser for that template (``add_response_schema``), so
    ``GRPOTrainer`` can parse tool calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) from
    generated token ids. Offline.

    Prompts rendered with tools carry Qwen's tool instructions and the tools' JSON schemas (several hundred
    characters, one token each): give the model a context of 1024 or more (``build_tiny_llama(tokenizer,
    max_position_embeddings=1024)``), or pass ``phrases``.

    Args:
        alphabet: the characters of the vocabulary (after the four specials).
        special_tokens: added as special tokens, in this order.
        phrases: called with the tokenizer once its template is set; each text it returns becomes one ordinary
            token (e.g. the template's fixed runs), so rendered prompts are short. The text is unchanged.
    """
    from importlib.resources import files

    from trl.chat_template_utils import add_response_schema

    if IM_END not in special_tokens:
        raise ValueError(
            f"special_tokens={list(special_tokens)!r} lacks {IM_END!r}, the EOS of Qwen's template; add it"
        )
    tokenizer = build_char_tokenizer(alphabet, chat_template=False)
    tokenizer.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    tokenizer.eos_token = IM_END
    tokenizer.chat_template = (files("trl") / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")
    if phrases is not None:
        from tokenizers import AddedToken

        tokenizer.add_tokens([AddedToken(p, normalized=False, special=False) for p in phrases(tokenizer)])
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
