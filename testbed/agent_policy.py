"""A toy tool-calling policy for :mod:`testbed.agent_env`: a tokenizer with a real tool-calling chat template, a tiny
model, and a scripted policy whose choice probabilities, hence exact values, are known.

- :func:`build_agent_tokenizer`: the character tokenizer of :mod:`mcadvantage.testing` plus the special tokens of
  Qwen3's chat template (``<|im_start|>``, ``<|im_end|>`` as EOS, ``<tool_call>`` ...), with TRL's own
  ``qwen3.jinja`` template and TRL's response template for it (``add_response_schema``), so TRL renders the tools
  into the prompt and parses the model's tool calls exactly as it does for Qwen3. With ``compact=True`` the fixed
  text of the template and of the tool call (the tools preamble, ``{"name": "act", "arguments": {"choice": `` ...)
  becomes one token per run: a first prompt of ~100 tokens instead of ~750, and a turn of 6 tokens instead of 48, so
  a tiny model can learn the format and long episodes stay cheap on a CPU.
- :func:`build_agent_model`: a tiny random Llama for that tokenizer (EOS ``<|im_end|>``, room for long episodes).
- :func:`scripted_episode_ids`: one whole scripted episode as token ids, rendered with TRL's training chat template, and the
  mask of the model's own turns (the supervised warm-ups' demonstrations).
- :class:`ScriptedAgentSampler`: a :class:`~mcadvantage.samplers.Sampler` that plays the rest of one assistant turn
  per request: it reads the episode's progress from the prefix (:func:`testbed.agent_env.read_progress`), draws a
  choice from a :class:`~testbed.agent_env.TurnPolicy` and writes the tool call as the template does (or ``done``
  after the last turn, or when the policy stops). A prefix may end inside a turn (a step boundary in the model's own
  text): the draw is then conditioned on the part already written. Its values are exactly
  :func:`testbed.agent_env.exact_values` of that policy, and :meth:`ScriptedAgentSampler.exact_value` gives the exact
  value of any token prefix, so Monte Carlo values computed through it can be checked for bias.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any

from mcadvantage.samplers.base import Continuation, RolloutRequest
from mcadvantage.testing import build_tiny_llama, build_tool_calling_tokenizer
from testbed.agent_env import GOOD, AgentEnv, AgentTask, Progress, TurnPolicy, exact_values, read_progress

__all__ = [
    "FINAL_TEXT",
    "SPECIAL_TOKENS",
    "TOOL_NAME",
    "ScriptedAgentSampler",
    "build_agent_model",
    "build_agent_tokenizer",
    "scripted_episode_ids",
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
    """A character tokenizer that speaks Qwen3's tool-calling chat template, built offline: the library's
    :func:`mcadvantage.testing.build_tool_calling_tokenizer` with every special token of the template.

    The vocabulary is :func:`mcadvantage.testing.build_char_tokenizer`'s (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2,
    ``<unk>`` 3, printable ASCII) plus :data:`SPECIAL_TOKENS`; EOS is ``<|im_end|>`` (where TRL's tool loop and
    generation stop a turn). The chat template is TRL's ``qwen3.jinja`` verbatim, so ``add_response_schema``
    recognises it and ``parse_response`` reads tool calls with TRL's Qwen3 response template; TRL itself swaps in
    its prefix-preserving training variant for multi-turn training, as for a real Qwen3.

    Args:
        compact: add the fixed text runs of the template and of an ``act`` call (:func:`_template_phrases`) as
            tokens of their own, so prompts and turns are short; the text and what TRL parses are unchanged.
    """
    return build_tool_calling_tokenizer(
        special_tokens=SPECIAL_TOKENS, phrases=_template_phrases if compact else None
    )


def build_agent_model(tokenizer: Any, *, max_position_embeddings: int = 4096, **kwargs: Any) -> Any:
    """A tiny random Llama (:func:`mcadvantage.testing.build_tiny_llama`) for ``tokenizer``: its EOS is the
    tokenizer's (``<|im_end|>``), and ``max_position_embeddings`` leaves room for a whole long episode (TRL's tool
    loop stops an episode that would reach it)."""
    return build_tiny_llama(tokenizer, max_position_embeddings=max_position_embeddings, **kwargs)


class ScriptedAgentSampler:
    """A tool-calling policy with known choice probabilities, behind the :class:`~mcadvantage.samplers.Sampler`
    protocol: each request's continuation is the rest of one assistant turn.

    From a prefix (the rendered prompt with the environment's observation, and the turns so far with their tool
    results, as TRL's tool loop builds it), it reads the episode's progress, and while turns remain draws a choice
    from ``policy.action_probs`` and writes :func:`tool_call_text` of it; the remaining probability mass, or an
    episode already over, gives :data:`FINAL_TEXT`. Every turn ends with EOS. A prefix that ends inside a turn gets
    the rest of a turn drawn from those consistent with what it holds (:meth:`turn_distribution`). So the policy
    over whole episodes is exactly ``policy``: :func:`testbed.agent_env.exact_values` gives its true values at turn
    boundaries and :meth:`exact_value` at any token prefix.

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
        # Decoding a prefix dominates a draw, and Monte Carlo continuations of one state share their prefixes:
        # where a prefix stands is computed once (a pure function of the ids, for a fixed tokenizer).
        self._opened: dict[tuple[int, ...], tuple[Progress, tuple[int, ...]]] = {}

    def turn_ids(self, choice: int | None) -> tuple[int, ...]:
        """The token ids of one turn: ``act(choice)``'s tool call, or :data:`FINAL_TEXT` for ``None``; then EOS."""
        if choice not in self._turn_ids:
            text = FINAL_TEXT if choice is None else tool_call_text(choice)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._turn_ids[choice] = (*ids, self.tokenizer.eos_token_id)
        return self._turn_ids[choice]

    def _open_turn(self, prefix_ids: Sequence[int]) -> tuple[Progress, list[int]]:
        """Where ``prefix_ids`` stands: the episode's progress (from its text) and the ids of the assistant turn it
        ends in, so far (empty right after the assistant header, or after an empty think block that a template
        adds there).

        Raises:
            ValueError: when the prefix does not end inside an assistant turn (e.g. it ends in a tool result with
                no generation prompt), or is not an episode of the environment.
        """
        key = tuple(prefix_ids)
        if key not in self._opened:
            self._opened[key] = self._read_open_turn(key)
        view, partial = self._opened[key]
        return view, list(partial)

    def _read_open_turn(self, prefix_ids: tuple[int, ...]) -> tuple[Progress, tuple[int, ...]]:
        ids = list(prefix_ids)
        view = read_progress(self.tokenizer.decode(ids, skip_special_tokens=False))
        start_id = self.tokenizer.convert_tokens_to_ids("<|im_start|>")
        header = self.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        starts = [i for i, tok in enumerate(ids) if tok == start_id]
        if not starts or ids[starts[-1] : starts[-1] + len(header)] != header:
            raise ValueError(
                "the prefix does not end inside an assistant turn (no '<|im_start|>assistant\\n' after the last "
                f"message): {self.tokenizer.decode(ids[-40:], skip_special_tokens=False)!r}; a continuation starts "
                "after the generation prompt or inside the model's own turn."
            )
        partial = ids[starts[-1] + len(header) :]
        think = self.tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
        if partial[: len(think)] == think:
            partial = partial[len(think) :]
        return view, tuple(partial)

    def turn_distribution(
        self, prefix_ids: Sequence[int]
    ) -> tuple[Progress, list[int], dict[int | None, float]]:
        """The policy's distribution over whole turns, given the part of the turn already in ``prefix_ids``: ``(view,
        partial turn ids, {choice or None: probability})``, the turns consistent with the partial ids, renormalised
        (None is :data:`FINAL_TEXT`: stopping, or the answer after the last turn).

        Raises:
            ValueError: when no turn of this policy starts with the partial ids (the prefix is not its text).
        """
        view, partial = self._open_turn(prefix_ids)
        if view.turn >= view.horizon:
            weights: dict[int | None, float] = {None: 1.0}
        else:
            probs = [float(p) for p in self.policy.action_probs(view)]
            weights = {choice: p for choice, p in enumerate(probs) if p > 0}
            if 1.0 - sum(probs) > 1e-12:
                weights[None] = 1.0 - sum(probs)
        consistent = {c: w for c, w in weights.items() if list(self.turn_ids(c)[: len(partial)]) == partial}
        total = sum(consistent.values())
        if not consistent or len(partial) >= max(len(self.turn_ids(c)) for c in consistent):
            raise ValueError(
                f"no turn of the scripted policy continues the partial turn "
                f"{self.tokenizer.decode(partial, skip_special_tokens=False)!r} (a complete turn is not continued: "
                "its tool call runs first)."
            )
        return view, partial, {c: w / total for c, w in consistent.items()}

    def decide(self, prefix_ids: Sequence[int]) -> int | None:
        """Draw this turn's choice for the episode in ``prefix_ids`` (None: answer :data:`FINAL_TEXT`), given the
        part of the turn the prefix already holds."""
        return self._draw(self.turn_distribution(prefix_ids)[2])

    def _draw(self, dist: dict[int | None, float]) -> int | None:
        draw, acc = self.rng.random(), 0.0
        for choice, p in dist.items():
            acc += p
            if draw < acc:
                return choice
        return next(reversed(dist))  # rounding left the draw above the last cumulative sum

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``n`` independent continuations per request, each the rest of the current turn (a whole turn from the
        assistant header), with EOS, cut at the request's ``max_tokens``."""
        self.calls.append(list(requests))
        out = []
        for request in requests:
            _, partial, dist = self.turn_distribution(request.prefix_ids)
            conts = []
            for _ in range(request.n):
                ids = self.turn_ids(self._draw(dist))[len(partial) :]
                conts.append(
                    Continuation(token_ids=ids[: request.max_tokens], truncated=len(ids) > request.max_tokens)
                )
            out.append(conts)
        return out

    def exact_value(self, task: AgentTask, prefix_ids: Sequence[int]) -> float:
        """The exact success probability of an episode from the token prefix ``prefix_ids`` under this policy (with
        ``task`` the episode's row, whose hidden parameters the values need): at a turn boundary ``V_t(s)``; inside
        a turn, the average of the consistent turns' ``Q`` values; after a complete turn whose tool call has not run
        yet, that call's ``Q``; after the final answer, the reward. What Monte Carlo values at these states must
        average to."""
        ids = list(prefix_ids)
        values = exact_values(task, self.policy)
        view, partial = self._open_turn(ids)
        if (view.key, view.choices, view.horizon) != (task.key, task.choices, task.horizon):
            raise ValueError(f"the prefix is an episode of another task ({view}), not of {task}.")

        def q(choice: int | None) -> float:
            if choice is None:  # the final answer: the reward, 0 when it stopped before the last turn
                return 1.0 if view.turn >= task.horizon and view.state == GOOD else 0.0
            return values[view.turn + 1][task.transition(view.turn, view.state, choice)]

        complete = [c for c in ({None} | set(range(task.choices))) if list(self.turn_ids(c)) == partial]
        if complete:
            return q(complete[0])
        _, _, dist = self.turn_distribution(ids)
        return sum(p * q(c) for c, p in dist.items())

    def generate(self, prompt_ids: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        """One turn per prompt, as plain lists (the shape of a generation engine's output): a stand-in for a model's
        generation in a TRL run, e.g. behind ``GRPOTrainer._generate_single_turn``."""
        requests = [RolloutRequest(prefix_ids=tuple(ids), n=1, max_tokens=max_tokens) for ids in prompt_ids]
        return [list(conts[0].token_ids) for conts in self.sample(requests)]


def fit_model_turns(
    model: Any,
    episodes: Sequence[tuple[list[int], list[int]]],
    pad_token_id: int,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    rng: random.Random,
    progress: bool = False,
) -> list[float]:
    """``steps`` supervised steps (AdamW, constant rate) on ``(token ids, model mask)`` episodes drawn with
    replacement by ``rng``, the loss on the masked (model's own) tokens only. Leaves the model in train mode and
    returns every step's loss. The one warm-up loop of the agent example, the LM map's warm-up and the turn-credit
    benchmark."""
    import torch
    from tqdm.auto import tqdm

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="lm warm-up (SFT)", unit="step", disable=not progress):
        batch = [episodes[rng.randrange(len(episodes))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad_token_id] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([[t if m else -100 for t, m in zip(i, k, strict=True)] + [-100] * (width - len(i))
                               for i, k in batch])  # fmt: skip
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def scripted_episode_ids(
    tokenizer: Any, row: dict[str, Any], choices: Sequence[int], chat_template_kwargs: dict[str, Any]
) -> tuple[list[int], list[int]]:
    """One whole episode as token ids, rendered with TRL's training chat template (prefix-preserving, so its turns
    are the tokens TRL's tool loop joins), and a mask that is 1 on the model's own turns (to the end-of-turn token)
    and 0 on the prompt and the tool results."""
    from trl.chat_template_utils import get_training_chat_template

    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    env = AgentEnv()
    observation = env.reset(**row)
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["prompt"][0]["content"] + observation}]

    def render(msgs: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        return tokenizer.apply_chat_template(
            msgs,
            tools=[env.act],
            chat_template=template,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            return_dict=False,
            **chat_template_kwargs,
        )

    turns: list[dict[str, Any]] = []
    for choice in choices:
        call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"choice": int(choice)}}}
        turns.append({"role": "assistant", "content": "", "tool_calls": [call]})
        turns.append({"role": "tool", "name": TOOL_NAME, "content": env.act(int(choice))})
    turns.append({"role": "assistant", "content": FINAL_TEXT})
    ids = render(messages + turns, False)
    mask = [0] * len(ids)
    for k, message in enumerate(turns):
        if message["role"] != "assistant":
            continue
        start = len(render(messages + turns[:k], True))
        end = start + ids[start:].index(tokenizer.eos_token_id) + 1  # the turn, through its end-of-turn token
        mask[start:end] = [1] * (end - start)
    return ids, mask
