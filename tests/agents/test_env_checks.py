"""samplers/env_checks.py: the environment contract where replay cannot check it (issue 59). A shallow fork is found
by what it shares with its source, with or without a ``state_key``; a fork in another state, or a source moved on,
by its key and ``get_reward()``; a deep copy passes. The seeded generators an environment holds are found and their
draws seen; a ``state_key`` that raises or is a method is named."""

from __future__ import annotations

import copy
import random

import pytest

from mcadvantage.agents.env_checks import (
    NOT_RECORDED,
    EnvironmentContractError,
    check_fork,
    check_reseeded,
    check_state_key_declared,
    random_streams,
    read_state_key,
    shared_mutable_state,
)


class Board:
    """No ``state_key``: its state is a nested dict of lists; a frozen task is shared by design."""

    TASK = ("shared", "read-only")

    def __init__(self):
        self.cells = {"row": [0, 0, 0]}
        self.history = []
        self.task = Board.TASK
        self.rng = random.Random(0)

    def get_reward(self):
        return float(sum(self.cells["row"]))


def test_a_shallow_copy_shares_every_mutable_attribute_and_a_deep_copy_none():
    board = Board()
    assert shared_mutable_state(copy.copy(board), board) == [
        ".cells",
        ".cells['row']",
        ".history",
        ".rng",
    ]
    assert shared_mutable_state(copy.deepcopy(board), board) == []
    assert shared_mutable_state(board, board) == ["(the instance itself)"]


def test_a_shallow_fork_without_a_state_key_is_refused_naming_fork_the_attribute_and_deepcopy():
    board = Board()
    with pytest.raises(
        EnvironmentContractError, match=r"^environment Board \(batch row 2\): _fork\(\) returned"
    ) as err:
        check_fork(copy.copy(board), board, where="batch row 2")
    assert ".history" in str(err.value) and "copy.deepcopy(self)" in str(err.value)
    check_fork(copy.deepcopy(board), board)  # independent and in the same state: passes


class Keyed(Board):
    @property
    def state_key(self):
        return tuple(self.cells["row"])


def test_a_fork_in_another_state_or_a_source_moved_on_is_refused():
    source = Keyed()
    other = copy.deepcopy(source)
    other.cells["row"][0] = 1
    with pytest.raises(
        EnvironmentContractError, match=r"in another state .*state_key \(1, 0, 0\) where the source"
    ):
        check_fork(other, source)
    with pytest.raises(
        EnvironmentContractError, match=r"has state_key \(0, 0, 0\), but the episode's state there"
    ):
        check_fork(copy.deepcopy(source), source, expected_key=(0, 0, 1))


def test_seeded_generators_are_found_and_a_draw_without_reseed_is_refused():
    np = pytest.importorskip("numpy")
    board = Board()
    board.np_rng = np.random.default_rng(0)
    board.unseeded = random.SystemRandom()
    before = random_streams(board)
    assert sorted(before) == [".np_rng", ".rng"]
    check_reseeded(board, before)  # nothing drawn yet
    board.np_rng.random()
    with pytest.raises(
        EnvironmentContractError, match=r"random generator \.np_rng after .* has no _reseed\(seed\)"
    ):
        check_reseeded(board, before, where="batch row 0")

    class Reseeds(Board):
        def _reseed(self, seed):
            self.rng = random.Random(seed)

    reseeds = Reseeds()
    streams = random_streams(reseeds)
    reseeds.rng.random()
    check_reseeded(reseeds, streams)  # it declares _reseed: its draws are fresh by contract


class Raises:
    @property
    def state_key(self):
        return self.missing


class Method:
    def state_key(self):
        return 0


def test_a_state_key_that_raises_or_is_a_method_is_named():
    with pytest.raises(
        EnvironmentContractError,
        match=r"^environment Raises \(local episode 3\): reading its state_key raised AttributeError",
    ):
        read_state_key(Raises(), "local episode 3")
    with pytest.raises(
        TypeError, match=r"Method.state_key is a function, not a property.*Declare it with @property"
    ):
        check_state_key_declared(Method)
    with pytest.raises(TypeError, match="Declare it with @property"):
        read_state_key(Method())
    assert read_state_key(Board()) is NOT_RECORDED and read_state_key(None) is NOT_RECORDED
    assert read_state_key(Keyed()) == (0, 0, 0)
    check_state_key_declared(Keyed)
