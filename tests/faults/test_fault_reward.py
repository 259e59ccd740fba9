"""A reward function that raises on one row, of the training responses or of the Monte Carlo rollouts.

What is lost: the unfinished optimizer step. Training stops with :class:`mcadvantage.RewardFunctionError` (a
``ValueError``) naming the function and the row it fails on alone, before that step's update; the checkpoint saved
before is intact.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("trl")

from _fault_training import make_trainer  # noqa: E402

pytestmark = pytest.mark.slow


def _picky(fail_on_call: int):
    """A reward that, from its ``fail_on_call``-th batch call on, raises on one response (the third of that
    batch) wherever it meets it again, e.g. when it is called row by row."""
    state = {"calls": 0, "bad": None, "batch": None}

    def picky(prompts, completions, **kwargs):
        if len(completions) > 1:
            state["calls"] += 1
            if state["bad"] is None and state["calls"] == fail_on_call:
                state["bad"], state["batch"] = completions[2], list(completions)
        if state["bad"] is not None and state["bad"] in completions:
            raise ZeroDivisionError("cannot grade this one")
        return [float(len(c) % 2) for c in completions]

    return picky, state


@pytest.mark.parametrize(
    ("estimator", "fail_on_call", "where"),
    [("gae", 2, "training responses"), ("vineppo", 2, "Monte Carlo rollouts")],
    ids=["training-response", "mc-rollout"],
)
def test_reward_function_raising_on_one_row_is_named(
    estimator, fail_on_call, where, tiny_model_dir, tmp_path, record_property
):
    from mcadvantage import RewardFunctionError
    from mcadvantage.trainer.checkpoints import verify_checkpoint

    # gae grades only the responses (call 2 = step 2's responses); vineppo grades step 1's responses (call 1),
    # then that step's rollouts (call 2).
    reward, state = _picky(fail_on_call)
    out = tmp_path / "out"
    trainer = make_trainer(tiny_model_dir, out, estimator=estimator, max_steps=3, reward=reward)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as info:
        trainer.train()
    record_property("seconds", round(time.monotonic() - start, 2))
    err = info.value
    assert isinstance(err, ValueError)
    expected_row = state["batch"].index(state["bad"])  # the first row holding the failing response
    assert err.func_name == "picky" and err.row == expected_row
    message = str(err)
    assert (
        f"reward function 'picky' raised ZeroDivisionError: cannot grade this one on row {expected_row}"
        in message
    )
    assert where in message, message
    # No update from the failing step; what was saved before it is intact.
    expected_step = 1 if estimator == "gae" else 0
    assert trainer.state.global_step == expected_step
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
    assert checkpoints == [f"checkpoint-{s}" for s in range(1, expected_step + 1)]
    for name in checkpoints:
        verify_checkpoint(out / name)
