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
"""

from __future__ import annotations

import math

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


@pytest.fixture
def scripted_turns(monkeypatch):
    """Every turn of every episode is the scripted policy's (a fresh ``ScriptedAgentSampler(seed=1)`` per trainer, so
    both trainers play the same episodes), with the budget TRL gives a turn (``max_completion_length``)."""
    from trl import GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")

    def turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if "_scripted" not in self.__dict__:
            self._scripted = ScriptedAgentSampler(KeyPolicy(0.5), self.processing_class, seed=1)
        # prompt_ids holds each prompt num_generations times already (GRPO's sampler repeats them).
        return self._scripted.generate(prompt_ids, self.args.max_completion_length), None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", turn)


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


def _trainer(kind: str, tmp_path, environment, estimator="grpo", **config):
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
        reward_funcs=[key_share],  # a fresh list: GRPO appends the environment's get_reward to it
        args=args,
        train_dataset=make_agent_dataset(**DATA),
        processing_class=TOKENIZER,
        environment_factory=environment,
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
