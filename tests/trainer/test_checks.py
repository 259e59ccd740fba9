"""trainer/checks.py: which estimators take TRL's agent arguments (tools, environments, rollout_func), reward
sources with environments, and the dataset columns environments need."""

from __future__ import annotations

import pytest

from mcadvantage.trainer.checks import check_agent_kwargs, check_dataset_columns, check_reward_funcs


class _ReadsTheBatch:
    name = "mine"
    uses_rollouts = False


class _SamplesContinuations(_ReadsTheBatch):
    uses_rollouts = True


class _DrawsTrees(_ReadsTheBatch):
    """Matches the DrawsTrees protocol: its groups are drawn as trees."""

    def tree_schedule(self, max_completion_length):
        return object()


def test_agent_arguments_pass_to_estimators_that_only_read_the_batch():
    for kwargs in ({"tools": [print]}, {"environment_factory": dict}, {"rollout_func": print}, {}):
        check_agent_kwargs(kwargs, _ReadsTheBatch(), 16)  # no error
    check_agent_kwargs({"tools": None, "beta": 0.1}, _SamplesContinuations(), 16)  # nothing agent-like given


def test_agent_arguments_refused_where_continuations_would_drop_the_episode():
    with pytest.raises(
        NotImplementedError,
        match=r"advantage_estimator='mine' does not support tools=, rollout_func=: it samples Monte Carlo",
    ):
        check_agent_kwargs({"tools": [print], "rollout_func": print}, _SamplesContinuations(), 16)


def test_an_estimator_that_draws_trees_takes_tools_and_environments_not_a_rollout_func():
    """The tree branches inside the first model turn and GRPO's tool loop finishes every leaf; a rollout_func
    replaces the generation the tree is drawn in."""
    check_agent_kwargs({"tools": [print], "environment_factory": dict}, _DrawsTrees(), 16)  # no error
    with pytest.raises(
        NotImplementedError,
        match=r"advantage_estimator='mine' does not support rollout_func= yet: the trainer draws each group as a "
        r"tree .* pass tools= / environment_factory= instead",
    ):
        check_agent_kwargs({"tools": [print], "rollout_func": print}, _DrawsTrees(), 16)


class _ContinuesEpisodes(_SamplesContinuations):
    """Matches the ContinuesEpisodes protocol (as "vineppo"): it checks what it supports itself."""

    def __init__(self):
        self.asked = []

    def check_agent_support(self, given):
        self.asked.append(list(given))
        if "rollout_func" in given:
            raise NotImplementedError("no rollout_func")


def test_an_estimator_that_continues_episodes_decides_what_it_takes():
    estimator = _ContinuesEpisodes()
    check_agent_kwargs({"tools": [print], "environment_factory": dict}, estimator, 16)  # no error
    assert estimator.asked == [["tools", "environment_factory"]]
    with pytest.raises(NotImplementedError, match="no rollout_func"):
        check_agent_kwargs({"rollout_func": print}, estimator, 16)


def test_environments_may_own_the_reward():
    assert check_reward_funcs(None, environment_factory=dict) == []
    assert check_reward_funcs([], environment_factory=dict) == []
    assert check_reward_funcs(print, environment_factory=dict) == [print]
    with pytest.raises(ValueError, match=r"reward_funcs is None"):
        check_reward_funcs(None)


def test_dataset_columns_with_environments():
    from datasets import Dataset

    routed = Dataset.from_dict({"environment": ["a"]})  # no prompt: the environment's reset supplies it
    check_dataset_columns(routed, [], "train_dataset", environment_factory={"a": dict})
    with pytest.raises(ValueError, match="has no 'prompt' column"):
        check_dataset_columns(routed, [], "train_dataset")
    with pytest.raises(ValueError, match=r"no 'environment' column .*\['a', 'b'\]"):
        check_dataset_columns(
            Dataset.from_dict({"prompt": ["x"]}), [], "d", environment_factory={"a": 1, "b": 2}
        )
