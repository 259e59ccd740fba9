"""The reward checks the trainer applies to GRPO's grading of the training responses, as pure functions:
infinite rewards (``check_finite_reward_table``), which reward function failed on which row
(``locate_reward_error``), and the reward of a truncated response (``rewards.truncation``). End to end they are
run by tests/trainer/test_nonfinite.py, tests/faults/ and tests/trainer/test_fidelity.py."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.rewards.errors import (  # noqa: E402
    RewardFunctionError,
    check_finite_reward_table,
    locate_reward_error,
)
from mcadvantage.rewards.truncation import score_truncated_responses, truncated_responses  # noqa: E402

PROMPTS = ["1+1=", "2+2="]
COMPLETIONS = ["2", "four"]


def test_finite_and_unscorable_rewards_pass():
    table = torch.tensor([[1.0, math.nan], [0.0, 0.5], [0.2, 0.1], [math.nan, 0.0]])
    check_finite_reward_table(table, ["a", "b"], PROMPTS, COMPLETIONS, process_index=0)


def test_an_infinite_reward_of_this_process_is_quoted():
    table = torch.tensor([[1.0, 0.0], [0.0, -math.inf], [math.inf, 0.0], [0.0, 0.0]])
    with pytest.raises(RewardFunctionError) as raised:
        check_finite_reward_table(table, ["a", "b"], PROMPTS, COMPLETIONS, process_index=0)
    err = raised.value
    assert (err.func_name, err.row) == ("b", 1)  # the first infinite value in row order
    assert str(err).startswith(
        "reward function 'b' returned -inf for row 1 of the training batch (prompt '2+2='; completion 'four')."
    )


def test_an_infinite_reward_of_another_process_names_the_process():
    table = torch.tensor([[1.0], [0.0], [0.0], [math.inf]])  # 2 processes x 2 rows; row 3 is process 1's
    with pytest.raises(RewardFunctionError, match=r"for row 3 of the training batch \(on process 1\)"):
        check_finite_reward_table(table, ["a"], PROMPTS, COMPLETIONS, process_index=0)
    with pytest.raises(RewardFunctionError, match=r"for row 3 of the training batch \(prompt '2\+2='"):
        check_finite_reward_table(table, ["a"], PROMPTS, COMPLETIONS, process_index=1)


def test_the_failing_function_and_row_are_located():
    def fine(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    def breaks_on_four(prompts, completions, **kwargs):
        return [float(len(c)) if c != "four" else 1 / 0 for c in completions]

    kwargs = dict(prompts=PROMPTS, completions=COMPLETIONS, completion_ids=[[1], [2]], trainer_state=None)
    err = locate_reward_error(
        [(fine, "fine"), (breaks_on_four, "counts")], kwargs, where="training responses"
    )
    assert isinstance(err, RewardFunctionError) and (err.func_name, err.row) == ("counts", 1)
    assert "raised ZeroDivisionError: division by zero on row 1 of the training responses it graded" in str(
        err
    )
    assert locate_reward_error([(fine, "fine")], kwargs, where="training responses") is None


def test_truncated_responses_are_those_without_a_stop_token():
    stop = {2, 0, None}  # EOS 2, padding 0 (a tokenizer without padding gives None)
    assert truncated_responses([[5, 2], [5, 6], [], [7, 0]], stop) == [False, True, True, False]


def test_truncated_responses_score_the_value_on_every_function_without_touching_the_input():
    rewards = torch.tensor([[1.0, 0.5], [1.0, math.nan], [0.0, 0.0]])
    scored = score_truncated_responses(rewards, torch.tensor([False, True, True]), 0.0)
    assert torch.equal(scored, torch.tensor([[1.0, 0.5], [0.0, 0.0], [0.0, 0.0]]))
    assert rewards[1, 0] == 1.0  # the input is unchanged
