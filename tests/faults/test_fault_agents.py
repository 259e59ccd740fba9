"""Faults inside agent episodes under the pass-through estimators (``"grpo"``, ``"rloo"``, ``"gae"``): a tool that
raises, an environment whose ``reset`` raises, an episode cut by ``max_completion_length`` in the middle of a tool
call, an episode stopped by ``max_tool_calling_iterations``, and an environment whose ``get_reward`` raises.

Each case trains ``VinePPOTrainer(advantage_estimator="grpo")`` and ``trl.GRPOTrainer`` on the same seed and checks
that they handle it the same way: the same error, or the same episodes, logs and weights bit for bit, finite, with
the tool results (``tool_mask`` 0) given no advantage. The one difference is on purpose: a ``get_reward`` that raises
is named (environment class, row, fix) where TRL lets the bare error through. ``"rloo"`` and ``"gae"`` train through the failing tool with
finite weights.

The episodes are the testbed's (``testbed.agent_env.AgentEnv``, horizon 3) played by its scripted tool-calling policy
(``testbed.agent_policy.ScriptedAgentSampler``) in place of the tiny model's generation, so every turn is a
well-formed ``act`` call or ``done`` at known token lengths; everything else is TRL's real tool loop and loss. The
rewards are the environment's ``get_reward`` plus a dense one (the share of the episode's calls that chose the key),
so the groups differ and the weights move.

The second half injects faults inside the Monte Carlo continuations of ``"vineppo"`` (and ``"hybrid"``), which
resume every state of an episode through the tool loop on an environment rebuilt by ``reset`` and replay: a tool
that raises only in a continuation gets TRL's error result and the continuation is graded; a ``reset`` that raises
on replay, or a replay that diverges (outside state, an unseeded random, a random observation, a ``state_key`` that
differs after ``reset`` or only after a middle round), stops training with an ``EnvironmentReplayError`` naming the
class, the episode and the fix before any update; a continuation meets
``max_tool_calling_iterations`` (the prefix's rounds count) and a cut tool call as TRL's loop meets them in the
episode.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import re
import threading

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from testbed.agent_env import BAD, AgentEnv, KeyPolicy, make_agent_dataset  # noqa: E402
from testbed.agent_policy import ScriptedAgentSampler, build_agent_model, build_agent_tokenizer  # noqa: E402

TOKENIZER = build_agent_tokenizer()
#: Recovery with its decisive turn second: the first turn changes nothing, so its tool result ("turn 1/3
#: state=good") and hence the token length of an episode's first call and result are the same in every episode.
DATA = dict(structure="recovery", horizon=3, n=8, seed=0, decisive_turn=1)
SETTINGS = dict(
    report_to="none",
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=256,  # room for 4 calls and their results, one of them an error
    max_steps=2,
    learning_rate=0.05,
    beta=0.0,
    logging_steps=1,
    save_strategy="no",
    seed=0,
    disable_tqdm=True,
)


def key_share(completions, key, **kwargs) -> list[float]:
    """The share of an episode's tool calls that chose the row's key (0 without calls)."""
    out = []
    for messages, k in zip(completions, key, strict=True):
        calls = [c for m in messages for c in (m.get("tool_calls") or [])]
        hits = [c["function"]["arguments"].get("choice") == k for c in calls]
        out.append(sum(hits) / len(hits) if hits else 0.0)
    return out


class FlakyAct(AgentEnv):
    """``act`` raises once per episode, on the episode's second call (a crashing simulator); the call is not played,
    so the policy, which reads the turn from the last good result, calls it again."""

    def reset(self, **row):
        self.crashed = False
        return super().reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        if self.turn == 1 and not self.crashed:
            self.crashed = True
            raise RuntimeError("the simulator crashed")
        return super().act(choice)


def reset_fails_from_call(n: int) -> type[AgentEnv]:
    """An environment whose ``reset`` raises from its ``n``-th call on (counted per factory, so each trainer's
    episodes meet it at the same point)."""
    calls = {"n": 0}

    class ResetFails(AgentEnv):
        def reset(self, **row):
            calls["n"] += 1
            if calls["n"] >= n:
                raise ConnectionError("the environment server refused the connection")
            return super().reset(**row)

    return ResetFails


def _script_turns(monkeypatch, policy: KeyPolicy) -> None:
    """Every turn of every episode is ``policy``'s (a fresh ``ScriptedAgentSampler(seed=1)`` per trainer, so
    trainers on the same seed play the same episodes), with the budget TRL gives a turn (``max_completion_length``)."""
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")

    def turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if "_scripted" not in self.__dict__:
            self._scripted = ScriptedAgentSampler(policy, self.processing_class, seed=1)
        # prompt_ids holds each prompt num_generations times already (GRPO's sampler repeats them).
        return self._scripted.generate(prompt_ids, self.args.max_completion_length), None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", turn)


@pytest.fixture
def scripted_turns(monkeypatch):
    """The episodes are the scripted policy's, choosing the key half the time."""
    _script_turns(monkeypatch, KeyPolicy(0.5))


class Spy:
    """What the estimator was given and what it returned (``compute_advantages``, the public hook)."""

    def __init__(self, trainer):
        self.batches, self.advantages = [], []
        hook = trainer.compute_advantages

        def compute(batch):
            out = hook(batch)
            self.batches.append(batch)
            self.advantages.append(out)
            return out

        trainer.compute_advantages = compute


def _trainer(
    kind: str, tmp_path, environment, estimator="grpo", reward_funcs=None, mc_sampler=None, **config
):
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    settings = {**SETTINGS, **config}
    if kind == "grpo":
        cls, args = GRPOTrainer, GRPOConfig(output_dir=str(tmp_path / kind), **settings)
    else:
        extra = {"whiten_advantages": True, "scale_rewards": "none"} if estimator != "grpo" else {}
        cls = VinePPOTrainer
        args = VinePPOConfig(
            output_dir=str(tmp_path / kind), advantage_estimator=estimator, **extra, **settings
        )
    model = build_agent_model(
        TOKENIZER,
        max_position_embeddings=512,
        num_layers=1,
        hidden_size=32,
        head_dim=16,
        intermediate_size=64,
    )
    return cls(
        model=model,
        # a fresh list: GRPO appends the environment's get_reward to it
        reward_funcs=list(reward_funcs) if reward_funcs is not None else [key_share],
        args=args,
        train_dataset=make_agent_dataset(**DATA),
        processing_class=TOKENIZER,
        environment_factory=environment,
        **({"mc_sampler": mc_sampler} if mc_sampler is not None else {}),
    )


def _logged(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


def _weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _model_spans(ids, tool_mask):
    """The model's own turns of one completion (runs of ``tool_mask`` 1), as token lists."""
    spans, current = [], []
    for token, m in zip(ids, tool_mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def _completions(spy):
    """``(completion ids, tool mask)`` of every episode the estimator saw, padding dropped."""
    out = []
    for batch in spy.batches:
        for ids, cmask, tmask in zip(
            batch.completion_ids, batch.completion_mask, batch.tool_mask, strict=True
        ):
            n = int(cmask.sum())
            out.append((list(ids)[:n], tmask[:n].tolist()))
    return out


def _check_same_training(grpo, ours, spy):
    """Same logs, same weights bit for bit, finite, moved by training; tool results got no advantage."""
    for key in (
        "reward",
        "loss",
        "tools/call_frequency",
        "tools/failure_frequency",
        "completions/clipped_ratio",
    ):
        assert _logged(grpo, key) == _logged(ours, key), key
    want, got = _weights(grpo), _weights(ours)
    assert all(torch.equal(got[n], w) for n, w in want.items())
    assert all(torch.isfinite(w).all() for w in got.values())
    assert any(math.isfinite(loss) and loss != 0 for loss in _logged(ours, "loss")), "no update: vacuous"
    assert any(bool((b.tool_mask == 0).any()) for b in spy.batches)
    for batch, advantages in zip(spy.batches, spy.advantages, strict=True):
        assert not advantages[batch.completion_mask.bool() & ~batch.tool_mask.bool()].any()


def _pair(tmp_path, environment_factory, **config):
    """Both trainers trained on the same seed (``environment_factory`` is called once per trainer)."""
    grpo = _trainer("grpo", tmp_path, environment_factory(), **config)
    grpo.train()
    ours = _trainer("ours", tmp_path, environment_factory(), **config)
    spy = Spy(ours)
    ours.train()
    return grpo, ours, spy


def test_a_tool_that_raises_becomes_an_error_result_counted_as_a_failure(scripted_turns, tmp_path):
    """As in TRL: the exception is caught, the model sees ``{'error': '...'}`` as the tool result (masked out of the
    loss), the call counts in ``tools/failure_frequency``, and the episode goes on; nothing stops."""
    grpo, ours, spy = _pair(tmp_path, lambda: FlakyAct)
    _check_same_training(grpo, ours, spy)
    # One failed call per episode, of 4 calls each (the crashed turn is played again): a failure rate of 1/4.
    assert _logged(ours, "tools/failure_frequency") == [0.25, 0.25]
    assert _logged(ours, "tools/call_frequency") == [4.0, 4.0]
    for ids, tool_mask in _completions(spy):
        results = TOKENIZER.decode([t for t, m in zip(ids, tool_mask, strict=True) if not m])
        assert results.count("{'error': 'the simulator crashed'}") == 1
        assert "turn 3/3" in results  # the episode still played all its turns
    assert ours.state.global_step == SETTINGS["max_steps"]


@pytest.mark.parametrize("estimator", ["rloo", "gae"])
def test_rloo_and_gae_train_through_a_failing_tool_with_finite_weights(scripted_turns, tmp_path, estimator):
    trainer = _trainer("ours", tmp_path, FlakyAct, estimator=estimator)
    spy = Spy(trainer)
    trainer.train()
    assert trainer.state.global_step == SETTINGS["max_steps"]
    assert _logged(trainer, "tools/failure_frequency") == [0.25, 0.25]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(loss) for loss in _logged(trainer, "loss"))
    for batch, advantages in zip(spy.batches, spy.advantages, strict=True):
        assert torch.isfinite(advantages).all()
        assert not advantages[batch.completion_mask.bool() & ~batch.tool_mask.bool()].any()


def test_an_environment_whose_reset_raises_stops_training_with_its_own_error_before_the_update(
    scripted_turns, tmp_path
):
    """As in TRL: the ``reset`` error propagates unchanged from ``train()`` when the batch that meets it is drawn,
    before that step's update; the steps before it are kept (same weights as GRPO's, finite)."""
    per_batch = SETTINGS["per_device_train_batch_size"]
    errors, trainers = [], []
    for kind in ("grpo", "ours"):
        trainer = _trainer(
            kind, tmp_path, reset_fails_from_call(per_batch + 1)
        )  # the second batch's first reset
        with pytest.raises(ConnectionError, match="the environment server refused the connection") as err:
            trainer.train()
        errors.append((type(err.value), str(err.value)))
        trainers.append(trainer)
    grpo, ours = trainers
    assert errors[0] == errors[1]
    assert grpo.state.global_step == ours.state.global_step == 1
    want, got = _weights(grpo), _weights(ours)
    assert all(torch.equal(got[n], w) and torch.isfinite(w).all() for n, w in want.items())


def _first_call_length() -> int:
    """Tokens of an episode's first turn (an ``act`` call and its end of turn) plus its tool result as TRL's loop
    joins it: the template's rendering of the tool message and the next generation prompt."""
    from trl.chat_template_utils import get_training_chat_template

    sampler = ScriptedAgentSampler(KeyPolicy(0.5), TOKENIZER)
    env = AgentEnv()
    env.reset(**{k: v for k, v in make_agent_dataset(**DATA)[0].items() if k != "prompt"})
    call = {"type": "function", "function": {"name": "act", "arguments": {"choice": 0}}}
    conversation = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    # TRL renders with its prefix-preserving training variant of the template, so a turn renders the same whether
    # or not later messages follow it.
    template = get_training_chat_template(TOKENIZER)
    render = dict(tools=[env.act], chat_template=template, tokenize=True, return_dict=False)
    before = TOKENIZER.apply_chat_template(conversation, **render)
    before = before[: len(before) - before[::-1].index(TOKENIZER.eos_token_id)]  # through the end of turn
    after = TOKENIZER.apply_chat_template(
        [*conversation, {"role": "tool", "name": "act", "content": env.act(0)}],
        add_generation_prompt=True,
        **render,
    )
    return len(sampler.turn_ids(0)) + len(after) - len(before)


@pytest.mark.parametrize(
    ("kept", "call_runs"),
    [
        (3, False),  # '<tool_call>', '\n{"name": "act", "arguments": {"choice": ', the digit: no call parsed
        (5, True),  # ... '}}\n', '</tool_call>': a whole call parsed though its turn never ended
    ],
)
def test_an_episode_cut_inside_a_tool_call_is_truncated_as_trl_does(
    scripted_turns, tmp_path, kept, call_runs
):
    """``max_completion_length`` ends the episode ``kept`` tokens into its second tool call. As in TRL: the
    episode counts as clipped (``completions/clipped_ratio``) and is trained on with its reward. With the call's
    JSON whole (``kept=5``) TRL's parser reads a call and runs it, but its result does not fit, so it is dropped
    from the episode: the environment played the turn (its reward sees it), the text has no result for it."""
    length = _first_call_length() + kept
    grpo, ours, spy = _pair(tmp_path, lambda: AgentEnv, max_completion_length=length)
    _check_same_training(grpo, ours, spy)
    assert _logged(ours, "completions/clipped_ratio") == [1.0, 1.0]
    assert _logged(ours, "tools/call_frequency") == ([2.0, 2.0] if call_runs else [1.0, 1.0])
    assert _logged(ours, "tools/failure_frequency") == [0.0, 0.0]
    # The environments of the last batch: the cut call ran (kept=5) or not (kept=3), in both trainers alike.
    for trainer in (grpo, ours):
        assert {env.turn for env in trainer.environments} == ({2} if call_runs else {1})
    sampler = ScriptedAgentSampler(KeyPolicy(0.5), TOKENIZER)
    for ids, tool_mask in _completions(spy):
        assert len(ids) == length
        first, last = _model_spans(ids, tool_mask)  # the first call, whole; the second, cut
        assert first[-1] == TOKENIZER.eos_token_id and len(last) == kept
        assert any(last == list(sampler.turn_ids(c))[:kept] for c in range(4))
        assert tool_mask.count(0) == len(ids) - len(first) - kept  # one tool result: the first call's


def test_an_episode_stopped_by_max_tool_calling_iterations_keeps_its_unrun_call(scripted_turns, tmp_path):
    """``max_tool_calling_iterations=1``: as in TRL, the first call runs, the model's second turn (a whole call,
    ended by its end-of-turn token, so not clipped) stays in the episode without running, and the episode is graded
    as it stands (the environment has played one turn of three: ``get_reward`` 0)."""
    grpo, ours, spy = _pair(tmp_path, lambda: AgentEnv, max_tool_calling_iterations=1)
    _check_same_training(grpo, ours, spy)
    assert _logged(ours, "tools/call_frequency") == [1.0, 1.0]
    assert _logged(ours, "completions/clipped_ratio") == [0.0, 0.0]
    assert _logged(ours, "rewards/AgentEnv/mean") == [0.0, 0.0]
    for ids, tool_mask in _completions(spy):
        spans = _model_spans(ids, tool_mask)
        assert len(spans) == 2 and all(span[-1] == TOKENIZER.eos_token_id for span in spans)
        assert all(TOKENIZER.decode(span).startswith("<tool_call>") for span in spans)


class ScoreFails(AgentEnv):
    """``get_reward`` raises for an episode that ended in the bad state (a scorer with a missing table entry)."""

    def get_reward(self) -> float:
        if self.finished and self.state == BAD:
            raise KeyError("the score table has no entry for a bad final state")
        return super().get_reward()


def test_a_get_reward_that_raises_is_named_with_its_environment_and_row(scripted_turns, tmp_path):
    """TRL lets the ``get_reward`` error through as it is; mcadvantage raises a ``RewardFunctionError`` (a
    ``ValueError``) chained to it, naming the environment class (TRL's name for its reward column), the first row
    that fails alone and the fix. Both stop before that step's update, with the same weights."""
    from mcadvantage import RewardFunctionError

    grpo = _trainer("grpo", tmp_path, ScoreFails)
    with pytest.raises(KeyError, match="no entry for a bad final state"):
        grpo.train()
    ours = _trainer("ours", tmp_path, ScoreFails)
    with pytest.raises(RewardFunctionError) as err:
        ours.train()
    assert err.value.func_name == "ScoreFails" and isinstance(err.value.__cause__, KeyError)
    message = str(err.value)
    assert "reward function 'ScoreFails' raised KeyError: 'the score table has no entry" in message
    assert f"on row {err.value.row} of the training responses" in message and "Fix the function" in message
    # The named row is an episode that ended bad, in the batch that failed.
    env = ours.environments[err.value.row]
    assert env.finished and env.state == BAD
    assert all(e.state != BAD or not e.finished for e in ours.environments[: err.value.row])
    assert grpo.state.global_step == ours.state.global_step
    want, got = _weights(grpo), _weights(ours)
    assert all(torch.equal(got[n], w) and torch.isfinite(w).all() for n, w in want.items())


# ---------------------------------------------------------------------------------------------------------------
# Faults inside Monte Carlo continuations ("vineppo", "hybrid"): every state of an episode is continued K times
# through the tool loop, each continuation on its own environment rebuilt by reset and replay of the prefix's calls.
# The continuations are the scripted policy's too (``mc_sampler``), choosing the key half the time.
# ---------------------------------------------------------------------------------------------------------------


#: Monte Carlo settings: K = 2 continuations per state, one state per model turn (the turn boundaries).
def _one_turn(text: str) -> list[str]:
    """One step per model turn (module level, so picklable): the states are the turn boundaries."""
    return [text]


MC = dict(num_mc_rollouts=2, step_segmenter=_one_turn)


class Graded:
    """``key_share``, recording every call: GRPO's grading of the batch's episodes, then the estimator's grading of
    their continuations (one call per step each, in that order)."""

    __name__ = "key_share"  # TRL names the reward column after the function

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, completions, key, completion_ids, environments, **kwargs) -> list[float]:
        self.calls.append(
            dict(
                completions=[[dict(m) for m in c] for c in completions],
                lengths=[len(ids) for ids in completion_ids],
                turns=[env.turn for env in environments],
                environments=list(environments),
            )
        )
        return key_share(completions, key)

    @property
    def episodes(self) -> list[dict]:
        return self.calls[0::2]

    @property
    def continuations(self) -> list[dict]:
        return self.calls[1::2]


def _vine(tmp_path, environment, estimator="vineppo", **config):
    """A Monte Carlo trainer whose continuations are the scripted policy's (key half the time), with a recording
    reward function; returns ``(trainer, graded, continuation sampler)``."""
    graded = Graded()
    rollouts = ScriptedAgentSampler(KeyPolicy(0.5), TOKENIZER, seed=3)
    trainer = _trainer(
        "ours",
        tmp_path,
        environment,
        estimator,
        reward_funcs=[graded],
        mc_sampler=rollouts,
        **{**MC, **config},
    )
    return trainer, graded, rollouts


def _shape(messages) -> list[tuple[str, bool]]:
    """A conversation's shape: each message's role and whether it calls tools."""
    return [(m["role"], bool(m.get("tool_calls"))) for m in messages]


def _check_trained(trainer, initial):
    assert trainer.state.global_step == SETTINGS["max_steps"]
    weights = _weights(trainer)
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert any(not torch.equal(weights[n], w) for n, w in initial.items()), "no update: vacuous"
    assert all(math.isfinite(loss) for loss in _logged(trainer, "loss"))


@pytest.fixture
def key_turns(monkeypatch):
    """The episodes always choose the key (so they succeed, and their groups are degenerate for ``"hybrid"``); the
    continuations choose it half the time."""
    _script_turns(monkeypatch, KeyPolicy(1.0))


class CrashesOffTheKey(AgentEnv):
    """``act`` raises on a choice other than the key at the decisive turn, once per episode (a simulator that
    crashes on a bad move; the call is not played, so the policy calls again). The key-always episodes never meet
    it; their continuations, off the key half the time, do. It also holds a lock, so it cannot be copied: a
    continuation's environment is rebuilt by reset and replay, never forked."""

    def reset(self, **row):
        self.crashed = False
        self.lock = threading.Lock()
        return super().reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        with self.lock:
            if self.turn == self.task.decisive_turn and choice != self.task.key and not self.crashed:
                self.crashed = True
                raise RuntimeError("the simulator crashed")
            return super().act(choice)


def test_a_tool_that_raises_inside_a_continuation_gives_it_the_error_result_and_training_goes_on(
    key_turns, tmp_path
):
    """As in TRL's loop: the continuation's tool call that raises gets ``{'error': ...}`` as its result, the
    continuation goes on to the end of the episode and is graded; every continuation counts in ``mc/rollouts``,
    training takes both steps with finite weights. The episodes themselves never failed a call."""
    trainer, graded, rollouts = _vine(tmp_path, CrashesOffTheKey)
    initial = _weights(trainer)
    spy = Spy(trainer)
    trainer.train()
    _check_trained(trainer, initial)
    assert _logged(trainer, "tools/failure_frequency") == [0.0, 0.0]  # the episodes' own calls all ran
    assert len(graded.calls) == 2 * SETTINGS["max_steps"]
    states = 4 * SETTINGS["per_device_train_batch_size"]  # 3 calls and the answer: 4 turns per episode
    assert _logged(trainer, "mc/states") == [float(states)] * 2
    # Identical states (the group's shared first state, at least) are estimated once: K continuations each.
    unique = [round(states * (1 - r)) for r in _logged(trainer, "mc/dedup_ratio")]
    assert all(u < states for u in unique)
    assert [len(c["turns"]) for c in graded.continuations] == [MC["num_mc_rollouts"] * u for u in unique]
    assert _logged(trainer, "mc/rollouts") == [float(MC["num_mc_rollouts"] * u) for u in unique]
    crashed = 0
    for call in graded.continuations:
        for messages, turns in zip(call["completions"], call["turns"], strict=True):
            errors = [m for m in messages if m["role"] == "tool" and "the simulator crashed" in m["content"]]
            assert len(errors) <= 1
            crashed += len(errors)
            assert turns == DATA["horizon"]  # went on after the error: every turn played, then graded
            if errors:
                assert errors[0]["content"] == "{'error': 'the simulator crashed'}"
    assert crashed > 0, "no continuation met the failing tool: vacuous"
    # The engine saw the error result in the continuations' contexts, as the model reads it in TRL's loop.
    contexts = [TOKENIZER.decode(r.prefix_ids) for requests in rollouts.calls for r in requests]
    assert any("{'error': 'the simulator crashed'}" in text for text in contexts)
    for batch, advantages in zip(spy.batches, spy.advantages, strict=True):
        assert torch.isfinite(advantages).all()
        assert not advantages[batch.completion_mask.bool() & ~batch.tool_mask.bool()].any()
    with pytest.raises(TypeError):  # the environment cannot be forked; replay rebuilt it
        copy.deepcopy(graded.continuations[0]["environments"][0])


def _refused_before_any_update(trainer, initial):
    """Training stopped in its first batch, before any update: global step 0, the initial weights."""
    assert trainer.state.global_step == 0
    weights = _weights(trainer)
    assert all(torch.equal(weights[n], w) for n, w in initial.items())


@pytest.mark.parametrize("estimator", ["vineppo", "hybrid"])
def test_an_environment_whose_reset_raises_on_replay_is_named_before_any_update(
    key_turns, tmp_path, estimator
):
    """``reset`` succeeds for the batch's episodes, then raises when a continuation's environment is rebuilt: an
    ``EnvironmentReplayError`` chained to the environment's own error, naming the class, the episode (its batch row
    and dataset row) and the fix, before the step's update. (TRL's loop never resets twice for one episode.)"""
    from mcadvantage import EnvironmentReplayError

    per_batch = SETTINGS["per_device_train_batch_size"]
    config = {"hybrid_budget": 50.0} if estimator == "hybrid" else {}
    trainer, _, _ = _vine(tmp_path, reset_fails_from_call(per_batch + 1), estimator, **config)
    initial = _weights(trainer)
    with pytest.raises(EnvironmentReplayError) as err:
        trainer.train()
    assert isinstance(err.value.__cause__, ConnectionError)
    assert err.value.environment == "ResetFails" and err.value.round is None
    message = str(err.value)
    assert message.startswith(
        f"environment ResetFails ({err.value.where}, dataset row {{'structure': 'recovery'"
    )
    assert re.fullmatch(r"batch row \d", err.value.where)
    if estimator == "vineppo":
        assert err.value.where == "batch row 0"  # the first episode's first state is rebuilt first
    assert "reset(**row) raised ConnectionError: the environment server refused the connection" in message
    assert "advantage_estimator='grpo'" in message  # the fix
    _refused_before_any_update(trainer, initial)


#: The simulator behind :class:`Upgraded`, which the test upgrades between playing a batch and continuing it.
SIMULATOR = {"version": 1}


class Upgraded(AgentEnv):
    """``act``'s last-turn result names the simulator's version (outside state): replaying an episode after the
    simulator was upgraded diverges at its third round."""

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        result = super().act(choice)
        return f"{result} v{SIMULATOR['version']}" if self.finished else result


class SelfSeeded(AgentEnv):
    """Seeds its noise from the operating system at ``reset`` (an unseeded simulator): no replay reproduces an
    episode's tool results."""

    def reset(self, **row):
        self.noise = random.Random(random.SystemRandom().getrandbits(64))
        return super().reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        return f"{super().act(choice)} wind={self.noise.random():.6f}"


@pytest.mark.parametrize(
    ("environment", "diverges_at"),
    [(Upgraded, 2), (SelfSeeded, 0)],
    ids=["outside-state", "unseeded-random"],
)
def test_a_replay_that_diverges_is_named_before_any_update(
    key_turns, tmp_path, monkeypatch, environment, diverges_at
):
    """An environment that does not replay (its tool results depend on outside state or on an unseeded random):
    the continuations' replay meets a tool result other than the recorded one, and training stops with an
    ``EnvironmentReplayError`` naming the class, the round, both results and the fix, before any update."""
    from mcadvantage import EnvironmentReplayError

    monkeypatch.setitem(SIMULATOR, "version", 1)
    trainer, _, _ = _vine(tmp_path, environment)
    played = trainer.compute_advantages

    def upgrade_then_estimate(batch):
        SIMULATOR["version"] += 1  # the episodes were played; the simulator changes before they are continued
        return played(batch)

    trainer.compute_advantages = upgrade_then_estimate
    initial = _weights(trainer)
    with pytest.raises(EnvironmentReplayError) as err:
        trainer.train()
    assert (err.value.environment, err.value.round, err.value.where) == (
        environment.__name__,
        diverges_at,
        "batch row 0",
    )
    message = str(err.value)
    assert message.startswith(f"environment {environment.__name__} (batch row 0, dataset row {{'structure'")
    assert f"replaying tool round {diverges_at} " in message
    assert "but the episode recorded" in message
    assert "seed any randomness from a row column, keep no outside state" in message  # the fix
    _refused_before_any_update(trainer, initial)


class DrawnTarget(AgentEnv):
    """``reset`` shows a target drawn from an unseeded random (the probe's "Target 0" whose replays drew 2, 1, 3):
    every tool result replays, only the observation differs."""

    def reset(self, **row):
        return f"{super().reset(**row)} target={random.SystemRandom().randrange(10**9)}"


class HiddenLuck(AgentEnv):
    """Draws hidden luck at ``reset`` that no observation or tool result shows, and exposes it as its
    ``state_key``: only the key tells a rebuild from the episode."""

    def reset(self, **row):
        self._luck = random.SystemRandom().randrange(10**9)
        return super().reset(**row)

    @property
    def state_key(self):
        return (self.turn, self.state, self._luck)


@pytest.mark.parametrize(
    ("environment", "said"),
    [(DrawnTarget, "reset(**row) returned"), (HiddenLuck, "state_key after reset(**row) is (0, ")],
    ids=["random-observation", "hidden-state-key"],
)
def test_a_rebuild_whose_observation_or_state_key_differs_is_refused_before_any_update(
    key_turns, tmp_path, environment, said
):
    """Rebuilds are checked beyond the tool results: ``reset``'s observation against the episode's prompt, and an
    environment's ``state_key`` against the keys its episode went through (recorded by the trainer at every model
    turn of GRPO's tool loop: hidden luck drawn at ``reset`` shows in the key after ``reset``). Either mismatch stops
    training with an ``EnvironmentReplayError`` (importable from ``mcadvantage``) naming the class, the episode and
    both values, before any update: never trained on silently."""
    from mcadvantage import EnvironmentReplayError

    trainer, _, _ = _vine(tmp_path, environment)
    initial = _weights(trainer)
    with pytest.raises(EnvironmentReplayError) as err:
        trainer.train()
    message = str(err.value)
    assert err.value.environment == environment.__name__ and err.value.where.startswith("batch row ")
    assert message.startswith(
        f"environment {environment.__name__} ({err.value.where}, dataset row {{'structure'"
    )
    assert said in message and "but the episode" in message
    _refused_before_any_update(trainer, initial)


#: Never reset: every second round of an episode, played or replayed, takes the next tick.
TICKS = itertools.count(1)


class StampedMidway(AgentEnv):
    """Hidden state that only its ``state_key`` shows, and only in the middle of an episode: its second tool round
    stamps the instance with the next tick of a global counter (never reset, so a replay gets another tick), its
    third clears the stamp. The observation, every tool result and the key the episode ends with replay exactly;
    only the key after round 1 differs."""

    def reset(self, **row):
        self._stamp = 0
        return super().reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        result = super().act(choice)
        self._stamp = next(TICKS) if self.turn == 2 else 0
        return result

    @property
    def state_key(self):
        return (self.turn, self.state, self._stamp)


def test_a_state_key_that_differs_only_after_a_middle_round_is_refused_naming_that_round(key_turns, tmp_path):
    """The trainer records an environment's ``state_key`` at every model turn of GRPO's tool loop, and a rebuild
    checks it after every replayed round: an environment whose hidden state differs on replay only after its
    second round (the episode's final key replays exactly, so a check of the final key alone trains on it
    silently) stops training with an ``EnvironmentReplayError`` naming the episode, round 1 and both keys, before
    any update."""
    from mcadvantage import EnvironmentReplayError

    trainer, _, _ = _vine(tmp_path, StampedMidway)
    initial = _weights(trainer)
    with pytest.raises(EnvironmentReplayError) as err:
        trainer.train()
    assert (err.value.environment, err.value.round) == ("StampedMidway", 1)
    assert re.fullmatch(r"batch row \d", err.value.where)
    message = str(err.value)
    assert message.startswith(f"environment StampedMidway ({err.value.where}, dataset row {{'structure'")
    keys = re.search(
        r"state_key after replaying tool round 1 is \(2, (\d), (\d+)\), but the episode's was \(2, \1, (\d+)\)",
        message,
    )
    assert keys is not None, message
    assert keys.group(2) != keys.group(3)  # the replay's tick and the episode's
    _refused_before_any_update(trainer, initial)


def _train_recording_episodes(trainer) -> list:
    """Train ``trainer`` (checking it trained) and return every episode its continuations were handed."""
    seen, context = [], trainer.agents.context

    def recorded(batch):
        seen.append(context(batch))
        return seen[-1]

    trainer.agents.context = recorded
    initial = _weights(trainer)
    trainer.train()
    _check_trained(trainer, initial)
    episodes = [e for out in seen for e in out.episodes]
    assert len(episodes) == SETTINGS["max_steps"] * SETTINGS["per_device_train_batch_size"]
    return episodes


def test_a_deterministic_environment_with_a_state_key_has_every_round_checked_and_trains(key_turns, tmp_path):
    """The testbed's deterministic ``AgentEnv`` (``state_key`` = (turns played, state)): every episode handed to
    the continuations carries its key after ``reset`` and after each of its tool rounds, equal to a fresh rebuild's
    key there, and training runs through the checks."""
    from mcadvantage.agents.rebuild import recorded_tool_turns, replay_environment

    trainer, _, _ = _vine(tmp_path, AgentEnv)
    assert trainer.agents.records_episode_keys()
    episodes = _train_recording_episodes(trainer)
    for episode in episodes:
        turns = recorded_tool_turns(episode.messages)
        assert len(turns) == DATA["horizon"]  # the key every time: every turn played
        assert sorted(episode.state_keys) == list(range(len(turns) + 1))
        for r, key in episode.state_keys.items():
            assert key[0] == r
            assert replay_environment(AgentEnv, episode.row, turns[:r]).state_key == key


class Keyless:
    """The testbed's game without a ``state_key`` (it wraps :class:`AgentEnv`, so the property is not inherited)."""

    def __init__(self) -> None:
        self._game = AgentEnv()

    def reset(self, **row):
        return self._game.reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        return self._game.act(choice)

    def get_reward(self) -> float:
        return self._game.get_reward()

    @property
    def turn(self) -> int:
        return self._game.turn


def test_an_environment_without_a_state_key_trains_with_no_keys_recorded(key_turns, tmp_path):
    """No ``state_key``: nothing is recorded or read (no AttributeError), the episodes carry no keys, and the
    rebuilds are checked by observation and tool results alone, as before."""
    trainer, _, _ = _vine(tmp_path, Keyless)
    assert not trainer.agents.records_episode_keys()
    episodes = _train_recording_episodes(trainer)
    assert all(episode.state_keys == {} for episode in episodes)


def test_a_continuation_stops_at_max_tool_calling_iterations_counting_the_prefixs_rounds(
    scripted_turns, tmp_path
):
    """``max_tool_calling_iterations=1``: as the episode in TRL's loop, a continuation runs tool rounds until the
    episode holds one (the prefix's round counts), keeps its next call unrun, stops and is graded: from the episode's
    start it runs its first call; from the state after the episode's round it runs none. Every continuation ends
    the shape of its episode, with one turn played."""
    trainer, graded, rollouts = _vine(tmp_path, AgentEnv, max_tool_calling_iterations=1)
    initial = _weights(trainer)
    trainer.train()
    _check_trained(trainer, initial)
    k, per_batch = MC["num_mc_rollouts"], SETTINGS["per_device_train_batch_size"]
    episode_shape = [("assistant", True), ("tool", False), ("assistant", True)]
    for call in graded.episodes:
        assert [_shape(c) for c in call["completions"]] == [episode_shape] * per_batch
    drawn = []
    for call in graded.continuations:  # 2 states per episode (its two turns), K each per unique state
        n = len(call["completions"])
        # The episodes share their first state (one prompt): estimated once, so fewer than 2 K per episode.
        assert n % k == 0 and 2 * k <= n < 2 * k * per_batch
        assert [_shape(c) for c in call["completions"]] == [episode_shape] * n
        assert call["turns"] == [1] * n
        drawn.append(n)
    # Engine calls per step: every continuation's first turn, then only those from an episode's start (whose call
    # ran): K per distinct first state (one per prompt).
    calls = [len(requests) for requests in rollouts.calls]
    assert calls[::2] == drawn and all(
        m % k == 0 and k <= m < n for m, n in zip(calls[1::2], drawn, strict=True)
    )
    assert _logged(trainer, "mc/rollouts") == [float(n) for n in drawn]


@pytest.mark.parametrize(("kept", "call_runs"), [(3, False), (5, True)])
def test_a_continuation_cut_inside_a_tool_call_is_truncated_as_trl_truncates_the_episode(
    scripted_turns, tmp_path, kept, call_runs
):
    """``max_completion_length`` ends the episodes ``kept`` tokens into their second tool call (see
    :func:`test_an_episode_cut_inside_a_tool_call_is_truncated_as_trl_does`), and their continuations at the same
    budget: every continuation is cut at the same length, parsed as TRL parsed the episode (the same messages'
    shape: with the JSON whole the cut call runs, its result dropped), its environment played the same turns, and
    it is graded; training goes on with finite weights."""
    length = _first_call_length() + kept
    trainer, graded, _ = _vine(tmp_path, AgentEnv, max_completion_length=length)
    initial = _weights(trainer)
    trainer.train()
    _check_trained(trainer, initial)
    assert _logged(trainer, "completions/clipped_ratio") == [1.0, 1.0]
    k, per_batch = MC["num_mc_rollouts"], SETTINGS["per_device_train_batch_size"]
    turns = 2 if call_runs else 1
    for episodes, continuations in zip(graded.episodes, graded.continuations, strict=True):
        shapes = {tuple(_shape(c)) for c in episodes["completions"]}
        assert len(shapes) == 1 and set(episodes["turns"]) == {turns}
        n = len(continuations["completions"])  # 2 states per episode, K each; the shared first state once
        assert n % k == 0 and 2 * k <= n < 2 * k * per_batch
        assert {tuple(_shape(c)) for c in continuations["completions"]} == shapes
        assert set(continuations["lengths"]) == {length}
        assert set(continuations["turns"]) == {turns}


# ---------------------------------------------------------------------------------------------------------------
# Issue 59: the environment contract fails loudly, never silently: forks checked, unreseeded randomness caught, a
# broken state_key reported under every estimator, dropped tool results counted under every estimator.
# ---------------------------------------------------------------------------------------------------------------

ESTIMATOR_CONFIG = {
    "grpo": {},
    "rloo": {},
    "anchor": {},
    "vineppo": MC,
    "hybrid": {**MC, "hybrid_budget": 50.0},
}


def _any_estimator(tmp_path, environment, estimator, **config):
    """A trainer of ``estimator`` on the scripted episodes (Monte Carlo continuations scripted too)."""
    if estimator in ("vineppo", "hybrid"):
        return _vine(tmp_path, environment, estimator, **{**ESTIMATOR_CONFIG[estimator], **config})[0]
    return _trainer("ours", tmp_path, environment, estimator, **config)


class ShallowFork(AgentEnv):
    """Keeps its moves in a list and forks with ``copy.copy(self)``: every fork shares the list with the
    environment it was forked from (the issue's example: a start state's value came out 1.0 instead of 0.5)."""

    def reset(self, **row):
        self.moves = []
        return super().reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        self.moves.append(choice)
        return super().act(choice)

    def _fork(self):
        return copy.copy(self)


class DeepFork(ShallowFork):
    def _fork(self):
        return copy.deepcopy(self)


def test_a_fork_that_shares_state_with_its_source_is_refused_naming_fork_and_deepcopy(key_turns, tmp_path):
    """A fork is checked as a replay is: ``copy.copy(self)`` shares the ``moves`` list with the environment it was
    forked from, so training stops before any update with an ``EnvironmentContractError`` naming the class,
    ``_fork``, the shared attribute and the fix (``copy.deepcopy``); nothing is trained on silently."""
    trainer, _, _ = _vine(tmp_path, ShallowFork)
    initial = _weights(trainer)
    with pytest.raises(RuntimeError) as err:  # silently trained on before issue 59
        trainer.train()
    assert type(err.value).__name__ == "EnvironmentContractError", err.value
    message = str(err.value)
    assert err.value.environment == "ShallowFork" and err.value.where.startswith("batch row ")
    assert "_fork() returned a copy that shares mutable state" in message and "(.moves)" in message
    assert "copy.deepcopy(self)" in message
    _refused_before_any_update(trainer, initial)


def test_a_deep_copy_fork_trains(key_turns, tmp_path):
    """The same environment forking with ``copy.deepcopy(self)`` passes every check and trains."""
    trainer, _, _ = _vine(tmp_path, DeepFork)
    initial = _weights(trainer)
    trainer.train()
    _check_trained(trainer, initial)


class Windy(AgentEnv):
    """Seeds a random generator from the row at ``reset`` (as the contract asks) and draws from it in every tool
    call, but has no ``_reseed``: a rebuild replays the episode's stream exactly, so every continuation would meet
    the episode's own wind."""

    def reset(self, **row):
        self._rng = random.Random(f"{row['structure']}-{row['key']}")
        return super().reset(**row)

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        return f"{super().act(choice)} wind={self._rng.random():.6f}"


class ReseededWindy(Windy):
    def _reseed(self, seed: int) -> None:
        self._rng = random.Random(seed)


def test_randomness_drawn_after_a_rebuild_without_reseed_is_refused_naming_reseed(key_turns, tmp_path):
    """Issue 59: every replay of a row-seeded random environment is exact, so nothing else catches it; its
    continuations draw from the replayed stream, which is refused before any update, naming the generator,
    ``_reseed`` and an example."""
    trainer, _, _ = _vine(tmp_path, Windy)
    initial = _weights(trainer)
    with pytest.raises(RuntimeError) as err:  # silently trained on before issue 59
        trainer.train()
    assert type(err.value).__name__ == "EnvironmentContractError", err.value
    message = str(err.value)
    assert err.value.environment == "Windy"
    assert "drew from the random generator ._rng after its environment was rebuilt" in message
    assert (
        "has no _reseed(seed)" in message
        and "def _reseed(self, seed: int): self._rng = random.Random(seed)" in message
    )
    _refused_before_any_update(trainer, initial)


def test_a_reseeded_random_environment_trains_with_fresh_luck_per_continuation(key_turns, tmp_path):
    """With ``_reseed`` the same environment trains; its continuations drew other winds than their episodes."""
    trainer, graded, _ = _vine(tmp_path, ReseededWindy)
    initial = _weights(trainer)
    trainer.train()
    _check_trained(trainer, initial)
    winds = {
        m["content"].split("wind=")[1]
        for call in graded.continuations
        for messages in call["completions"]
        for m in messages
        if m["role"] == "tool" and "wind=" in m["content"]
    }
    episode_winds = {
        m["content"].split("wind=")[1]
        for call in graded.episodes
        for messages in call["completions"]
        for m in messages
        if m["role"] == "tool" and "wind=" in m["content"]
    }
    assert winds - episode_winds, "every continuation met the episodes' own wind"


class TypoKey(AgentEnv):
    """A ``state_key`` with a typo: reading it raises ``AttributeError`` (it used to switch the check off)."""

    @property
    def state_key(self):
        return (self._turnn, self.state)


@pytest.mark.parametrize("estimator", sorted(ESTIMATOR_CONFIG))
def test_a_state_key_that_raises_is_an_error_under_every_estimator(scripted_turns, tmp_path, estimator):
    trainer = _any_estimator(tmp_path, TypoKey, estimator)
    initial = _weights(trainer)
    with pytest.raises(RuntimeError) as err:  # silently trained on before issue 59
        trainer.train()
    assert type(err.value).__name__ == "EnvironmentContractError", err.value
    message = str(err.value)
    assert message.startswith(
        "environment TypoKey (local episode 0): reading its state_key raised AttributeError"
    )
    assert "_turnn" in message and isinstance(err.value.__cause__, AttributeError)
    _refused_before_any_update(trainer, initial)


class MethodKey(AgentEnv):
    def state_key(self):  # a method: TRL would offer it to the model as a tool
        return (self.turn, self.state)


@pytest.mark.parametrize("estimator", sorted(ESTIMATOR_CONFIG))
def test_a_state_key_method_is_refused_under_every_estimator(scripted_turns, tmp_path, estimator):
    with pytest.raises(
        TypeError, match=r"MethodKey.state_key is a function, not a property.*Declare it with @property"
    ):
        _any_estimator(tmp_path, MethodKey, estimator)


@pytest.mark.parametrize("estimator", sorted(ESTIMATOR_CONFIG))
def test_dropped_tool_results_are_counted_and_warned_under_every_estimator(
    scripted_turns, tmp_path, monkeypatch, estimator
):
    """An episode whose second call ran but whose result did not fit (``max_completion_length`` cuts it): the
    metric ``tools/dropped_results`` counts the batch's episodes so ended and the warning names the cause, under
    every estimator (it is a property of the episodes, not of Monte Carlo)."""
    from mcadvantage.agents import rebuild

    monkeypatch.setattr(rebuild, "_DROPPED_WARNED", [False])  # warned once per process: not yet
    trainer = _any_estimator(tmp_path, AgentEnv, estimator, max_completion_length=_first_call_length() + 5)
    with pytest.warns(
        RuntimeWarning, match=r"had their results dropped because they would pass max_completion_length"
    ):
        trainer.train()
    assert _logged(trainer, "tools/dropped_results") == [float(SETTINGS["per_device_train_batch_size"])] * 2
