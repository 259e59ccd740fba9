"""The agent testbed's toy policy (``testbed/agent_policy.py``): a character tokenizer that speaks Qwen3's tool-call
template, whose tool calls TRL's own parser reads; a scripted sampler whose episodes, played turn by turn through
the chat template and TRL's parser, have exactly the success rate :func:`testbed.agent_env.exact_values` says; and one
step of TRL's own ``GRPOTrainer`` with ``environment_factory=AgentEnv``, its tool loop driven by the scripted policy.
"""

from __future__ import annotations

import json
import math
import re

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from trl.chat_template_utils import (  # noqa: E402
    parse_response,
    supports_tool_calling,
)

from mcadvantage.samplers.base import RolloutRequest, Sampler  # noqa: E402
from testbed.agent_env import (  # noqa: E402
    BAD,
    GOOD,
    AgentEnv,
    AgentTask,
    KeyPolicy,
    agent_rows,
    exact_values,
    make_agent_dataset,
    path_values,
    replay_states,
)
from testbed.agent_policy import (  # noqa: E402
    FINAL_TEXT,
    ScriptedAgentSampler,
    build_agent_model,
    build_agent_tokenizer,
    tool_call_text,
)


@pytest.fixture(scope="module")
def tokenizers():
    return {compact: build_agent_tokenizer(compact=compact) for compact in (True, False)}


def _prompt_ids(tokenizer, env: AgentEnv, row: dict) -> list[int]:
    """The first prompt as TRL renders it: the row's user message with ``reset``'s observation appended, and the
    environment's tools in the system block."""
    observation = env.reset(**row)
    messages = [{"role": "user", "content": row["prompt"][0]["content"] + observation}]
    return tokenizer.apply_chat_template(
        messages, tools=[env.act], add_generation_prompt=True, tokenize=True, return_dict=False
    )


@pytest.mark.parametrize("compact", [True, False])
def test_the_tokenizer_speaks_a_tool_calling_template_losslessly(tokenizers, compact):
    tokenizer = tokenizers[compact]
    assert supports_tool_calling(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.response_template is not None
    env = AgentEnv()
    row = agent_rows("delayed", 3, 1, seed=0)[0]
    ids = _prompt_ids(tokenizer, env, row)
    text = tokenizer.decode(ids)
    assert "<tool_call>" in text and '"name": "act"' in text and text.endswith("<|im_start|>assistant\n")
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert tokenizer.unk_token_id not in ids
    # The compact vocabulary writes the same text in far fewer tokens.
    if compact:
        assert (
            len(ids)
            < len(
                tokenizers[False].apply_chat_template(
                    [{"role": "user", "content": row["prompt"][0]["content"] + env.reset(**row)}],
                    tools=[env.act],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            )
            / 4
        )


def test_the_testbed_tokenizer_is_the_librarys_with_more_special_tokens_and_phrases(tokenizers):
    from mcadvantage.testing import build_tool_calling_tokenizer

    library = build_tool_calling_tokenizer()
    testbed = tokenizers[False]
    # one builder: every token of the library's vocabulary has the same id in the testbed's
    assert all(testbed.get_vocab()[tok] == i for tok, i in library.get_vocab().items())
    assert testbed.chat_template == library.chat_template and testbed.eos_token == library.eos_token
    assert len(tokenizers[True]) > len(testbed) > len(library)
    with pytest.raises(ValueError, match=r"lacks '<\|im_end\|>'.*add it"):
        build_tool_calling_tokenizer(special_tokens=("<|im_start|>",))


@pytest.mark.parametrize("compact", [True, False])
def test_trl_parses_the_scripted_tool_calls(tokenizers, compact):
    """TRL's ``parse_response`` (the one its tool loop calls, with the prompt as prefix and the tools) reads every
    turn the scripted policy writes: ``act(choice)`` for each choice, and the final answer as plain content."""
    tokenizer = tokenizers[compact]
    env = AgentEnv()
    prompt = _prompt_ids(tokenizer, env, agent_rows("recovery", 4, 1, seed=0, choices=5)[0])
    sampler = ScriptedAgentSampler(KeyPolicy(0.5), tokenizer)
    for choice in range(5):
        ids = list(sampler.turn_ids(choice))
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[:-1]) == tool_call_text(choice)
        parsed = parse_response(tokenizer, ids, prefix=prompt, tools=[env.act])
        assert parsed["tool_calls"] == [
            {"type": "function", "function": {"name": "act", "arguments": {"choice": choice}}}
        ]
    final = parse_response(tokenizer, list(sampler.turn_ids(None)), prefix=prompt, tools=[env.act])
    assert final == {"role": "assistant", "content": FINAL_TEXT}


def _play(sampler: ScriptedAgentSampler, tokenizer, row: dict, max_turns: int) -> tuple[AgentEnv, list[int]]:
    """One episode as TRL's tool loop plays it: generate a turn, parse it with TRL's parser, run the tool call on
    the environment, append the result through the chat template, until a turn has no tool call."""
    env = AgentEnv()
    observation = env.reset(**row)
    messages = [{"role": "user", "content": row["prompt"][0]["content"] + observation}]
    choices = []
    for _ in range(max_turns):
        prefix = tokenizer.apply_chat_template(
            messages, tools=[env.act], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        (cont,) = sampler.sample([RolloutRequest(prefix_ids=tuple(prefix), n=1, max_tokens=64)])[0]
        parsed = parse_response(tokenizer, list(cont.token_ids), prefix=prefix, tools=[env.act])
        messages.append(parsed)
        if not parsed.get("tool_calls"):
            break
        for call in parsed["tool_calls"]:
            choices.append(call["function"]["arguments"]["choice"])
            result = env.act(**call["function"]["arguments"])
            messages.append({"role": "tool", "name": "act", "content": result})
    return env, choices


def test_scripted_episodes_through_the_template_and_parser_have_the_exact_success_rate(tokenizers):
    """The sampler reads the state from the text and acts on it: a policy that picks the key more often in the bad
    state, played through the chat template and TRL's parser, succeeds at the exact rate within five standard errors
    of the sample size, and every episode's end state is the replay of its parsed choices."""
    tokenizer = tokenizers[True]
    policy = KeyPolicy(key_prob=lambda turn, state: 0.7 if state == BAD else 0.2, stop_prob=0.05)
    sampler = ScriptedAgentSampler(policy, tokenizer, seed=0)
    assert isinstance(sampler, Sampler)
    row = agent_rows("recovery", 3, 1, seed=2, choices=3)[0]
    task = AgentTask.from_row(row)
    n = 200
    rewards = []
    for _ in range(n):
        env, choices = _play(sampler, tokenizer, row, max_turns=task.horizon + 2)
        assert env.turn == len(choices) and env.state == replay_states(task, choices)[-1]
        rewards.append(env.get_reward())
    exact = path_values(task, policy, [])[0]
    assert abs(sum(rewards) / n - exact) <= 5 * math.sqrt(exact * (1 - exact) / n)
    assert 0.6 < exact < 0.7  # the check has power: the same policy blind to the state succeeds at 0.32


def test_the_sampler_answers_done_when_the_episode_is_over_and_honours_the_budget(tokenizers):
    tokenizer = tokenizers[True]
    sampler = ScriptedAgentSampler(KeyPolicy(1.0), tokenizer, seed=0)
    row = agent_rows("delayed", 2, 1, seed=0)[0]
    env, choices = _play(sampler, tokenizer, row, max_turns=5)
    assert choices == [row["key"], row["key"]] and env.get_reward() == 1.0
    prompt = _prompt_ids(tokenizer, AgentEnv(), row)
    (cut,) = sampler.sample([RolloutRequest(prefix_ids=tuple(prompt), n=1, max_tokens=2)])[0]
    assert cut.truncated and cut.token_ids == sampler.turn_ids(row["key"])[:2]
    with pytest.raises(ValueError, match="not an episode"):
        sampler.sample([RolloutRequest(prefix_ids=tuple(tokenizer("hello")["input_ids"]), n=1, max_tokens=8)])


def test_trl_grpo_trainer_runs_the_environment_with_the_scripted_policy(tokenizers, tmp_path, monkeypatch):
    """One step of TRL's own ``GRPOTrainer`` with ``environment_factory=AgentEnv`` and no reward function: its tool
    loop parses the scripted turns, calls ``act`` on each rollout's environment, masks the tool results out of the
    loss, and scores each rollout with the environment's ``get_reward``, which equals the replay of its calls."""
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = tokenizers[True]
    policy = KeyPolicy(0.5)
    sampler = ScriptedAgentSampler(policy, tokenizer, seed=1)
    captured = []

    class Recorder(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            captured.append(
                (inputs, output, [(env.turn, env.state, env.get_reward()) for env in self.environments])
            )
            return output

    args = GRPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=128,
        max_steps=1,
        save_strategy="no",
        seed=0,
        logging_steps=1,
        beta=0.0,
    )
    trainer = Recorder(
        model=build_agent_model(tokenizer, max_position_embeddings=512),
        processing_class=tokenizer,
        args=args,
        train_dataset=make_agent_dataset("recovery", 3, 4, seed=0),
        environment_factory=AgentEnv,
    )

    def scripted_generate_single_turn(
        prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        return sampler.generate(prompt_ids, args.max_completion_length), None

    trainer._generate_single_turn = scripted_generate_single_turn
    trainer.train()

    (inputs, output, envs) = captured[0]
    logs = trainer.state.log_history[0]
    assert logs["tools/call_frequency"] == 3.0 and logs["tools/failure_frequency"] == 0.0
    rewards = []
    for i, (turn, state, reward) in enumerate(envs):
        ids = output["completion_ids"][i][output["completion_mask"][i].bool()].tolist()
        text = tokenizer.decode(ids)
        choices = [
            json.loads(m)["arguments"]["choice"]
            for m in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text)
        ]
        task = AgentTask.from_row(inputs[i])
        assert turn == 3 and state == replay_states(task, choices)[-1]
        assert reward == (1.0 if state == GOOD else 0.0)
        assert text.endswith(FINAL_TEXT + "<|im_end|>")
        # The tool results are exactly the tokens TRL masks out (tool_mask 0): each ends with a turn result.
        mask = output["tool_mask"][i][output["completion_mask"][i].bool()].tolist()
        masked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        assert re.findall(r"turn (\d)/3", masked) == ["1", "2", "3"]
        assert "<tool_call>" not in masked and FINAL_TEXT not in masked
        rewards.append(reward)
    assert logs["rewards/AgentEnv/mean"] == pytest.approx(sum(rewards) / len(rewards))


def test_a_prefix_inside_a_turn_continues_consistently_and_its_exact_value_is_what_sampling_averages(
    tokenizers,
):
    """States may sit inside the model's own turn (step boundaries in its text): from every token prefix of a turn
    the sampler completes a turn consistent with it, and the average ``Q`` of the turns it completes matches
    :meth:`ScriptedAgentSampler.exact_value` there (five standard errors of the sample size); at the turn boundary
    that is the environment's exact value, after a whole tool call the call's ``Q``."""
    tokenizer = tokenizers[True]
    policy = KeyPolicy(key_prob=0.3, stop_prob=0.2)
    sampler = ScriptedAgentSampler(policy, tokenizer, seed=3)
    row = agent_rows("delayed", 3, 1, seed=1, choices=3)[0]
    task = AgentTask.from_row(row)
    prompt = _prompt_ids(tokenizer, AgentEnv(), row)
    values = exact_values(task, policy)
    boundary = sampler.exact_value(task, prompt)
    assert boundary == pytest.approx(values[0][task.initial_state()]) and 0 < boundary < 1

    def q(turn_ids: tuple[int, ...]) -> float:
        choice = next(c for c in [None, *range(task.choices)] if sampler.turn_ids(c) == turn_ids)
        return 0.0 if choice is None else values[1][task.transition(0, task.initial_state(), choice)]

    n = 1500
    wrong = (task.key + 1) % task.choices
    for target in (task.key, wrong, None):
        full = sampler.turn_ids(target)
        assert sampler.exact_value(task, prompt + list(full)) == q(full)
        for j in range(len(full)):
            prefix = prompt + list(full[:j])
            exact = sampler.exact_value(task, prefix)
            conts = sampler.sample([RolloutRequest(prefix_ids=tuple(prefix), n=n, max_tokens=64)])[0]
            completed = [full[:j] + c.token_ids for c in conts]
            assert all(c[-1] == tokenizer.eos_token_id for c in completed)
            mean = sum(q(c) for c in completed) / n
            assert abs(mean - exact) <= 5 * 0.5 / math.sqrt(n), (target, j, mean, exact)
    # After "<tool_call>" only tool calls remain possible: the value is the choices' average Q, stopping excluded.
    inside = sampler.exact_value(task, prompt + list(sampler.turn_ids(task.key)[:1]))
    assert inside == pytest.approx(boundary / 0.8)
    # An empty think block after the header (a template's no-thinking generation prompt) changes nothing.
    think = tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert sampler.exact_value(task, prompt + think) == boundary


def test_prefixes_that_are_not_the_policys_text_are_refused(tokenizers):
    tokenizer = tokenizers[True]
    sampler = ScriptedAgentSampler(KeyPolicy(0.5), tokenizer)
    row = agent_rows("delayed", 2, 1, seed=0)[0]
    prompt = _prompt_ids(tokenizer, AgentEnv(), row)
    foreign = tokenizer("xyz", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="no turn of the scripted policy"):
        sampler.sample([RolloutRequest(prefix_ids=tuple(prompt + foreign), n=1, max_tokens=8)])
    with pytest.raises(ValueError, match="complete turn"):
        sampler.decide(prompt + list(sampler.turn_ids(0)))
    without_header = prompt[
        : -len(tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    ]
    with pytest.raises(ValueError, match="does not end inside an assistant turn"):
        sampler.decide(without_header)
    other = AgentTask.from_row({**row, "key": (row["key"] + 1) % 4})
    with pytest.raises(ValueError, match="another task"):
        sampler.exact_value(other, prompt)
