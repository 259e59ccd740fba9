"""Tools, environments and ``rollout_func`` under the reward-only estimators: ``VinePPOTrainer`` with
``advantage_estimator="grpo"`` trains to the same weights, bit for bit, as ``trl.GRPOTrainer`` on the same seed
(issue 39, stage 1), and ``"rloo"`` / ``"gae"`` train on the same episodes with finite weights.

The policy is the tiny random Llama with a real tool-calling chat template (:func:`~mcadvantage.testing.
build_tool_calling_tokenizer`). A random model almost never writes a well-formed tool call, so the episodes are
scripted at one point only: the first turn of an episode is, with probability 1/2 (drawn from torch's global
generator, so both trainers draw the same), a tool call ``add(a, b)`` with random digits, and otherwise the model's
own sample; every turn after a tool result is the model's own sample. Everything else (TRL's tool loop, the
tool-result tokens inside the completion with ``tool_mask`` 0, environments, ``get_reward``, the loss) is the real
code path, and the tests check the loop ran (TRL's ``tools/call_frequency``).
"""

from __future__ import annotations

import json
import math
import re

import pytest

torch = pytest.importorskip("torch")

from _helpers import TINY_CPU_SETTINGS  # noqa: E402
from datasets import Dataset  # noqa: E402

from mcadvantage.testing import IM_END, build_tiny_llama, build_tool_calling_tokenizer  # noqa: E402

IM_END_ID = build_tool_calling_tokenizer().convert_tokens_to_ids(IM_END)

#: Settings shared by both trainers: everything a tiny CPU run needs, nothing that differs between GRPOConfig and
#: VinePPOConfig defaults.
SETTINGS = TINY_CPU_SETTINGS | dict(
    num_generations=2,
    max_completion_length=160,
    max_steps=2,
    learning_rate=0.05,
    logging_steps=1,
    disable_tqdm=True,
    # The model's own samples stay short (a random model rarely ends a turn): EOS is favoured by a fixed logit
    # bias, the same sampling for both trainers. The token id is the tool tokenizer's <|im_end|>.
    generation_kwargs={"sequence_bias": [[[IM_END_ID], 3.0]]},
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def vowel_share(completions, **kwargs) -> list[float]:
    """Share of vowels in an episode's last assistant message (a dense reward so the groups differ)."""
    out = []
    for messages in completions:
        text = next((m.get("content") or "" for m in reversed(messages) if m["role"] == "assistant"), "")
        out.append(sum(c in "aeiou" for c in text) / max(len(text), 1))
    return out


class Adder:
    """An environment whose tool is ``add``; it owns part of the reward: 1 when the episode called its tool."""

    def reset(self, **row):
        self.calls: list[tuple[int, int]] = []
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls.append((a, b))
        return a + b

    def get_reward(self) -> float:
        return float(bool(self.calls))


class Doubler:
    """A second environment (for a dict ``environment_factory``): its tool is ``double``, it owns no reward."""

    def reset(self, **row):
        self.seen = row.get("prompt")
        return "Use the tool."

    def double(self, a: int) -> int:
        """Double an integer.

        Args:
            a: The integer.
        """
        return 2 * a


def called_tools(environments, **kwargs) -> list[float]:
    """A reward function that reads the episodes' environments (``environments=``, as GRPO passes them)."""
    return [float(len(getattr(env, "calls", []))) for env in environments]


def _tool_call_text(names_in_prompt: str) -> str:
    """A well-formed Qwen tool call to a tool the prompt offers, with random digits (torch's generator)."""
    a, b = (int(x) for x in torch.randint(0, 10, (2,)))
    if '"name": "double"' in names_in_prompt:
        call = {"name": "double", "arguments": {"a": a}}
    else:
        call = {"name": "add", "arguments": {"a": a, "b": b}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>{IM_END}"


@pytest.fixture
def scripted_first_turn(monkeypatch):
    """Patch ``GRPOTrainer._generate_single_turn`` (for both trainers): the first turn of an episode calls a tool
    with probability 1/2, else it and every later turn is the model's own sample."""
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_single_turn

    def turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        texts = [tok.decode(ids) for ids in prompt_ids]
        first = ["<tool_response>" not in t for t in texts]
        calls = [f and bool(torch.rand(()) < 0.5) for f in first]
        sampled_rows = [i for i, c in enumerate(calls) if not c]
        sampled, _ = (
            original(self, [prompt_ids[i] for i in sampled_rows], None, {}, 1) if sampled_rows else ([], None)
        )
        by_row = dict(zip(sampled_rows, sampled, strict=True))
        out = [
            tok(_tool_call_text(texts[i]), add_special_tokens=False)["input_ids"] if c else list(by_row[i])
            for i, c in enumerate(calls)
        ]
        return out, None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", turn)


def _train(trainer_cls, config_cls, tmp_path, extra_config=None, spies=None, **trainer_kwargs):
    tok = build_tool_calling_tokenizer()
    model = _tiny_model(tok)
    args = config_cls(output_dir=str(tmp_path / trainer_cls.__name__), **SETTINGS, **(extra_config or {}))
    trainer = trainer_cls(model=model, args=args, processing_class=tok, **trainer_kwargs)
    if spies is not None:
        spies.append(_Spy(trainer))
    trainer.train()
    return trainer


def _tiny_model(tok):
    """Smaller than the default tiny Llama: prompts with a tool schema are ~700 tokens, and the tests train twice."""
    return build_tiny_llama(
        tok,
        hidden_size=64,
        num_layers=1,
        num_heads=2,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=1024,
    )


def _prompts(n=2, **columns):
    prompts = [[{"role": "user", "content": f"What is {i} + {i + 1}?"}] for i in range(n)]
    return Dataset.from_dict({"prompt": prompts, **columns})


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _logged(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


def scripted_rollout(prompts, trainer):
    """A ``rollout_func`` (TRL's contract): per prompt, a few model tokens, an environment observation (``env_mask``
    0), a few more model tokens and EOS; random ids from torch's generator, so both trainers get the same."""
    tok = trainer.processing_class
    observation = tok("[obs: 42]", add_special_tokens=False)["input_ids"]
    prompt_ids, completion_ids, env_mask = tok(text=list(prompts))["input_ids"], [], []
    for _ in prompts:
        before, after = (torch.randint(4, 90, (int(n),)).tolist() for n in torch.randint(2, 8, (2,)))
        completion_ids.append(before + observation + after + [tok.eos_token_id])
        env_mask.append([1] * len(before) + [0] * len(observation) + [1] * (len(after) + 1))
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": None,
        "env_mask": env_mask,
    }


def _case(name: str) -> dict:
    """Trainer arguments of one case, built fresh for each trainer (GRPOTrainer appends an environment's
    ``get_reward`` to the ``reward_funcs`` list it is given)."""
    if name == "tools":
        return dict(reward_funcs=[vowel_share], tools=[add], train_dataset=_prompts())
    if name == "environment":
        # reward_funcs=None: the environment's get_reward is the only reward source.
        return dict(reward_funcs=None, environment_factory=Adder, train_dataset=_prompts())
    if name == "environment dict":
        # Two environments, routed by the rows' "environment" column; Adder's get_reward (NaN for Doubler's
        # episodes) plus a reward function that reads environments=.
        return dict(
            reward_funcs=[vowel_share, called_tools],
            environment_factory={"adder": Adder, "doubler": Doubler},
            train_dataset=_prompts(environment=["adder", "doubler"]),
        )
    assert name == "rollout_func"
    return dict(
        reward_funcs=[vowel_share_text],
        rollout_func=scripted_rollout,
        train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2="]}),
    )


def vowel_share_text(completions, **kwargs) -> list[float]:
    """:func:`vowel_share` for plain-text completions."""
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


CASES = ["tools", "environment", "environment dict", "rollout_func"]


class _Spy:
    """Records what the estimator was given and what went to the loss (``compute_advantages`` is the public hook)."""

    def __init__(self, trainer):
        self.batches, self.advantages = [], []
        hook = trainer.compute_advantages

        def compute(batch):
            out = hook(batch)
            self.batches.append(batch)
            self.advantages.append(out)
            return out

        trainer.compute_advantages = compute

    def check_tool_tokens_get_no_credit(self):
        """Some completion held tool/environment tokens (``tool_mask`` 0), and none of them got an advantage."""
        assert any(b.tool_mask is not None and bool((b.tool_mask == 0).any()) for b in self.batches)
        for batch, advantages in zip(self.batches, self.advantages, strict=True):
            outside = batch.completion_mask.bool() & ~batch.tool_mask.bool()
            assert not advantages[outside].any()


@pytest.mark.parametrize("case", CASES)
def test_grpo_estimator_trains_tool_and_environment_episodes_bit_identically_to_grpo_trainer(
    scripted_first_turn, tmp_path, case
):
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    grpo = _train(GRPOTrainer, GRPOConfig, tmp_path, **_case(case))
    spies = []
    ours = _train(
        VinePPOTrainer, VinePPOConfig, tmp_path, {"advantage_estimator": "grpo"}, spies=spies, **_case(case)
    )
    assert grpo.state.global_step == ours.state.global_step == SETTINGS["max_steps"]
    if case != "rollout_func":  # the tool loop ran, identically in both, and no call failed
        calls = _logged(grpo, "tools/call_frequency")
        assert calls == _logged(ours, "tools/call_frequency") and sum(calls) > 0
        assert set(_logged(ours, "tools/failure_frequency")) == {0.0}
    spies[0].check_tool_tokens_get_no_credit()
    for key in ("reward", "reward_std", "loss", "completions/mean_length"):
        assert _logged(grpo, key) == _logged(ours, key), key
    want, got = _weights(grpo.model), _weights(ours.model)
    moved = [n for n, w in want.items() if not torch.equal(w, _initial_weights()[n])]
    assert moved, "training moved no weight: the comparison would be vacuous"
    for name, value in want.items():
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize("estimator", ["rloo", "gae"])
def test_rloo_and_gae_train_environment_episodes_with_tool_tokens_left_out(
    scripted_first_turn, tmp_path, estimator
):
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    spies = []
    extra = {"advantage_estimator": estimator, "whiten_advantages": True, "scale_rewards": "none"}
    trainer = _train(VinePPOTrainer, VinePPOConfig, tmp_path, extra, spies=spies, **_case("environment dict"))
    assert trainer.state.global_step == SETTINGS["max_steps"]
    assert sum(_logged(trainer, "tools/call_frequency")) > 0
    spies[0].check_tool_tokens_get_no_credit()
    for batch, advantages in zip(spies[0].batches, spies[0].advantages, strict=True):
        # Whitened over the model's own tokens only: mean 0 there (the tool tokens' zeros do not count).
        loss_tokens = (batch.completion_mask * batch.tool_mask).bool()
        assert abs(float(advantages[loss_tokens].mean())) < 1e-5
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


@pytest.mark.parametrize("estimator", ["hybrid", "tree"])
def test_monte_carlo_estimators_refuse_rollout_func_naming_the_estimator_and_the_fix(tmp_path, estimator):
    """hybrid continues a user's rollout only through a continuation_func (as vineppo: with one, it trains:
    tests/trainer/test_continuation.py); tree draws its first turn in the trainer's own generation, which a
    rollout_func replaces."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    kwarg, value = "rollout_func", scripted_rollout
    tok = build_tool_calling_tokenizer()
    tree = {"tree_branching": [2]} if estimator == "tree" else {}  # groups of num_generations=2
    args = VinePPOConfig(output_dir=str(tmp_path), **{**SETTINGS, "advantage_estimator": estimator, **tree})
    why = "needs continuation_func= next to" if estimator == "hybrid" else "does not support"
    with pytest.raises(
        NotImplementedError, match=rf"advantage_estimator='{estimator}' {why} {kwarg}="
    ) as err:
        VinePPOTrainer(
            model=_tiny_model(tok), reward_funcs=[vowel_share], args=args, train_dataset=_prompts(),
            processing_class=tok, **{kwarg: value},
        )  # fmt: skip
    assert "advantage_estimator='grpo', 'rloo' or 'gae'" in str(err.value)


def test_prompt_lengths_are_checked_with_each_rows_environment_tools(tmp_path):
    """At construction, before any batch (when TRL has no per-batch environments yet), a prompt is measured as GRPO
    renders it: with its own environment's tool schema."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    tok = build_tool_calling_tokenizer()
    schema = len(tok.apply_chat_template([{"role": "user", "content": ""}], tools=[Adder().add], tokenize=True,
                                         add_generation_prompt=True, return_dict=True)["input_ids"])  # fmt: skip
    # Fits without the tool schema, not with it (context 1024, 160 positions kept for the completion).
    content = "x" * (1024 - 160 - schema + 10)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": content}]], "environment": ["adder"]})
    args = VinePPOConfig(output_dir=str(tmp_path), **{**SETTINGS, "advantage_estimator": "grpo"})
    with pytest.raises(
        ValueError, match=r"The prompt of train_dataset row 0 has \d+ tokens; with max_completion_length"
    ):
        VinePPOTrainer(
            model=_tiny_model(tok), reward_funcs=[vowel_share], args=args, train_dataset=data,
            processing_class=tok, environment_factory={"adder": Adder},
        )  # fmt: skip


def test_a_dict_of_environments_needs_the_environment_column(tmp_path):
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    tok = build_tool_calling_tokenizer()
    args = VinePPOConfig(output_dir=str(tmp_path), **{**SETTINGS, "advantage_estimator": "grpo"})
    with pytest.raises(
        ValueError, match=r"train_dataset has no 'environment' column .* environment_factory is a dict"
    ):
        VinePPOTrainer(
            model=_tiny_model(tok), reward_funcs=[vowel_share], args=args, train_dataset=_prompts(),
            processing_class=tok, environment_factory={"adder": Adder},
        )  # fmt: skip


def test_an_unknown_environment_is_refused_where_and_how_grpo_refuses_it(tmp_path):
    """GRPOTrainer refuses a row naming an environment that is not in a dict ``environment_factory`` at ``train()``;
    so does VinePPOTrainer (issue 59: it raised at construction, from its prompt-length check, so the swap changed
    when a user's script failed), with GRPO's message word for word."""
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    tok = build_tool_calling_tokenizer()
    data = _prompts(2, environment=["adder", "counter"])
    kwargs = dict(reward_funcs=[vowel_share], train_dataset=data, processing_class=tok)
    grpo = GRPOTrainer(
        model=_tiny_model(tok), args=GRPOConfig(output_dir=str(tmp_path / "grpo"), **SETTINGS),
        environment_factory={"adder": Adder}, **kwargs,
    )  # fmt: skip
    with pytest.raises(ValueError, match="not among the environments") as grpo_error:
        grpo.train()
    args = VinePPOConfig(output_dir=str(tmp_path / "vine"), **{**SETTINGS, "advantage_estimator": "grpo"})
    ours = VinePPOTrainer(model=_tiny_model(tok), args=args, environment_factory={"adder": Adder}, **kwargs)
    with pytest.raises(ValueError, match="not among the environments") as our_error:
        ours.train()
    assert str(our_error.value) == str(grpo_error.value)
    assert ours.state.global_step == 0


_INITIAL: dict[str, torch.Tensor] = {}


def _initial_weights() -> dict[str, torch.Tensor]:
    """The initial weights both trainers start from (built once)."""
    if not _INITIAL:
        model = _tiny_model(build_tool_calling_tokenizer())
        _INITIAL.update(_weights(model))
    return _INITIAL


def test_real_tool_loop_episodes_meet_the_turn_credit_contract(scripted_first_turn, tmp_path):
    """Issue 39 stage 2's building blocks on episodes of TRL's real tool loop: the episode's tool rounds match its
    tool-result spans token for token (the suffix GRPO computes), an Adder rebuilt by replay reproduces every recorded
    result, a recorded turn parses back to its calls, and the Monte Carlo estimator runs on the batch with the live policy
    (finite values, no credit on tool results)."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from mcadvantage.agents.episode_sampler import EpisodeSampler
    from mcadvantage.agents.rebuild import recorded_tool_turns, replay_environment
    from mcadvantage.agents.tool_loop import AgentEpisodes
    from mcadvantage.agents.turns import episode_step_boundaries, model_spans, tool_spans
    from mcadvantage.mc.estimator import MCValueEstimator, Trajectory

    checked = {"rounds": 0, "credits": []}

    def check(trainer, batch):
        episodes = trainer.agents.episodes(batch)
        for ep in episodes:
            turns = recorded_tool_turns(ep.messages)
            spans = tool_spans(ep.tool_mask)
            assert len(turns) == len(spans)
            assert episode_step_boundaries(ep.tool_mask)[-1] == len(ep.completion_ids)
            for turn, (start, end) in zip(turns, spans, strict=True):
                tool_messages = [{"role": "tool", "name": n, "content": c} for n, c in turn.results]
                assert ep.completion_ids[start:end] == trainer.tool_result_ids(tool_messages)
            env = replay_environment(Adder, ep.row, turns)  # raises if a replayed result differed
            assert len(env.calls) == len(turns)
            if turns:
                start, end = model_spans(ep.tool_mask)[0]
                parsed = trainer.agents.parse_turn(ep.completion_ids[start:end], ep.prompt_ids)
                assert parsed["tool_calls"] == list(turns[0].calls)
            checked["rounds"] += len(turns)
        agent = AgentEpisodes(episodes, {None: Adder}, trainer.agents.parse_turn, trainer.tool_result_ids, 2)
        trajectories = [
            Trajectory(
                ep.prompt_ids,
                ep.completion_ids,
                episode_step_boundaries(ep.tool_mask),
                ep.reward,
                prompt=ep.prompt,
                tool_mask=ep.tool_mask,
                episode=ep,
            )
            for ep in episodes
        ]
        with trainer.estimator_context().policy_sampler() as engine:
            estimator = MCValueEstimator(
                EpisodeSampler(engine, agent),
                trainer.reward_funcs,
                trainer.processing_class,
                num_rollouts=1,
                reward_weights=trainer.reward_weights.tolist(),
                max_completion_length=trainer.max_completion_length,
            )
            estimate = estimator.estimate(trajectories)
            checked["credits"] += list(
                zip(trajectories, estimate.values, estimate.sample_counts, strict=True)
            )

    tok = build_tool_calling_tokenizer()
    args = VinePPOConfig(
        output_dir=str(tmp_path), **{**SETTINGS, "max_steps": 1, "advantage_estimator": "grpo"}
    )
    trainer = VinePPOTrainer(model=_tiny_model(tok), args=args, processing_class=tok, **_case("environment"))
    hook = trainer.compute_advantages

    def compute(batch):
        check(trainer, batch)
        return hook(batch)

    trainer.compute_advantages = compute
    trainer.train()
    assert checked["rounds"] > 0 and checked["credits"]
    for traj, values, counts in checked["credits"]:
        assert all(math.isfinite(v) for v in values)
        assert counts == [1] * (len(traj.step_boundaries) - 1)


def _before_the_choice(text: str) -> list[str]:
    """A step segmenter that cuts a tool call ``{"choice": 2}`` just before its argument's digits."""
    return [part for part in re.split(r'(?<="choice": )(?=\d)', text) if part]


def test_vineppo_gives_environment_episodes_unbiased_monte_carlo_turn_credit(tmp_path, monkeypatch):
    """``advantage_estimator="vineppo"`` with ``environment_factory=``: on the testbed environment (every episode and
    every Monte Carlo continuation played by one scripted tool-calling policy, whose value at any token prefix is
    known exactly), two training steps run with finite weights, tool-result tokens get advantage exactly 0 and no
    whitening weight, and the value of every state the trainer estimated (turn boundaries and the segmenter's steps
    inside turns) equals its exact value within the Monte Carlo error of K continuations."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from testbed.agent_env import AgentEnv, AgentTask, KeyPolicy, make_agent_dataset
    from testbed.agent_policy import ScriptedAgentSampler, build_agent_model, build_agent_tokenizer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tok = build_agent_tokenizer()
    policy, k = KeyPolicy(0.5), 64
    rollouts = ScriptedAgentSampler(policy, tok, seed=1)  # the Monte Carlo continuations
    args = VinePPOConfig(
        output_dir=str(tmp_path),
        **{**SETTINGS, "generation_kwargs": None, "max_completion_length": 128, "num_generations": 4},
        advantage_estimator="vineppo",
        num_mc_rollouts=k,
        # A step boundary inside every tool call, before the chosen digit: a continuation from there finishes the
        # model's own turn (its value averages the choices still open), then runs its tool call.
        step_segmenter=_before_the_choice,
    )
    trainer = VinePPOTrainer(
        model=build_agent_model(tok, max_position_embeddings=512),
        reward_funcs=None,  # AgentEnv.get_reward is the reward
        args=args,
        train_dataset=make_agent_dataset("recovery", 3, 4, seed=0),
        processing_class=tok,
        environment_factory=AgentEnv,
        mc_sampler=rollouts,
    )
    episodes = ScriptedAgentSampler(
        policy, tok, seed=2
    )  # the training episodes: the same policy, its own draws

    def scripted_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return episodes.generate(prompt_ids, args.max_completion_length), None

    trainer._generate_single_turn = scripted_turn
    spies, seen = [], []
    spies.append(_Spy(trainer))
    hook = trainer.compute_advantages

    def compute(batch):
        out = hook(batch)
        est = trainer.advantage_estimator
        seen.append((trainer.last_advantage_result, list(est.last_rows), list(est.last_turn_credit)))
        return out

    trainer.compute_advantages = compute
    trainer.train()

    assert trainer.state.global_step == SETTINGS["max_steps"]
    assert sum(_logged(trainer, "tools/call_frequency")) > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
    assert _logged(trainer, "mc/rollouts") and all(
        math.isfinite(v) for v in _logged(trainer, "mc/mean_value")
    )
    # The continuations' sampled tokens and their tool results' tokens are logged apart (both > 0: every episode
    # holds tool rounds, so its continuations run tools too).
    assert all(v > 0 for v in _logged(trainer, "mc/generated_tokens"))
    assert all(v > 0 for v in _logged(trainer, "mc/tool_result_tokens"))
    # Tool executions per step (the replays' and the continuations'), so the replay multiplier is visible.
    tool_calls = sum(result.metrics["tool_calls"] for result, _, _ in seen)
    assert sum(_logged(trainer, "mc/tool_calls")) == tool_calls > 0
    assert set(_logged(trainer, "mc/dropped_tool_results")) == {0.0}
    spies[0].check_tool_tokens_get_no_credit()

    errors = []
    for batch, (result, rows, credits) in zip(spies[0].batches, seen, strict=True):
        assert rows == list(range(len(batch.completion_ids)))  # every episode ended and was scored
        model_tokens = batch.completion_mask.bool() & batch.tool_mask.bool()
        assert torch.equal(result.token_mask, model_tokens)
        assert not result.advantages[~model_tokens].any()
        assert result.values == [c.values for c in credits]
        for i, credit in zip(rows, credits, strict=True):
            ids = batch.completion_ids[i]
            assert credit.values[-1] == float(batch.rewards[i])  # V(S_n) = R, never estimated
            assert credit.rollouts == k * (
                len(credit.boundaries) - 1
            )  # identical states share their k samples
            # Every turn boundary is a state (4 turns: 3 tool calls, then the answer), and states sit only on the
            # model's own tokens.
            starts = [
                b
                for b in range(len(ids))
                if batch.tool_mask[i, b] and (b == 0 or not batch.tool_mask[i, b - 1])
            ]
            assert len(starts) == 4 and set(starts) <= set(credit.boundaries)
            assert all(batch.tool_mask[i, b] for b in credit.boundaries[:-1])
            task = AgentTask.from_row(batch.rows[i])
            for b, value in zip(credit.boundaries[:-1], credit.values[:-1], strict=True):
                if math.isnan(value):  # before the first state the budget bought: not estimated
                    continue
                exact = rollouts.exact_value(task, batch.prompt_ids[i] + ids[:b])
                errors.append(value - exact)
                # A mean of K rewards in [0, 1] has standard error <= 0.5 / sqrt(K): 5 of them.
                assert abs(value - exact) <= 5 * 0.5 / k**0.5, (i, b, value, exact)
    # The segmenter's steps inside the three tool calls add three states to the four turn boundaries.
    assert len(errors) == 2 * 4 * (4 + 3)
    # Unbiased over all states together (independent continuations): within 5 standard errors of the mean.
    assert abs(sum(errors) / len(errors)) <= 5 * 0.5 / (k * len(errors)) ** 0.5


def called_a_tool(completions, **kwargs) -> list[float]:
    """1 when the episode ran a tool round, else 0: groups of 2 tie often (degenerate), as the hybrid needs."""
    return [float(any(m["role"] == "tool" for m in messages)) for messages in completions]


def _one_step(text: str) -> list[str]:
    """One step per model turn (module level, so picklable): the states are the turn boundaries."""
    return [text]


def test_hybrid_gives_the_chosen_tool_episodes_turn_credit_and_trains(scripted_first_turn, tmp_path):
    """``advantage_estimator="hybrid"`` with ``tools=`` on TRL's real tool loop (the tiny model continues the
    episodes): two steps train with finite weights, the episodes of degenerate groups it chose carry exactly their
    turn credit (tool results 0), every other episode GRPO's advantage, and tool tokens get no credit."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from mcadvantage.estimators import GRPOEstimator

    spies, seen = [], []
    extra = {
        "advantage_estimator": "hybrid",
        "hybrid_budget": 20.0,  # every degenerate episode fits
        "num_mc_rollouts": 2,
        "step_segmenter": _one_step,
        "scale_rewards": "none",
    }
    tok = build_tool_calling_tokenizer()
    args = VinePPOConfig(output_dir=str(tmp_path), **SETTINGS, **extra)
    trainer = VinePPOTrainer(
        model=_tiny_model(tok), reward_funcs=[called_a_tool], args=args, processing_class=tok, tools=[add],
        train_dataset=_prompts(),
    )  # fmt: skip
    spies.append(_Spy(trainer))
    contexts = []
    context_of = trainer.estimator_context

    def context(batch=None):
        contexts.append(context_of(batch))
        return contexts[-1]

    trainer.estimator_context = context
    hook = trainer.compute_advantages

    def compute(batch):
        out = hook(batch)
        est = trainer.advantage_estimator
        seen.append((contexts[-1], list(est.last_rows), list(est.monte_carlo.last_turn_credit)))
        return out

    trainer.compute_advantages = compute
    trainer.train()

    assert trainer.state.global_step == SETTINGS["max_steps"]
    assert sum(_logged(trainer, "tools/call_frequency")) > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    spies[0].check_tool_tokens_get_no_credit()
    chosen = 0
    for batch, advantages, (built, rows, credits) in zip(
        spies[0].batches, spies[0].advantages, seen, strict=True
    ):
        assert built.episodes is not None and len(built.episodes.episodes) == len(batch.completion_ids)
        grpo = GRPOEstimator(scale_rewards="none").estimate(batch, built).advantages
        for i in range(len(batch.completion_ids)):
            if i not in rows:
                assert torch.equal(advantages[i], grpo[i])
        for i, credit in zip(rows, credits, strict=True):
            chosen += 1
            length = len(batch.completion_ids[i])
            assert advantages[i, :length].tolist() == pytest.approx(credit.advantages)
            assert credit.rollouts == 2 * (len(credit.boundaries) - 1)
    assert chosen > 0, "no degenerate episode was chosen: the turn-credit path did not run"
    assert sum(_logged(trainer, "hybrid/responses_estimated")) == chosen


def _testbed_trainer(tmp_path, monkeypatch, policy, extra, *, rollout_seed=1, engine_logprob=None):
    """A trainer on the agent testbed (``AgentEnv``, its reward alone) whose episodes and continuations are played
    by the scripted policy: ``mc_sampler`` (the Monte Carlo continuations, and a tree's first turn) and every turn
    GRPO's own generation asks for (patched on ``GRPOTrainer``, so the trainer's tree hook still runs first), with
    ``engine_logprob`` as every generated token's log-probability (None: no log-probabilities, as transformers)."""
    from trl import GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from testbed.agent_env import AgentEnv, make_agent_dataset
    from testbed.agent_policy import ScriptedAgentSampler, build_agent_model, build_agent_tokenizer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tok = build_agent_tokenizer()
    episodes = ScriptedAgentSampler(policy, tok, seed=2)
    rollouts = ScriptedAgentSampler(policy, tok, seed=rollout_seed)
    turns = []

    def scripted_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        turns.append((num_generations, [tok.decode(ids) for ids in prompt_ids]))
        out = episodes.generate(prompt_ids, self.max_completion_length)
        return out, None if engine_logprob is None else [[engine_logprob] * len(ids) for ids in out]

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted_turn)
    args = VinePPOConfig(
        output_dir=str(tmp_path),
        **{**SETTINGS, "generation_kwargs": None, "max_completion_length": 128, **extra},
    )
    trainer = VinePPOTrainer(
        model=build_agent_model(tok, max_position_embeddings=512),
        reward_funcs=None,  # AgentEnv.get_reward is the reward
        args=args,
        train_dataset=make_agent_dataset("delayed", 2, 4, seed=0),
        processing_class=tok,
        environment_factory=AgentEnv,
        mc_sampler=rollouts,
    )
    return trainer, rollouts, turns


def test_hybrid_turn_credit_on_environment_episodes_is_unbiased(tmp_path, monkeypatch):
    """``"hybrid"`` with ``environment_factory=`` on the testbed (exact values known): the chosen episodes' state
    values equal the exact values within the Monte Carlo error of K, tool results get 0, and training stays finite."""
    from testbed.agent_env import AgentTask, KeyPolicy

    k = 48
    policy = KeyPolicy(0.3)  # success 0.3: groups of 2 often all fail (degenerate)
    extra = {
        "advantage_estimator": "hybrid",
        "hybrid_budget": 50.0,
        "num_mc_rollouts": k,
        "step_segmenter": _one_step,
        "scale_rewards": "none",
    }
    trainer, rollouts, _ = _testbed_trainer(tmp_path, monkeypatch, policy, extra)
    spies, seen = [_Spy(trainer)], []
    hook = trainer.compute_advantages

    def compute(batch):
        out = hook(batch)
        est = trainer.advantage_estimator
        seen.append((list(est.last_rows), list(est.monte_carlo.last_turn_credit)))
        return out

    trainer.compute_advantages = compute
    trainer.train()
    assert trainer.state.global_step == SETTINGS["max_steps"]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    spies[0].check_tool_tokens_get_no_credit()
    checked = 0
    for batch, advantages, (rows, credits) in zip(spies[0].batches, spies[0].advantages, seen, strict=True):
        for i, credit in zip(rows, credits, strict=True):
            ids = batch.completion_ids[i]
            assert advantages[i, : len(ids)].tolist() == pytest.approx(credit.advantages)
            task = AgentTask.from_row(batch.rows[i])
            for b, value in zip(credit.boundaries[:-1], credit.values[:-1], strict=True):
                if math.isnan(value):  # before the first state the budget bought: not estimated
                    continue
                exact = rollouts.exact_value(task, batch.prompt_ids[i] + ids[:b])
                assert abs(value - exact) <= 5 * 0.5 / k**0.5, (i, b, value, exact)
                checked += 1
    assert checked >= 3  # turn boundaries of some chosen episodes (3 turns each: 2 tool calls and the answer)


@pytest.mark.parametrize("depths", [[0, 3], [0, 8]], ids=["branch inside the turn", "turn ends first"])
def test_tree_branches_in_the_first_model_turn_and_the_tool_loop_finishes_every_leaf(
    tmp_path, monkeypatch, depths
):
    """``advantage_estimator="tree"`` with ``environment_factory=`` on the testbed (a first turn is 6 tokens:
    ``<tool_call>``, the call's text up to the choice, the choice, the rest, ``</tool_call>``, EOS).

    - ``[0, 3]``: two first-level children of 3 tokens each (the choice is their last token), two leaves each; the
      leaves of one child share its first 3 tokens (and here the whole first turn, whose rest is fixed text).
    - ``[0, 8]``: every first turn ends (at its tool call) before depth 8, so each child is a leaf at once and the
      group's other leaves are top-ups, as the tree's early-ending rule says.

    Either way the tree is drawn only for the first turn (GRPO's tool loop generates every later turn, one leaf at a
    time, never as a tree), the advantages are the tree's credit over the whole episode (tool results 0, whitened
    over the model's tokens only), and two steps train; with ``[0, 3]``, leaves that share a first turn differ later."""
    from mcadvantage.mc.tree import tree_advantages
    from testbed.agent_env import KeyPolicy

    extra = {
        "advantage_estimator": "tree",
        "num_generations": 4,
        "tree_branching": [2, 2],
        "tree_depths": depths,
    }
    trainer, _, turns = _testbed_trainer(tmp_path, monkeypatch, KeyPolicy(0.5), extra)
    trees = []
    draw = trainer.draw_group_trees

    def spy_draw(prompt_ids, num_generations):
        drawn = draw(prompt_ids, num_generations)
        # A copy: GRPO's tool loop replaces the list's completions with the whole episodes.
        leaves = ([list(c) for c in drawn[0]], list(drawn[1]))
        trees.append((num_generations, [trainer.processing_class.decode(ids) for ids in prompt_ids], leaves))
        return drawn

    trainer.draw_group_trees = spy_draw
    spy, results = _Spy(trainer), []
    estimate = trainer.advantage_estimator.estimate

    def spy_estimate(batch, context):
        results.append(estimate(batch, context))
        return results[-1]

    trainer.advantage_estimator.estimate = spy_estimate
    trainer.train()

    assert trainer.state.global_step == SETTINGS["max_steps"]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
    # One tree draw per generation batch, for the first turn; every later turn came from GRPO's tool loop.
    assert len(trees) == len(spy.batches) == SETTINGS["max_steps"]
    assert all(n == 4 and not any("<tool_response>" in p for p in prompts) for n, prompts, _ in trees)
    assert turns and all(n == 1 and all("<tool_response>" in p for p in prompts) for n, prompts in turns)
    # Horizon 2: every leaf runs two tool rounds, so GRPO's loop generates its two later turns.
    assert sum(len(prompts) for _, prompts in turns) == 2 * sum(len(b.completion_ids) for b in spy.batches)
    spy.check_tool_tokens_get_no_credit()
    later_turns_differ = False
    batches = zip(trees, spy.batches, spy.advantages, results, strict=True)
    for (_, _, (leaves, paths)), batch, advantages, result in batches:
        assert batch.tree_paths == paths
        first_turns = [
            ids[: batch.tool_mask[i].tolist().index(0)] for i, ids in enumerate(batch.completion_ids)
        ]
        assert [ids[: len(first)] for ids, first in zip(leaves, first_turns, strict=True)] == first_turns
        assert all(len(leaf) == len(first) == 6 for leaf, first in zip(leaves, first_turns, strict=True))
        for g in range(0, len(paths), 4):
            group = range(g, g + 4)
            if depths == [0, 3]:
                assert [paths[i].children for i in group] == [(0, 0), (0, 1), (1, 0), (1, 1)]
                assert all(paths[i].offsets == (0, 3) for i in group)
                for a, b in ((g, g + 1), (g + 2, g + 3)):  # siblings share their node's 3 tokens
                    assert first_turns[a][:3] == first_turns[b][:3]
                    later_turns_differ |= batch.completion_ids[a] != batch.completion_ids[b]
            else:
                assert [paths[i].children for i in group] == [(0,), (1,), (2,), (3,)]
                assert [paths[i].widths for i in group] == [(2,)] * 4  # children 2 and 3 are top-ups
            rewards = [float(batch.rewards[i]) for i in group]
            lengths = [len(batch.completion_ids[i]) for i in group]
            expected, _ = tree_advantages([paths[i] for i in group], rewards, lengths)
            for i, adv in zip(group, expected, strict=True):
                model = batch.tool_mask[i, : lengths[i - g]].bool()
                got = result.advantages[i, : lengths[i - g]]
                # The tree's credit over the whole episode (the last segment covers the later turns), tool
                # results 0.
                assert torch.equal(got[model], adv[model]) and not got[~model].any()
        loss_tokens = (batch.completion_mask * batch.tool_mask).bool()
        assert abs(float(advantages[loss_tokens].mean())) < 1e-5  # whitened over the model's tokens only
    if depths == [0, 3]:
        assert later_turns_differ, (
            "siblings sharing a first turn never differed later: the tool loop did not run"
        )


def test_tree_leaves_first_turns_carry_no_engine_logprobs_and_their_later_turns_the_engines(
    tmp_path, monkeypatch
):
    """With vLLM, a tree's tokens have no engine log-probabilities (NaN) and GRPO's tool loop appends 0.0 for tool
    results and the engine's for the later turns: GRPO's vLLM bookkeeping (``use_vllm``, its importance-sampling
    correction on, default ``"sequence_mask"``) on a scripted engine whose every token has log-probability -1.
    Each episode's sampling log-probabilities are NaN on its first turn, 0.0 on tool results and -1 on later turns,
    the importance-sampling ratio stays finite, and two steps train with finite weights."""
    from testbed.agent_env import KeyPolicy

    extra = {
        "advantage_estimator": "tree",
        "num_generations": 4,
        "tree_branching": [2, 2],
        "tree_depths": [0, 3],
    }
    trainer, _, turns = _testbed_trainer(tmp_path, monkeypatch, KeyPolicy(0.5), extra, engine_logprob=-1.0)
    # The engine is scripted (no vLLM is started): only GRPO's vLLM bookkeeping is switched on.
    trainer.use_vllm, trainer.vllm_mode = True, "server"
    outputs = []
    generate_and_score = trainer._generate_and_score_completions

    def spy(inputs):
        outputs.append(generate_and_score(inputs))
        return outputs[-1]

    trainer._generate_and_score_completions = spy
    trainer.train()

    assert trainer.state.global_step == SETTINGS["max_steps"] and turns
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
    for output in outputs:
        logps, tool_mask, mask = (
            output["sampling_per_token_logps"],
            output["tool_mask"],
            output["completion_mask"],
        )
        assert torch.isfinite(output["importance_sampling_ratio"]).all()
        for row in range(logps.shape[0]):
            length = int(mask[row].sum())
            first = tool_mask[row].tolist().index(0)
            assert torch.isnan(logps[row, :first]).all()
            later = tool_mask[row, first:length].bool()
            assert (logps[row, first:length][~later] == 0.0).all() and (
                logps[row, first:length][later] == -1.0
            ).all()


# ----------------------------------------------------------------------------- "anchor": credit by state, no samples


class KeyedAdder(Adder):
    """:class:`Adder` with the read-only ``state_key`` the anchor credit reads: the number of calls so far."""

    @property
    def state_key(self) -> int:
        return len(self.calls)


class KeyedDoubler(Doubler):
    """:class:`Doubler` with a ``state_key`` (it keeps no state: every turn starts from the same one)."""

    @property
    def state_key(self) -> str:
        return "doubler"


def keyed_rollout(prompts, trainer):
    """:func:`scripted_rollout` returning each completion's state keys (two model turns: before and after the
    observation) in the ``turn_keys`` field."""
    out = scripted_rollout(prompts, trainer)
    return {**out, "turn_keys": [["start", "after 42"] for _ in prompts]}


def _anchor_case(name: str) -> dict:
    case = _case(name)
    if name == "environment":
        case["environment_factory"] = KeyedAdder
    elif name == "environment dict":
        case["environment_factory"] = {"adder": KeyedAdder, "doubler": KeyedDoubler}
    elif name == "rollout_func":
        case["rollout_func"] = keyed_rollout
    return case


class _EngineCalls:
    """Counts the engine's generation calls (GRPO's ``_generate_single_turn`` and the Monte Carlo sampler) and how
    many of them fall inside the advantage phase (``compute_advantages``)."""

    def __init__(self, trainer):
        self.total = self.in_advantages = 0
        self._inside = False
        generate, compute, sampler = (
            trainer._generate_single_turn,
            trainer.compute_advantages,
            trainer._rollout_sampler,
        )

        def counted_generate(*args, **kwargs):
            self.total += 1
            self.in_advantages += self._inside
            return generate(*args, **kwargs)

        def counted_compute(batch):
            self._inside = True
            try:
                return compute(batch)
            finally:
                self._inside = False

        def counted_sampler():  # the Monte Carlo sampler's context (also built, unused, for every first turn)
            self.in_advantages += self._inside
            return sampler()

        trainer._generate_single_turn = counted_generate
        trainer.compute_advantages = counted_compute
        trainer._rollout_sampler = counted_sampler


@pytest.mark.parametrize("case", CASES)
def test_anchor_trains_tool_environment_and_rollout_func_episodes_without_extra_generation(
    scripted_first_turn, tmp_path, case
):
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    tok = build_tool_calling_tokenizer()
    args = VinePPOConfig(output_dir=str(tmp_path), **{**SETTINGS, "advantage_estimator": "anchor"})
    trainer = VinePPOTrainer(model=_tiny_model(tok), args=args, processing_class=tok, **_anchor_case(case))
    spy = _Spy(trainer)
    calls = _EngineCalls(trainer)
    trainer.train()
    assert trainer.state.global_step == SETTINGS["max_steps"]
    if case != "rollout_func":
        assert sum(_logged(trainer, "tools/call_frequency")) > 0
        assert calls.total > 0  # the engine generated the episodes ...
    assert calls.in_advantages == 0  # ... and nothing while the advantages were computed
    spy.check_tool_tokens_get_no_credit()
    for batch in spy.batches:
        assert batch.turn_keys is not None and len(batch.turn_keys) == len(batch.completion_ids)
        for r, keys in enumerate(batch.turn_keys):
            mask = batch.tool_mask[r, : len(batch.completion_ids[r])].tolist()
            assert len(keys) == sum(1 for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1]))
            if case == "environment":
                assert keys == list(range(len(keys)))  # the calls made before each turn
            if case == "rollout_func":
                assert keys == ["start", "after 42"]
    for key in (
        "grouped_turn_share",
        "singleton_turn_share",
        "mean_step_group_size",
        "mean_abs_step_advantage",
    ):
        assert _logged(trainer, f"anchor/{key}"), key
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


def test_anchor_refuses_an_environment_without_state_key_and_a_rollout_func_without_keys(
    scripted_first_turn, tmp_path
):
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    tok = build_tool_calling_tokenizer()
    args = VinePPOConfig(output_dir=str(tmp_path), **{**SETTINGS, "advantage_estimator": "anchor"})
    with pytest.raises(
        TypeError, match=r"Adder \(environment 'adder'\) does not have.*anchor_state='observation'"
    ):
        VinePPOTrainer(
            model=_tiny_model(tok), args=args, processing_class=tok,
            **{**_anchor_case("environment dict"), "environment_factory": {"adder": Adder, "doubler": KeyedDoubler}},
        ).train()  # fmt: skip
    trainer = VinePPOTrainer(model=_tiny_model(tok), args=args, processing_class=tok, **_case("rollout_func"))
    with pytest.raises(
        ValueError, match=r"rollout_func returned no 'turn_keys' field .*anchor_state='observation'"
    ):
        trainer.train()
    # Keyed by observation, the same environment without state_key trains.
    args = VinePPOConfig(
        output_dir=str(tmp_path), **{**SETTINGS, "advantage_estimator": "anchor", "max_steps": 1},
        anchor_state="observation",
    )  # fmt: skip
    trainer = VinePPOTrainer(model=_tiny_model(tok), args=args, processing_class=tok, **_case("environment"))
    trainer.train()
    assert trainer.state.global_step == 1 and _logged(trainer, "anchor/singleton_turn_share")


def test_anchor_records_the_testbed_environments_true_state_before_every_turn(tmp_path, monkeypatch):
    """On the testbed (scripted tool-calling policy, AgentEnv with its state_key ``(turns played, state)``), the keys
    the trainer recorded during GRPO's tool loop equal the states read back from the episode's own tool results."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from testbed.agent_env import GOOD, STATE_NAMES, AgentEnv, AgentTask, KeyPolicy, make_agent_dataset
    from testbed.agent_policy import ScriptedAgentSampler, build_agent_model, build_agent_tokenizer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tok = build_agent_tokenizer()
    args = VinePPOConfig(
        output_dir=str(tmp_path),
        **{**SETTINGS, "generation_kwargs": None, "max_completion_length": 128, "num_generations": 4},
        advantage_estimator="anchor",
    )
    data = make_agent_dataset("recovery", 3, 4, seed=0)
    trainer = VinePPOTrainer(
        model=build_agent_model(tok, max_position_embeddings=512), reward_funcs=None, args=args,
        train_dataset=data, processing_class=tok, environment_factory=AgentEnv,
    )  # fmt: skip
    episodes = ScriptedAgentSampler(KeyPolicy(0.5), tok, seed=2)
    from trl import GRPOTrainer

    # GRPO's generation scripted below the trainer's own hook (which records the keys), as a real engine sits.
    monkeypatch.setattr(
        GRPOTrainer,
        "_generate_single_turn",
        lambda self, prompt_ids, *a, **k: (episodes.generate(prompt_ids, args.max_completion_length), None),
    )
    spy = _Spy(trainer)
    trainer.train()
    names = {name: state for state, name in STATE_NAMES.items()}
    initial = AgentTask.from_row(data[0]).initial_state()
    assert initial == GOOD
    checked = 0
    for batch in spy.batches:
        for r, ids in enumerate(batch.completion_ids):
            results = re.findall(r"turn (\d+)/3 state=(\w+)", tok.decode(ids))
            want = [(0, initial)] + [(int(t), names[s]) for t, s in results]
            assert batch.turn_keys[r] == want[: len(batch.turn_keys[r])]
            assert len(batch.turn_keys[r]) in (len(want), len(want) - 1)
            checked += len(results)
    assert checked > 0
