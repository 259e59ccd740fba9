"""A toy tool-calling policy for :mod:`testbed.agent_env`: a tokenizer with a real tool-calling chat template, a tiny
model, and a scripted policy whose choice probabilities, hence exact values, are known.

- :func:`build_agent_tokenizer`: the character tokenizer of :mod:`mcadvantage.testing` plus the special tokens of
  Qwen3's chat template (``<|im_start|>``, ``<|im_end|>`` as EOS, ``<tool_call>`` ...), with TRL's own
  ``qwen3.jinja`` template and TRL's response template for it (``add_response_schema``), so TRL renders the tools
  into the prompt and parses the model's tool calls exactly as it does for Qwen3. With ``compact=True`` the fixed
  text of the template and of the tool call (the tools preamble, ``{"name": "act", "arguments": {"choice": `` ...)
  becomes one token per run: a prompt of ~40 tokens instead of ~600, and a turn of 6 tokens instead of 48, so a tiny
  model can learn the format and long episodes stay cheap on a CPU.
- :func:`build_agent_model`: a tiny random Llama for that tokenizer (EOS ``<|im_end|>``, room for long episodes).
- :class:`ScriptedAgentSampler`: a :class:`~mcadvantage.samplers.Sampler` that plays one assistant turn per
  request: it reads the episode's progress from the prefix (:func:`testbed.agent_env.read_progress`), draws a choice
  from a :class:`~testbed.agent_env.TurnPolicy` and writes the tool call as the template does (or ``done`` after the
  last turn, or when the policy stops). Its values are exactly :func:`testbed.agent_env.exact_values` of that policy,
  so Monte Carlo turn values computed through it can be checked for bias.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any

from mcadvantage.samplers.base import Continuation, RolloutRequest
from mcadvantage.testing import build_char_tokenizer, build_tiny_llama
from testbed.agent_env import AgentEnv, TurnPolicy, read_progress

__all__ = [
    "FINAL_TEXT",
    "SPECIAL_TOKENS",
    "TOOL_NAME",
    "ScriptedAgentSampler",
    "build_agent_model",
    "build_agent_tokenizer",
    "tool_call_text",
]

#: The special tokens Qwen3's chat template writes (``<|im_end|>`` ends a turn: it is the EOS).
SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
#: The environment's one tool.
TOOL_NAME = "act"
#: What the scripted policy answers when the episode is over (or it stops): plain text, no tool call.
FINAL_TEXT = "done"
# A value no rendering contains otherwise, to find where a tool call's argument sits in the template's text.
_ARGUMENT_SENTINEL = 987654321
_USER_SENTINEL, _TOOL_SENTINEL = "\x01", "\x02"


def tool_call_text(choice: int) -> str:
    """The text of one ``act(choice)`` tool call, as Qwen3's template renders an assistant tool call (JSON with
    ``", "`` and ``": "`` separators between ``<tool_call>\\n`` and ``\\n</tool_call>``)."""
    return (
        "<tool_call>\n" + json.dumps({"name": TOOL_NAME, "arguments": {"choice": choice}}) + "\n</tool_call>"
    )


def _template_phrases(tokenizer: Any) -> list[str]:
    """The fixed text runs of a rendered tool conversation: what lies between special tokens, the user's and the
    tool's content and the call's argument value. Each becomes one token with ``compact=True``."""
    messages = [
        {"role": "user", "content": _USER_SENTINEL},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": {"choice": _ARGUMENT_SENTINEL}},
                }
            ],
        },
        {"role": "tool", "name": TOOL_NAME, "content": _TOOL_SENTINEL},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=[AgentEnv().act], tokenize=False, add_generation_prompt=True
    )
    cuts = [*SPECIAL_TOKENS, _USER_SENTINEL, _TOOL_SENTINEL, str(_ARGUMENT_SENTINEL)]
    pieces = re.split("|".join(re.escape(c) for c in cuts), text)
    # One character is a token already; dict.fromkeys keeps the order and drops repeats.
    return [piece for piece in dict.fromkeys(pieces) if len(piece) > 1]


def build_agent_tokenizer(*, compact: bool = True) -> Any:
    """A character tokenizer that speaks Qwen3's tool-calling chat template, built offline.

    The vocabulary is :func:`mcadvantage.testing.build_char_tokenizer`'s (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
    ``<unk>`` 3, printable ASCII) plus :data:`SPECIAL_TOKENS`; EOS is ``<|im_end|>`` (where TRL's tool loop and
    generation stop a turn). The chat template is TRL's ``qwen3.jinja`` verbatim, so ``add_response_schema``
    recognises it and ``parse_response`` reads tool calls with TRL's Qwen3 response template; TRL itself swaps in
    its prefix-preserving training variant for multi-turn training, as for a real Qwen3.

    Args:
        compact: add the fixed text runs of the template and of an ``act`` call (:func:`_template_phrases`) as
            tokens of their own, so prompts and turns are short; the text and what TRL parses are unchanged.
    """
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    tokenizer = build_char_tokenizer(chat_template=False)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen3_chat_template
    if compact:
        from tokenizers import AddedToken

        tokenizer.add_tokens(
            [AddedToken(p, normalized=False, special=False) for p in _template_phrases(tokenizer)]
        )
    return add_response_schema(tokenizer)


def build_agent_model(tokenizer: Any, *, max_position_embeddings: int = 4096, **kwargs: Any) -> Any:
    """A tiny random Llama (:func:`mcadvantage.testing.build_tiny_llama`) for ``tokenizer``: its EOS is the
    tokenizer's (``<|im_end|>``), and ``max_position_embeddings`` leaves room for a whole long episode (TRL's tool
    loop stops an episode that would reach it)."""
    return build_tiny_llama(tokenizer, max_position_embeddings=max_position_embeddings, **kwargs)


class ScriptedAgentSampler:
    """A tool-calling policy with known choice probabilities, behind the :class:`~mcadvantage.samplers.Sampler`
    protocol: each request's continuation is one assistant turn.

    From a prefix (the rendered prompt with the environment's observation, and the turns so far with their tool
    results, as TRL's tool loop builds it), it reads the episode's progress, and while turns remain draws a choice
    from ``policy.action_probs`` and writes :func:`tool_call_text` of it; the remaining probability mass, or an
    episode already over, gives :data:`FINAL_TEXT`. Every turn ends with EOS. So the policy over whole episodes is
    exactly ``policy``, and :func:`testbed.agent_env.exact_values` gives its true state values.

    Args:
        policy: the choice probabilities per observation (e.g. :class:`testbed.agent_env.KeyPolicy`).
        tokenizer: :func:`build_agent_tokenizer`'s (any tokenizer that decodes the prefix to its text and encodes
            the turn's text).
        seed: seed of the private ``random.Random``; every draw is fresh, so continuations are independent.
    """

    def __init__(self, policy: TurnPolicy, tokenizer: Any, *, seed: int = 0) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)
        self.calls: list[list[RolloutRequest]] = []
        self._turn_ids: dict[int | None, tuple[int, ...]] = {}

    def turn_ids(self, choice: int | None) -> tuple[int, ...]:
        """The token ids of one turn: ``act(choice)``'s tool call, or :data:`FINAL_TEXT` for ``None``; then EOS."""
        if choice not in self._turn_ids:
            text = FINAL_TEXT if choice is None else tool_call_text(choice)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._turn_ids[choice] = (*ids, self.tokenizer.eos_token_id)
        return self._turn_ids[choice]

    def decide(self, prefix_ids: Sequence[int]) -> int | None:
        """Draw this turn's choice for the episode in ``prefix_ids`` (None: answer :data:`FINAL_TEXT`)."""
        view = read_progress(self.tokenizer.decode(list(prefix_ids), skip_special_tokens=False))
        if view.turn >= view.horizon:
            return None
        probs = self.policy.action_probs(view)
        draw, acc = self.rng.random(), 0.0
        for choice, p in enumerate(probs):
            acc += p
            if draw < acc:
                return choice
        return None  # the remaining mass: stop early

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``n`` independent one-turn continuations per request, each cut at the request's ``max_tokens``."""
        self.calls.append(list(requests))
        out = []
        for request in requests:
            conts = []
            for _ in range(request.n):
                ids = self.turn_ids(self.decide(request.prefix_ids))
                conts.append(
                    Continuation(token_ids=ids[: request.max_tokens], truncated=len(ids) > request.max_tokens)
                )
            out.append(conts)
        return out

    def generate(self, prompt_ids: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        """One turn per prompt, as plain lists (the shape of a generation engine's output): a stand-in for a model's
        generation in a TRL run, e.g. behind ``GRPOTrainer._generate_single_turn``."""
        requests = [RolloutRequest(prefix_ids=tuple(ids), n=1, max_tokens=max_tokens) for ids in prompt_ids]
        return [list(conts[0].token_ids) for conts in self.sample(requests)]
