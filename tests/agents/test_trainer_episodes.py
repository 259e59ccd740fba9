"""The trainer's agent side (:class:`mcadvantage.agents.trainer_episodes.TrainerEpisodes`) on a stand-in for the
trainer's seam: which source a batch's keys come from, the episodes it builds, and when it hands the estimator
nothing to continue. Through the real trainer: ``tests/trainer/test_agents.py`` and
``tests/faults/test_fault_agents.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mcadvantage.agents.rebuild import NOT_RECORDED
from mcadvantage.agents.trainer_episodes import TrainerEpisodes

MASK = torch.tensor([[1, 1, 0, 0, 1, 1]])


class _Env:
    def __init__(self, key):
        self._key = key

    @property
    def state_key(self):
        return self._key


def seam(**overrides):
    """A trainer that recorded nothing yet, with one ``environment_factory`` and an estimator reading state keys."""
    values = dict(
        advantage_estimator=SimpleNamespace(state_source="state_key"),
        rollout_func=None,
        environment_classes={None: _Env},
        environment_factory_map={None: lambda: _Env("fresh")},
        episode_environments=[_Env("after")],
        environment_route_column=None,
        standalone_tools=[],
        batch_conversations=[[{"role": "assistant", "content": "done"}]],
        tool_calling_limit=None,
        tool_result_ids=lambda messages: [9],
    )
    values = {**values, **overrides}
    reads = getattr(values["advantage_estimator"], "state_source", None) == "state_key"  # as VinePPOTrainer's
    return SimpleNamespace(**{"reads_state_keys": reads, **values})


def batch(**overrides):
    values = dict(
        prompt_ids=[[1, 2]],
        completion_ids=[[3, 4, 5, 6, 7, 8]],
        prompts=["p"],
        rows=[{"prompt": "p", "turn_keys": ["k0", "k1"]}],
        tool_mask=MASK,
        rewards=torch.tensor([1.0]),
    )
    return SimpleNamespace(**{**values, **overrides})


def test_the_keys_before_each_turn_come_from_the_recording_the_rollout_func_or_the_observation():
    agents = TrainerEpisodes(seam())
    agents.start_generation()
    agents.record_turn_states()
    agents.record_turn_states()
    assert agents.end_generation(batch()) == [["after", "after"]]  # recorded at both generation calls
    assert TrainerEpisodes(seam(rollout_func=object())).batch_turn_keys(batch()) == [["k0", "k1"]]
    observed = TrainerEpisodes(seam(environment_factory_map=None)).batch_turn_keys(batch())
    assert observed == [[("prompt", (1, 2), ()), (5, 6)]]
    # Nothing asks for keys: none, and single-turn batches have none either.
    assert TrainerEpisodes(seam(advantage_estimator=None)).batch_turn_keys(batch()) is None
    assert TrainerEpisodes(seam()).batch_turn_keys(batch(tool_mask=None)) is None


def test_a_rollout_func_without_turn_keys_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="'turn_keys'"):
        TrainerEpisodes(seam(rollout_func=object())).batch_turn_keys(batch(rows=[{"prompt": "p"}]))


def test_episodes_carry_the_batch_and_the_final_key_and_the_context_only_for_the_tool_loop():
    agents = TrainerEpisodes(seam(advantage_estimator=None))
    (episode,) = agents.episodes(batch())
    assert (episode.prompt_ids, episode.completion_ids, episode.tool_mask) == (
        [1, 2],
        [3, 4, 5, 6, 7, 8],
        MASK[0].tolist(),
    )
    assert (episode.reward, episode.row["prompt"], episode.environment) == (1.0, "p", None)
    assert episode.state_keys == {0: "after"}  # no tool round recorded: the pooled environment's final key
    context = agents.context(batch())
    assert (
        context is not None
        and context.tool_suffix_ids([]) == [9]
        and context.max_tool_calling_iterations is None
    )
    assert agents.context(batch(tool_mask=None)) is None  # single-turn: nothing to continue
    # tools= alone with no tools (a rollout_func's env_mask): episodes that cannot be resumed from a prefix.
    assert TrainerEpisodes(seam(environment_factory_map=None)).context(batch()) is None
    with pytest.raises(ValueError, match="no tool_mask"):
        agents.episodes(batch(tool_mask=None))
    keyless = TrainerEpisodes(seam(episode_environments=[object()]))
    assert keyless.episodes(batch())[0].state_keys == {}


def test_the_rebuild_check_reads_what_keys_there_are_and_credit_by_state_all_of_them():
    """The trainer's recording (``TrainerEpisodes.record_turn_states``) on a dict of environments where one
    class has no ``state_key``: for the rebuild checks its keys are NOT_RECORDED, no error; for ``"anchor"``
    credit, which needs every key, the missing one is an AttributeError naming the episode and the fix."""

    def recording(anchor: bool) -> TrainerEpisodes:
        estimator = SimpleNamespace(state_source="state_key") if anchor else None
        agents = TrainerEpisodes(
            seam(advantage_estimator=estimator, episode_environments=[_Env((0, 1)), object()])
        )
        agents.start_generation()
        return agents

    checks = recording(anchor=False)
    checks.record_turn_states()
    assert checks.end_generation(SimpleNamespace(tool_mask=None)) is None
    assert checks._batch_state_log == [[(0, 1), NOT_RECORDED]]
    with pytest.raises(AttributeError, match=r"local episode 1 \(object\).*anchor_state='observation'"):
        recording(anchor=True).record_turn_states()
