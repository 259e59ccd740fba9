"""The agent credit toy: the testbed environment played by a tabular softmax policy, so that values, per-turn
advantages and the policy gradient are exact, and the library's real estimators are driven through their seam.

An episode of :class:`~testbed.agent_env.AgentTask` (``delayed`` or ``recovery``, horizon ``H``, sparse final reward)
is a token sequence in the character tokenizer of :mod:`mcadvantage.testing`::

    prompt "P07:"  |  completion  c_0 s_1 c_1 s_2 ... c_{H-1} s_H <eos>

``c_t`` is the policy's choice at turn ``t`` (one token, ``a`` .. ``d`` for 4 choices): the only token the policy
samples. ``s_{t+1}`` is the environment's response (``+`` good, ``-`` bad): a tool-result token, log-probability 0,
never a step of its own, advantage 0 in the loss (its weight is dropped before the gradient). ``<eos>`` closes the
episode (also the environment's: the toy has no final answer to choose). The reward is 1 when the text ends in
``+`` (the final state is good). **Token counting**: a *sampled token* is a policy token, one choice; tool-result
and EOS tokens are not counted, in episodes and in Monte Carlo rollouts alike. A whole episode is ``H`` sampled
tokens; a rollout from turn boundary ``t`` is ``H - t``.

The policy (:class:`TabularAgentPolicy`) has logits per ``(turn, state)`` over the choices (``parameterization=
"turn"``, the tabular policy) or per ``state`` only, shared by every turn (``"shared"``: one set of weights acts at
every turn, as a language model's do, so credit given to a turn that does not matter moves the weights of the turn
that does). It is at once a :class:`~mcadvantage.samplers.Sampler` (it continues any prefix, counting the sampled
tokens) and a policy-gradient oracle (``parameters()``, ``token_logprobs``), so
:class:`~mcadvantage.evaluation.gradient_instrument.GradientTask` draws its groups and trees, grades them and builds
the estimator context exactly as for the other exact toys; its exact success probability and gradient come from
backward induction (:meth:`TabularAgentPolicy.exact_objective`), checked against
:func:`testbed.agent_env.success_probability`.

Training (:func:`train_arm`): plain on-policy policy gradient (one Adam step per batch, ratio 1, the loss
``-sum A log pi / policy tokens``) until a fixed budget of sampled tokens is spent. The arms (:data:`ARMS`): the
library's estimators through the seam (``grpo``, ``rloo``, ``vineppo`` at K = 1 and 4, with and without free samples,
``hybrid``, ``tree``), GRPO given more prompts or more samples per prompt, an **oracle** whose turn advantages are the
exact ``V_{t+1} - V_t`` at no sampling cost, and actor-critic arms with a **tabular critic** (``V`` per
``(turn, state)`` learned by regression, after a warm-up in which the policy does not move; GAE with lambda 1 and
0.95). The tabular critic is not the library's LM critic (``advantage_estimator="gae"``): it cannot generalise wrongly
and sees the state exactly, so it is the best case for a critic.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.baselines import GRPOEstimator, RLOOEstimator
from mcadvantage.estimators.batch import AdvantageBatch
from mcadvantage.estimators.hybrid import HybridEstimator
from mcadvantage.estimators.tree import TreeEstimator
from mcadvantage.estimators.vineppo import VinePPOEstimator
from mcadvantage.samplers.base import Continuation, RolloutRequest
from mcadvantage.testing import OutcomeReward, build_char_tokenizer
from testbed.agent_env import (
    BAD,
    GOOD,
    AgentTask,
    Progress,
    credit_report,
    exact_values,
    success_probability,
)

__all__ = [
    "ARMS",
    "ArmSpec",
    "ArmRun",
    "GOOD_CHAR",
    "BAD_CHAR",
    "PARAMETERIZATIONS",
    "ProbabilityTable",
    "TabularAgentPolicy",
    "TabularCritic",
    "NoisyOutcome",
    "ToyAnchor",
    "agent_gradient_task",
    "arm_batch_gradients",
    "arm_names",
    "batch_identification",
    "batch_tokens",
    "gae_advantages",
    "grpo_match_factor",
    "start_logits",
    "toy_task",
    "train_arm",
    "turn_pairs",
    "vineppo_k1_episode_tokens",
]

CHOICE_CHARS = "abcdefgh"
GOOD_CHAR, BAD_CHAR = "+", "-"
PARAMETERIZATIONS = ("turn", "shared")
#: Prompts per batch and responses per prompt of every arm's base batch (GRPO's group).
BASE_PROMPTS, BASE_GROUP = 4, 4


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    """The character tokenizer, built once per process (building it takes about a second; it is never mutated)."""
    return build_char_tokenizer()


def turn_pairs(text: str) -> list[str]:
    """The step segmenter of the toy: one step per turn, the choice and the environment's response (2 characters),
    so Monte Carlo states sit at turn boundaries, after each tool result."""
    return [text[i : i + 2] for i in range(0, len(text), 2)] or [text]


def toy_task(structure: str, horizon: int) -> AgentTask:
    """The study's task: 4 choices, key 0, decisive turn 0 (and, in ``recovery``, the repair turn last)."""
    return AgentTask(structure=structure, horizon=horizon, key=0, choices=4, decisive_turn=0)


class ProbabilityTable:
    """A :class:`~testbed.agent_env.TurnPolicy` from a table ``probs[turn][state][choice]`` (never stops)."""

    def __init__(self, probs: Sequence[Sequence[Sequence[float]]]) -> None:
        self.probs = [[list(map(float, row)) for row in turn] for turn in probs]

    def action_probs(self, view: Progress) -> list[float]:
        return self.probs[view.turn][view.state]


def _key_logit_for(p_key: float, choices: int) -> float:
    """The key's logit (others 0) that gives the key probability ``p_key``."""
    return math.log((choices - 1) * p_key / (1.0 - p_key))


def start_logits(task: AgentTask, success_rate: float, parameterization: str = "turn") -> torch.Tensor:
    """Initial logits giving exactly ``success_rate``: the key's logit ``c`` (every other choice 0) at every turn
    and state, with ``c`` solved from ``delayed``'s ``P = p`` or ``recovery``'s ``P = 1 - (1 - p) ** 2`` (decisive
    and repair turn both pick the key with ``p``; a ``gauntlet`` task's ``P = p ** D``). Checked against :func:`testbed.agent_env.success_probability` by
    the caller (:meth:`TabularAgentPolicy.exact_success`)."""
    if not 0.0 < success_rate < 1.0:
        raise ValueError(f"success_rate={success_rate} must lie strictly between 0 and 1.")
    if parameterization not in PARAMETERIZATIONS:
        raise ValueError(f"parameterization={parameterization!r} must be one of {PARAMETERIZATIONS}.")
    if task.structure == "gauntlet":  # every one of the decisive turns must pick the key: P = p ** D
        p = success_rate ** (1.0 / len(task.decisive_turns))
    else:
        p = success_rate if task.structure == "delayed" else 1.0 - math.sqrt(1.0 - success_rate)
    c = _key_logit_for(p, task.choices)
    shape = (task.horizon, 2, task.choices) if parameterization == "turn" else (2, task.choices)
    logits = torch.zeros(shape, dtype=torch.float64)
    logits[..., task.key] = c
    return logits


class TabularAgentPolicy:
    """A softmax policy over the choices of an :class:`~testbed.agent_env.AgentTask`, with exact values.

    Args:
        task: the task (the prompt texts are labels only: every prompt plays this task).
        logits: ``(H, 2, A)`` for ``parameterization="turn"``, ``(2, A)`` for ``"shared"``.
        parameterization: ``"turn"`` (logits per turn and state) or ``"shared"`` (per state, every turn).
        seed: seed of the private ``random.Random`` every draw comes from.

    Attributes:
        sampled_tokens: policy tokens (choices) drawn so far, by every caller (episodes, trees, rollouts).
        tokenizer: the character tokenizer the episodes are written in.
    """

    def __init__(
        self, task: AgentTask, logits: torch.Tensor, *, parameterization: str = "turn", seed: int = 0
    ):
        if parameterization not in PARAMETERIZATIONS:
            raise ValueError(f"parameterization={parameterization!r} must be one of {PARAMETERIZATIONS}.")
        if task.choices > len(CHOICE_CHARS):
            raise ValueError(
                f"task.choices={task.choices}: the toy writes at most {len(CHOICE_CHARS)} choices."
            )
        expected = (task.horizon, 2, task.choices) if parameterization == "turn" else (2, task.choices)
        if tuple(logits.shape) != expected:
            raise ValueError(
                f"logits of shape {tuple(logits.shape)} for parameterization={parameterization!r}; expected "
                f"{expected} (use start_logits(task, rate, parameterization))."
            )
        self.task = task
        self.parameterization = parameterization
        self.logits = logits.detach().to(torch.float64).clone().requires_grad_(True)
        self.rng = random.Random(seed)
        self.sampled_tokens = 0
        self.tokenizer = _tokenizer()
        self._choice_ids = [self._tid(ch) for ch in CHOICE_CHARS[: task.choices]]
        self._state_ids = {GOOD: self._tid(GOOD_CHAR), BAD: self._tid(BAD_CHAR)}
        self.eos_token_id = self.tokenizer.eos_token_id
        self._choice_of = {t: i for i, t in enumerate(self._choice_ids)}
        self._completion_vocab = set(self._choice_ids) | set(self._state_ids.values())

    def _tid(self, ch: str) -> int:
        return self.tokenizer(ch, add_special_tokens=False)["input_ids"][0]

    # -- the policy and its exact values ------------------------------------------------------------------------

    def parameters(self) -> list[torch.Tensor]:
        return [self.logits]

    def turn_log_probs(self) -> torch.Tensor:
        """``(H, 2, A)`` log-probabilities per turn and state (differentiable)."""
        log_probs = torch.log_softmax(self.logits, dim=-1)
        if self.parameterization == "shared":
            log_probs = log_probs.unsqueeze(0).expand(self.task.horizon, 2, self.task.choices)
        return log_probs

    def table(self) -> ProbabilityTable:
        """The current policy as a :class:`~testbed.agent_env.TurnPolicy` (for the testbed's exact functions)."""
        with torch.no_grad():
            return ProbabilityTable(self.turn_log_probs().exp().tolist())

    def exact_objective(self) -> torch.Tensor:
        """``J = P(success)`` by backward induction, differentiable in the logits:
        ``V_t(s) = sum_a pi_t(a | s) V_{t+1}(T_t(s, a))``, ``V_H = [0, 1]`` (bad, good)."""
        probs = self.turn_log_probs().exp()
        task = self.task
        nxt = torch.tensor([0.0, 1.0], dtype=torch.float64)
        for turn in reversed(range(task.horizon)):
            rows = []
            for state in (BAD, GOOD):
                after = torch.stack([nxt[task.transition(turn, state, a)] for a in range(task.choices)])
                rows.append((probs[turn, state] * after).sum())
            nxt = torch.stack(rows)
        return nxt[task.initial_state()]

    def exact_success(self) -> float:
        with torch.no_grad():
            return float(self.exact_objective())

    def exact_gradient(self) -> torch.Tensor:
        """``dJ / d logits``, flattened (float32): the true policy gradient."""
        (grad,) = torch.autograd.grad(self.exact_objective(), [self.logits])
        return grad.reshape(-1).to(torch.float32)

    def exact_values(self) -> list[dict[int, float]]:
        """``V_t(s)`` of the current policy (:func:`testbed.agent_env.exact_values`)."""
        return exact_values(self.task, self.table())

    # -- reading and writing episodes -----------------------------------------------------------------------

    def completion_part(self, prefix_ids: Sequence[int]) -> list[int]:
        """The trailing completion tokens of a prompt + completion prefix (prompts end with ``:``)."""
        tail: list[int] = []
        for tok in reversed(list(prefix_ids)):
            if tok not in self._completion_vocab:
                break
            tail.append(tok)
        return tail[::-1]

    def choices_of(self, completion_ids: Sequence[int]) -> list[int]:
        """The choices made in a completion (its policy tokens, in order)."""
        return [self._choice_of[t] for t in completion_ids if t in self._choice_of]

    def is_policy_token(self, token_id: int) -> bool:
        return token_id in self._choice_of

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``n`` continuations of each prefix under the current logits, cut at ``max_tokens``; a prefix ending
        just after a choice first gets that turn's tool result. Counts the choices drawn in
        :attr:`sampled_tokens`."""
        with torch.no_grad():
            probs = self.turn_log_probs().exp().tolist()
        task = self.task
        out: list[list[Continuation]] = []
        for req in requests:
            done = self.completion_part(req.prefix_ids)
            choices = self.choices_of(done)
            state = task.initial_state()
            for turn, choice in enumerate(choices):
                state = task.transition(turn, state, choice)
            pending = bool(done) and done[-1] in self._choice_of  # a choice whose tool result is not written
            conts = []
            for _ in range(req.n):
                tokens: list[int] = []
                s, turn = state, len(choices)
                if pending:
                    tokens.append(self._state_ids[s])
                while turn < task.horizon and len(tokens) < req.max_tokens:
                    weights = probs[turn][s]
                    a = self.rng.choices(range(task.choices), weights=weights)[0]
                    tokens.append(self._choice_ids[a])
                    self.sampled_tokens += 1
                    s = task.transition(turn, s, a)
                    turn += 1
                    tokens.append(self._state_ids[s])
                if turn >= task.horizon:
                    tokens.append(self.eos_token_id)
                cut = len(tokens) > req.max_tokens or (turn < task.horizon)
                conts.append(Continuation(token_ids=tuple(tokens[: req.max_tokens]), truncated=cut))
            out.append(conts)
        return out

    def token_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """``(B, T)`` log-probabilities of the completion tokens (differentiable); tool-result and EOS tokens are
        the environment's: log-probability 0, no gradient."""
        log_probs = self.turn_log_probs()
        width = max((len(c) for c in completion_ids), default=0)
        rows: list[int] = []
        cols: list[int] = []
        flat: list[int] = []
        choices, stride = self.task.choices, 2 * self.task.choices
        for i, ids in enumerate(completion_ids):
            state, turn = self.task.initial_state(), 0
            for pos, tok in enumerate(ids):
                if tok in self._choice_of and turn < self.task.horizon:
                    a = self._choice_of[tok]
                    rows.append(i)
                    cols.append(pos)
                    flat.append(turn * stride + state * choices + a)
                    state = self.task.transition(turn, state, a)
                    turn += 1
        picked = log_probs.reshape(-1)[torch.tensor(flat, dtype=torch.long)]
        out = torch.zeros((len(completion_ids), width), dtype=torch.float64)
        return out.index_put(
            (torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)), picked
        )

    def policy_token_mask(self, completion_ids: Sequence[Sequence[int]], width: int) -> torch.Tensor:
        """``(B, width)`` bool: the policy's own tokens (the choices)."""
        mask = torch.zeros((len(completion_ids), width), dtype=torch.bool)
        for i, ids in enumerate(completion_ids):
            for pos, tok in enumerate(ids[:width]):
                mask[i, pos] = tok in self._choice_of
        return mask


def agent_gradient_task(
    policy: TabularAgentPolicy, prompts: int, *, reward_noise: float = 0.0, seed: int = 0
) -> Any:
    """A :class:`~mcadvantage.evaluation.gradient_instrument.GradientTask` on the toy: ``prompts`` distinct prompt
    labels (``P00:`` ...), the policy as oracle and sampler, ``OutcomeReward("+")``, the turn segmenter and room for
    a whole episode (``2 H + 1`` tokens). ``reward_noise > 0``: the reward is :class:`NoisyOutcome` (each reward
    flipped with that probability, from ``seed``)."""
    from mcadvantage.evaluation.gradient_instrument import GradientTask

    reward: Any = OutcomeReward(GOOD_CHAR, name="final_state_good")
    if reward_noise > 0:
        reward = NoisyOutcome(reward, reward_noise, seed)

    tok = policy.tokenizer
    texts = [f"P{i:03d}:" for i in range(prompts)]
    return GradientTask(
        oracle=policy,
        sampler=policy,
        prompt_ids=[tok(t, add_special_tokens=False)["input_ids"] for t in texts],
        prompts=texts,
        rows=[{} for _ in texts],
        reward_funcs=[reward],
        tokenizer=tok,
        segmenter=turn_pairs,
        max_completion_length=2 * policy.task.horizon + 1,
    )


class NoisyOutcome:
    """A noisy outcome: the wrapped reward function's 0/1 rewards, each flipped with probability ``noise`` (a
    private ``random.Random(seed)``), for the training episodes and Monte Carlo rollouts alike. The study's measure
    stays the exact probability of the good final state, not the noisy reward."""

    def __init__(self, reward: Callable[..., list[float]], noise: float, seed: int) -> None:
        if not 0.0 <= noise < 0.5:
            raise ValueError(f"reward_noise={noise} must lie in [0, 0.5): at 0.5 the reward says nothing.")
        self.reward, self.noise, self.rng = reward, noise, random.Random(f"noise-{seed}")
        self.__name__ = f"noisy_{getattr(reward, '__name__', 'reward')}"

    def __call__(self, *args: Any, **kwargs: Any) -> list[float]:
        return [1.0 - r if self.rng.random() < self.noise else r for r in self.reward(*args, **kwargs)]


# ---------------------------------------------------------------------------------------------------------------
# The tabular critic
# ---------------------------------------------------------------------------------------------------------------


class TabularCritic:
    """``V(turn, state)`` learned by regression: after each batch every visited cell moves ``rate`` of the way to
    the mean of its targets in the batch (an exponential moving average of the returns, the least-squares fit of a
    table). Starts at 0.5 everywhere (no prior knowledge of the task)."""

    def __init__(self, horizon: int, *, rate: float = 0.5) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate={rate} must lie in (0, 1].")
        self.values = [[0.5, 0.5] for _ in range(horizon)]
        self.rate = rate

    def keys(self, task: Any, choices: Sequence[int]) -> list[int]:
        """What the tabular critic sees before each turn (and after the last): the exact state."""
        return _episode_states(task, choices)

    def value(self, turn: int, state: int) -> float:
        return self.values[turn][state]

    def update(self, visits: Sequence[tuple[int, int, float]]) -> None:
        """Regress toward ``(turn, state, target)`` visits of one batch."""
        sums: dict[tuple[int, int], list[float]] = {}
        for turn, state, target in visits:
            sums.setdefault((turn, state), []).append(target)
        for (turn, state), targets in sums.items():
            mean = sum(targets) / len(targets)
            self.values[turn][state] += self.rate * (mean - self.values[turn][state])


def gae_advantages(
    states: Sequence[int], reward: float, critic: TabularCritic, lam: float
) -> tuple[list[float], list[float]]:
    """GAE (gamma 1, reward only at the end) of one episode's turns: ``delta_t = V(s_{t+1}) - V(s_t)`` with
    ``V(s_H) = R``, ``A_t = sum_k lam^k delta_{t+k}``; returns the advantages and the lambda-return targets
    ``A_t + V(s_t)``. ``states`` are the ``H + 1`` turn-boundary states (or whatever the critic keys its values
    by: :meth:`TabularCritic.keys`)."""
    horizon = len(states) - 1
    v = [critic.value(t, states[t]) for t in range(horizon)] + [float(reward)]
    advantages = [0.0] * horizon
    running = 0.0
    for t in reversed(range(horizon)):
        running = (v[t + 1] - v[t]) + lam * running
        advantages[t] = running
    return advantages, [a + v[t] for t, a in enumerate(advantages)]


# ---------------------------------------------------------------------------------------------------------------
# Arms
# ---------------------------------------------------------------------------------------------------------------


def vineppo_k1_episode_tokens(horizon: int) -> int:
    """Sampled tokens of one training episode under ``vineppo`` at K = 1: the episode's ``H`` tokens, and one rollout
    from each of its ``H`` turn-boundary states, ``H (H + 1) / 2`` more (a rollout from boundary ``t`` is ``H - t``)."""
    return horizon + horizon * (horizon + 1) // 2


def grpo_match_factor(horizon: int) -> int:
    """How many times GRPO's sampled tokens per batch ``vineppo`` at K = 1 spends (rounded half up):
    :func:`vineppo_k1_episode_tokens` over ``H``, i.e. ``(H + 3) / 2``. GRPO's matched arms get this many times more
    prompts, or samples per prompt, per batch."""
    return int(math.floor(vineppo_k1_episode_tokens(horizon) / horizon + 0.5))


def batch_tokens(arm: str, horizon: int) -> int:
    """Sampled tokens of one batch of ``arm`` at ``horizon`` before any update, where it has a closed form: an arm
    without rollouts (its batch's episodes, ``H`` each) or ``vineppo`` at K = 1 (:func:`vineppo_k1_episode_tokens` per
    episode, free samples counted as fresh). Raises ``ValueError`` for the other arms (trees, K = 4, the hybrid)."""
    spec = ARMS[arm]
    episodes = spec.prompts(horizon) * spec.group(horizon)
    if arm in ("vineppo_k1", "vineppo_k1_reuse"):
        return episodes * vineppo_k1_episode_tokens(horizon)
    if spec.kind == "estimator" and not isinstance(
        spec.build(horizon), GRPOEstimator | RLOOEstimator | ToyAnchor
    ):
        raise ValueError(
            f"batch_tokens: arm {arm!r} has no closed form here; use an arm without rollouts or 'vineppo_k1'"
        )
    return episodes * horizon


@dataclass(frozen=True)
class ArmSpec:
    """One arm: how its batch is drawn and how its advantages are computed.

    Attributes:
        name: the arm's name in records.
        kind: ``"estimator"`` (a library estimator through the seam), ``"oracle"`` or ``"critic"``.
        build: for ``"estimator"``: ``horizon -> estimator``.
        prompts: ``horizon -> prompts per batch``.
        group: ``horizon -> responses per prompt``.
        lam: GAE lambda of a ``"critic"`` arm.
        whiten: whiten the turn advantages over the batch's policy tokens (None: the estimator's default).
        critic: for ``"critic"``: ``task -> critic`` (None: :class:`TabularCritic`); a critic has ``keys(task,
            choices)`` (what it sees before each turn), ``value(turn, key)`` and ``update(visits)``.
        advantages: for ``"custom"``: ``(policy, batch, context) -> (B, T)`` raw advantages on the choice tokens
            (the credit computed from the batch alone, e.g. anchor-state credit in :mod:`testbed.credit_map`).
    """

    name: str
    kind: str
    build: Callable[[int], Any] | None = None
    prompts: Callable[[int], int] = lambda h: BASE_PROMPTS
    group: Callable[[int], int] = lambda h: BASE_GROUP
    lam: float = 1.0
    whiten: bool | None = None
    critic: Callable[[Any], Any] | None = None
    advantages: Callable[..., torch.Tensor] | None = None


class ToyAnchor(AdvantageEstimator):
    """``advantage_estimator="anchor"`` on the toy's batches, keyed as the arm says: the toy's batches carry no tool
    mask and no keys, so this marks the choices as the model's turns (``tool_mask`` 1 on choice tokens only: the
    environment's ``+`` / ``-`` and EOS are tool results) and gives each turn its key, then calls the library's
    :class:`~mcadvantage.estimators.anchor.AnchorEstimator` through the seam.

    Keys: ``"state"``, the true state before turn ``t``, ``(t, s_t)`` (``s_t`` read from the environment's token after
    turn ``t - 1``; the first state is the task's, shared by the group); ``"history"``, every token before the turn
    (the prompt and the episode so far): what observation keys amount to when the observation carries the history,
    so two episodes share a key only while their histories are identical.
    """

    def __init__(self, key: str, credit: str = "normalized") -> None:
        from mcadvantage.estimators.anchor import AnchorEstimator

        if key not in ("state", "history"):
            raise ValueError(f"ToyAnchor: key={key!r} must be 'state' or 'history'.")
        self.key = key
        self.inner = AnchorEstimator(credit=credit)
        tok = _tokenizer()
        self._choice_ids = {tok.convert_tokens_to_ids(ch) for ch in CHOICE_CHARS}

    def keyed(self, batch: AdvantageBatch) -> AdvantageBatch:
        """``batch`` with the toy's tool mask and turn keys."""
        import dataclasses

        mask = torch.zeros_like(batch.completion_mask, dtype=torch.long)
        keys = []
        for i, ids in enumerate(batch.completion_ids):
            turns = [p for p, tok in enumerate(ids) if tok in self._choice_ids]
            mask[i, turns] = 1
            if self.key == "state":
                keys.append([(t, None if t == 0 else ids[p - 1]) for t, p in enumerate(turns)])
            else:
                keys.append([(tuple(batch.prompt_ids[i]), tuple(ids[:p])) for p in turns])
        return dataclasses.replace(batch, tool_mask=mask, turn_keys=keys)

    def estimate(self, batch: AdvantageBatch, context: Any) -> Any:
        """The anchor estimator's result on the keyed batch."""
        return self.inner.estimate(self.keyed(batch), context)


def _vineppo(k: int, reuse: bool) -> Callable[[int], Any]:
    return lambda h: VinePPOEstimator(num_rollouts=k, reuse_samples=reuse, step_segmenter=turn_pairs)


#: Every arm of the study (docs/where-credit-pays-protocol.md), in report order.
ARMS: dict[str, ArmSpec] = {
    spec.name: spec
    for spec in (
        ArmSpec("grpo", "estimator", build=lambda h: GRPOEstimator()),
        ArmSpec(
            "grpo_prompts",
            "estimator",
            build=lambda h: GRPOEstimator(),
            prompts=lambda h: BASE_PROMPTS * grpo_match_factor(h),
        ),
        ArmSpec(
            "grpo_samples",
            "estimator",
            build=lambda h: GRPOEstimator(),
            group=lambda h: BASE_GROUP * grpo_match_factor(h),
        ),
        ArmSpec("rloo", "estimator", build=lambda h: RLOOEstimator()),
        ArmSpec("vineppo_k1", "estimator", build=_vineppo(1, False)),
        ArmSpec("vineppo_k1_reuse", "estimator", build=_vineppo(1, True)),
        ArmSpec("vineppo_k4", "estimator", build=_vineppo(4, False)),
        ArmSpec("vineppo_k4_reuse", "estimator", build=_vineppo(4, True)),
        ArmSpec(
            "hybrid",
            "estimator",
            build=lambda h: HybridEstimator(budget=0.5, num_rollouts=4, step_segmenter=turn_pairs),
        ),
        ArmSpec(
            "tree",
            "estimator",
            build=lambda h: TreeEstimator(branching=(2, 2), depths=(0, 2 * (h // 2))),
        ),
        ArmSpec("oracle", "oracle", whiten=False),
        ArmSpec("critic_l1", "critic", lam=1.0, whiten=True),
        ArmSpec("critic_l095", "critic", lam=0.95, whiten=True),
        # Anchor-state turn credit (issue 49): GiGPO's normalised step advantage and the pooled batch values, keyed
        # by the true state (turn, state) or by the history (free-text observations); no extra samples.
        ArmSpec("anchor", "estimator", build=lambda h: ToyAnchor("state")),
        ArmSpec("anchor_pooled", "estimator", build=lambda h: ToyAnchor("state", "pooled")),
        ArmSpec("anchor_hist", "estimator", build=lambda h: ToyAnchor("history")),
        ArmSpec("anchor_hist_pooled", "estimator", build=lambda h: ToyAnchor("history", "pooled")),
        # Exploratory (protocol amendment): GRPO at the (2, 2) tree's sampled tokens per batch (3 H per group of 4
        # leaves, so 3 prompts x 4), to separate the tree's credit from its cheaper batch.
        ArmSpec("grpo_tree_tokens", "estimator", build=lambda h: GRPOEstimator(), prompts=lambda h: 3),
    )
}
GRPO_ARMS = ("grpo", "grpo_prompts", "grpo_samples")


def arm_names() -> list[str]:
    return list(ARMS)


@dataclass
class ArmRun:
    """What one training run records.

    Attributes:
        curve: ``(sampled tokens so far, exact success)`` after each update (the first entry: the start).
        success_at_budget: exact success of the last policy whose cumulative sampled tokens fit the budget.
        steps: updates made within the budget.
        sampled_tokens: tokens sampled by the updates within the budget (warm-up included).
        episode_tokens / rollout_tokens: of those, the training episodes' and the Monte Carlo rollouts' (and a
            tree's shared prefixes count once, as episode tokens).
        episodes: training episodes within the budget.
        irrelevant_share: mean over episodes (with nonzero credit) of the share of absolute turn credit on turns
            whose exact advantage is 0 (:func:`testbed.agent_env.credit_report`), or NaN.
        decisive_sign_accuracy: share of episodes whose decisive-turn credit has the exact advantage's sign.
        credited_episodes: episodes in ``irrelevant_share``.
        update_tokens: sampled tokens spent (warm-up included) after each update.
    """

    curve: list[tuple[int, float]]
    success_at_budget: float
    steps: int
    sampled_tokens: int
    episode_tokens: int
    rollout_tokens: int
    episodes: int
    irrelevant_share: float
    decisive_sign_accuracy: float
    credited_episodes: int
    start_success: float
    extra: dict[str, float] = field(default_factory=dict)
    update_tokens: list[int] = field(default_factory=list)


def _whiten(adv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    from mcadvantage.core.advantages import masked_whiten

    if int(valid.sum()) < 2:
        return torch.zeros_like(adv)
    return masked_whiten(adv * valid, valid) * valid


def _episode_states(task: AgentTask, choices: Sequence[int]) -> list[int]:
    states = [task.initial_state()]
    for t, a in enumerate(choices):
        states.append(task.transition(t, states[-1], a))
    return states


def _turn_advantages(
    spec: ArmSpec,
    policy: TabularAgentPolicy,
    batch: AdvantageBatch,
    critic: TabularCritic | None,
) -> torch.Tensor:
    """``(B, T)`` raw advantages on the choice tokens for the oracle and critic arms (0 elsewhere)."""
    task = policy.task
    mask = batch.completion_mask
    adv = torch.zeros(mask.shape, dtype=torch.float32)
    values = policy.exact_values() if spec.kind == "oracle" else None
    rewards = batch.rewards.tolist()
    for i, ids in enumerate(batch.completion_ids):
        choices = policy.choices_of(ids)
        states = _episode_states(task, choices)
        if spec.kind == "oracle":
            assert values is not None
            path = [values[t][s] for t, s in enumerate(states)]
            turn_adv = [b - a for a, b in zip(path, path[1:], strict=False)]
        else:
            assert critic is not None
            turn_adv, _ = gae_advantages(critic.keys(task, choices), rewards[i], critic, spec.lam)
        positions = [p for p, tok in enumerate(ids) if policy.is_policy_token(tok)]
        for p, a in zip(positions, turn_adv, strict=False):
            adv[i, p] = a
    return adv


def _draw_batch(gtask: Any, prompts: int, group: int, schedule: Any) -> AdvantageBatch:
    """One batch of an arm: ``group`` episodes for each of ``prompts`` prompts, or one tree per prompt."""
    indices = list(range(prompts))
    if schedule is not None:
        return gtask.sample_trees(indices, schedule)[0]
    return gtask.sample_group(indices, group)


def _batch_advantages(
    spec: ArmSpec,
    policy: TabularAgentPolicy,
    batch: AdvantageBatch,
    estimator: Any,
    context: Any,
    critic: TabularCritic | None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """An arm's raw advantages on a batch, the tokens they apply to (the policy tokens, less any the estimator
    masks) and whether the arm whitens them: the estimator through the seam, else the oracle or the critic."""
    mask = batch.completion_mask.bool()
    valid = policy.policy_token_mask(batch.completion_ids, mask.shape[1]) & mask
    if estimator is not None:
        result = estimator.estimate(batch, context)
        raw = result.advantages.float()
        if result.token_mask is not None:
            valid = valid & result.token_mask.bool()
        return raw, valid, estimator.whiten_by_default if spec.whiten is None else spec.whiten
    if spec.kind == "custom":
        assert spec.advantages is not None
        return spec.advantages(policy, batch, context).float(), valid, bool(spec.whiten)
    return _turn_advantages(spec, policy, batch, critic), valid, bool(spec.whiten)


def batch_identification(
    policy: TabularAgentPolicy, batch: AdvantageBatch, raw: torch.Tensor, episodes: int | None = None
) -> tuple[list[float], list[bool]]:
    """Credit identification of an arm's raw advantages on a batch (its first ``episodes`` episodes; None: all),
    against the exact advantages of the policy that drew it (:func:`testbed.agent_env.credit_report`): per episode
    whose every turn was played and that got some credit, the share of absolute credit on turns whose exact
    advantage is 0, and, where the decisive turn's exact advantage is not 0, whether its credit has that sign."""
    table = policy.table()
    shares: list[float] = []
    signs: list[bool] = []
    for i, ids in enumerate(batch.completion_ids[:episodes]):
        positions = [p for p, tok in enumerate(ids) if policy.is_policy_token(tok)]
        credits = [float(raw[i, p]) for p in positions]
        if len(credits) != policy.task.horizon or not any(credits):
            continue
        report = credit_report(policy.task, table, policy.choices_of(ids), credits)
        shares.append(report.irrelevant_share)
        if report.decisive_sign_agrees is not None:
            signs.append(report.decisive_sign_agrees)
    return shares, signs


def _critic_visits(
    policy: TabularAgentPolicy, batch: AdvantageBatch, critic: TabularCritic, lam: float
) -> list[tuple[int, int, float]]:
    visits = []
    for ids, reward in zip(batch.completion_ids, batch.rewards.tolist(), strict=True):
        states = critic.keys(policy.task, policy.choices_of(ids))
        _, targets = gae_advantages(states, reward, critic, lam)
        visits.extend((t, states[t], y) for t, y in enumerate(targets))
    return visits


def train_arm(
    structure: str,
    horizon: int,
    start_rate: float,
    arm: str | ArmSpec,
    seed: int,
    *,
    budget_episodes: int,
    parameterization: str = "turn",
    lr: float = 0.1,
    critic_warmup_batches: int = 2,
    critic_rate: float = 0.5,
    credit_episodes_per_batch: int = 16,
    task: Any | None = None,
    batch_shape: tuple[int, int] | None = None,
    reward_noise: float = 0.0,
) -> ArmRun:
    """Train one arm from the start policy until ``budget_episodes * horizon`` sampled tokens are spent.

    Every update: draw the arm's batch (a tree for ``tree``), compute its turn advantages (the estimator through
    the seam; the oracle from the exact values; the critic by GAE; a ``custom`` arm's function), keep only the
    policy tokens (tool results and EOS get 0), whiten them over the batch's policy tokens when the arm whitens (the
    estimator's default otherwise), and take one Adam step on ``-sum A log pi / policy tokens``. A batch whose
    sampled tokens would overrun the budget is not trained on (it is not counted either): the run stops there.
    Before its first update a ``critic`` arm spends ``critic_warmup_batches`` batches fitting its critic with the
    policy fixed (counted).

    ``arm`` is a name of :data:`ARMS` or an :class:`ArmSpec`; ``task`` replaces ``toy_task(structure, horizon)``
    (e.g. a :class:`testbed.credit_map.GauntletTask`; its ``horizon`` must equal ``horizon``); ``batch_shape``
    ``(prompts, responses per prompt)`` replaces the arm's (trees: ``prompts`` trees); ``reward_noise`` flips each
    reward (episodes and rollouts alike) with that probability, from the run's seed. ``ArmRun.update_tokens`` lists
    the sampled tokens spent after each update, so a run at a budget gives every smaller budget's result too.
    """
    from mcadvantage.estimators.base import DrawsTrees
    from mcadvantage.estimators.registry import as_advantage_estimator

    if isinstance(arm, str) and arm not in ARMS:
        raise ValueError(f"arm={arm!r} is not one of {list(ARMS)}.")
    spec = ARMS[arm] if isinstance(arm, str) else arm
    task = toy_task(structure, horizon) if task is None else task
    if task.horizon != horizon:
        raise ValueError(f"task.horizon={task.horizon} but horizon={horizon}: pass the same horizon.")
    policy = TabularAgentPolicy(
        task, start_logits(task, start_rate, parameterization), parameterization=parameterization, seed=seed
    )
    start = policy.exact_success()
    checked = success_probability(task, policy.table())
    if abs(start - start_rate) > 1e-9 or abs(checked - start_rate) > 1e-9:
        raise RuntimeError(
            f"the start logits give success {start!r} (testbed: {checked!r}), not start_rate={start_rate}: "
            "start_logits and the exact values disagree."
        )
    torch.manual_seed(seed)
    estimator = as_advantage_estimator(spec.build(horizon)) if spec.build is not None else None
    prompts, group = (spec.prompts(horizon), spec.group(horizon)) if batch_shape is None else batch_shape
    gtask = agent_gradient_task(policy, prompts, reward_noise=reward_noise, seed=seed)
    context = gtask.context()
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    budget = budget_episodes * horizon
    curve = [(0, start)]
    critic = None
    if spec.kind == "critic":
        critic = TabularCritic(horizon, rate=critic_rate) if spec.critic is None else spec.critic(task)
    update_tokens: list[int] = []
    spent = episode_tokens = rollout_tokens = episodes = steps = 0
    shares: list[float] = []
    signs: list[bool] = []
    schedule = (
        estimator.tree_schedule(gtask.max_completion_length) if isinstance(estimator, DrawsTrees) else None
    )
    warmup_left = critic_warmup_batches if critic is not None else 0
    while True:
        before = policy.sampled_tokens
        batch = _draw_batch(gtask, prompts, group, schedule)
        drawn = policy.sampled_tokens - before
        if critic is not None and warmup_left > 0:
            if spent + drawn > budget:
                break
            critic.update(_critic_visits(policy, batch, critic, spec.lam))
            spent += drawn
            episode_tokens += drawn
            warmup_left -= 1
            curve.append((spent, curve[-1][1]))
            continue
        raw, valid, whiten = _batch_advantages(spec, policy, batch, estimator, context, critic)
        total_drawn = policy.sampled_tokens - before
        if spent + total_drawn > budget:
            break
        advantages = _whiten(raw, valid) if whiten else raw * valid
        # credit identification on this batch (the raw credit, before whitening shifts it), against the exact
        # advantages of the policy that drew it
        batch_shares, batch_signs = batch_identification(policy, batch, raw, credit_episodes_per_batch)
        shares += batch_shares
        signs += batch_signs
        if critic is not None:
            critic.update(_critic_visits(policy, batch, critic, spec.lam))
        weights = advantages * valid / max(int(valid.sum()), 1)
        logp = policy.token_logprobs(batch.prompt_ids, batch.completion_ids)
        loss = -(weights.to(logp.dtype)[:, : logp.shape[1]] * logp).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        episodes += len(batch.completion_ids)
        spent += total_drawn
        episode_tokens += drawn
        rollout_tokens += total_drawn - drawn
        update_tokens.append(spent)
        curve.append((spent, policy.exact_success()))
    return ArmRun(
        curve=curve,
        success_at_budget=curve[-1][1],
        steps=steps,
        sampled_tokens=spent,
        episode_tokens=episode_tokens,
        rollout_tokens=rollout_tokens,
        episodes=episodes,
        irrelevant_share=sum(shares) / len(shares) if shares else math.nan,
        decisive_sign_accuracy=sum(signs) / len(signs) if signs else math.nan,
        credited_episodes=len(shares),
        start_success=start,
        update_tokens=update_tokens,
    )


# ---------------------------------------------------------------------------------------------------------------
# The gradient instrument on the toy
# ---------------------------------------------------------------------------------------------------------------


def arm_batch_gradients(
    structure: str,
    horizon: int,
    start_rate: float,
    arm: str,
    seed: int,
    repeats: int,
    *,
    parameterization: str = "turn",
    critic_warmup_batches: int = 2,
    critic_rate: float = 0.5,
    on_batch: Callable[[TabularAgentPolicy, AdvantageBatch, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """The exact gradient at the start policy and ``repeats`` independent batch gradients of ``arm`` there, each as
    :func:`train_arm` computes its first update (the arm's batch, its advantages on the policy tokens, its
    whitening, ``sum A grad log pi / policy tokens``: the ascent direction), with each batch's sampled tokens.

    The policy never moves. A ``critic`` arm gets a fresh critic per repeat, fitted on ``critic_warmup_batches``
    batches first as in training; those batches' tokens are not counted (a run pays them once, not per batch).
    The oracle's batch costs its episodes only. ``on_batch(policy, batch, raw)``, when given, sees each batch and
    the arm's raw advantages on it (e.g. :func:`batch_identification`).
    """
    from mcadvantage.estimators.base import DrawsTrees
    from mcadvantage.estimators.registry import as_advantage_estimator

    if arm not in ARMS:
        raise ValueError(f"arm={arm!r} is not one of {list(ARMS)}.")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1.")
    spec = ARMS[arm]
    task = toy_task(structure, horizon)
    policy = TabularAgentPolicy(
        task, start_logits(task, start_rate, parameterization), parameterization=parameterization, seed=seed
    )
    torch.manual_seed(seed)
    estimator = as_advantage_estimator(spec.build(horizon)) if spec.build is not None else None
    prompts, group = spec.prompts(horizon), spec.group(horizon)
    gtask = agent_gradient_task(policy, prompts)
    context = gtask.context()
    schedule = (
        estimator.tree_schedule(gtask.max_completion_length) if isinstance(estimator, DrawsTrees) else None
    )
    gradients: list[torch.Tensor] = []
    tokens: list[int] = []
    for _ in range(repeats):
        critic = None
        if spec.kind == "critic":
            critic = TabularCritic(horizon, rate=critic_rate)
            for _ in range(critic_warmup_batches):
                warm = _draw_batch(gtask, prompts, group, schedule)
                critic.update(_critic_visits(policy, warm, critic, spec.lam))
        before = policy.sampled_tokens
        batch = _draw_batch(gtask, prompts, group, schedule)
        raw, valid, whiten = _batch_advantages(spec, policy, batch, estimator, context, critic)
        tokens.append(policy.sampled_tokens - before)
        if on_batch is not None:
            on_batch(policy, batch, raw * valid)
        advantages = _whiten(raw, valid) if whiten else raw * valid
        weights = advantages * valid / max(int(valid.sum()), 1)
        logp = policy.token_logprobs(batch.prompt_ids, batch.completion_ids)
        objective = (weights.to(logp.dtype)[:, : logp.shape[1]] * logp).sum()
        (grad,) = torch.autograd.grad(objective, policy.parameters(), allow_unused=True)
        gradients.append(
            torch.zeros(policy.logits.numel()) if grad is None else grad.reshape(-1).to(torch.float32)
        )
    return policy.exact_gradient(), gradients, tokens
