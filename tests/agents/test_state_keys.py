"""The state keys of agent episodes (:mod:`mcadvantage.agents.state_keys`): every recorded round's key goes into
``Episode.state_keys``, and nothing recorded after an episode's last recorded round (a round dropped for the token
budget, an episode that left GRPO's tool loop) is taken for one of its rounds. Through the trainer:
``tests/faults/test_fault_agents.py`` (a key that differs only after a middle round is refused; a deterministic
environment has every round checked; an environment without a ``state_key`` records nothing)."""

from __future__ import annotations

from mcadvantage.agents.rebuild import NOT_RECORDED
from mcadvantage.agents.state_keys import episode_round_keys

#: Keys at four generation calls of a batch of three episodes (call t: after t tool rounds for those still in the
#: loop). Episode 0 played 3 rounds; episode 1 left the loop after 1 round (its environment then stayed "b1"), and
#: episode 2 had 1 round recorded and a second one dropped for the budget, whose calls ran ("c2!").
SNAPSHOTS = [
    ["a0", "b0", "c0"],
    ["a1", "b1", "c1"],
    ["a2", "b1", "c2!"],
    ["a3", "b1", "c2!"],
]


def test_every_recorded_round_has_its_key_and_later_snapshots_are_not_the_episodes():
    assert episode_round_keys(SNAPSHOTS, 0, 3) == {0: "a0", 1: "a1", 2: "a2", 3: "a3"}
    assert episode_round_keys(SNAPSHOTS, 1, 1) == {0: "b0", 1: "b1"}
    # The dropped round's calls ran after call 1, so call 2 on is not one of the episode's rounds.
    assert episode_round_keys(SNAPSHOTS, 2, 1) == {0: "c0", 1: "c1"}
    assert episode_round_keys(SNAPSHOTS, 1, 0) == {0: "b0"}  # no tool round: the key after reset


def test_environments_without_a_state_key_give_no_keys():
    mixed = [[NOT_RECORDED, "k0"], [NOT_RECORDED, "k1"]]
    assert episode_round_keys(mixed, 0, 1) == {}
    assert episode_round_keys(mixed, 1, 1) == {0: "k0", 1: "k1"}


def test_the_final_key_stands_in_only_where_no_snapshot_holds_the_last_round():
    # Nothing recorded (GRPO's generation replaced from outside): the key the environment ended with.
    assert episode_round_keys([], 0, 2, final="end") == {2: "end"}
    assert episode_round_keys([], 0, 2) == {}
    # Recorded: the snapshot of the last round, as the model saw it, wins over the pooled instance's final key.
    assert episode_round_keys(SNAPSHOTS, 0, 3, final="after get_reward") == {
        0: "a0",
        1: "a1",
        2: "a2",
        3: "a3",
    }
    # Fewer snapshots than rounds: those there are, and the final key for the last round.
    assert episode_round_keys(SNAPSHOTS[:2], 0, 3, final="a3") == {0: "a0", 1: "a1", 3: "a3"}
