"""``mcadvantage.trainer.guards``: the non-finite step guard and the checkpoint check before resuming, as pure
functions (the end-to-end runs are in tests/trainer/test_nonfinite.py and tests/faults/)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.trainer.checkpoints import CheckpointError  # noqa: E402
from mcadvantage.trainer.guards import (  # noqa: E402
    checkpoint_to_resume,
    nonfinite_step_problem,
    refuse_nonfinite_step,
)


def _model_with_grad(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(2, 1)
    for p in model.parameters():
        p.grad = torch.full_like(p, value)
    return model


def test_finite_loss_and_gradients_pass():
    model = _model_with_grad(0.5)
    assert nonfinite_step_problem(torch.tensor(1.0), model.parameters()) is None
    refuse_nonfinite_step(torch.tensor(1.0), model, global_step=3, learning_rate=1e-6, num_iterations=1)
    assert all(p.grad is not None for p in model.parameters())  # left as they were


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_loss_is_named_before_the_gradients_are_looked_at(loss):
    class Exploding:
        def __iter__(self):
            raise AssertionError("the parameters must not be walked when the loss already is not finite")

    assert nonfinite_step_problem(torch.tensor([1.0, loss]), Exploding()) == f"the loss is {loss}"


def test_a_nonfinite_gradient_is_found_and_the_step_refused():
    model = _model_with_grad(0.5)
    model.bias.grad = torch.tensor([math.inf])
    assert nonfinite_step_problem(torch.tensor(1.0), model.parameters()) == "a gradient is not finite"
    with pytest.raises(FloatingPointError) as raised:
        refuse_nonfinite_step(torch.tensor(1.0), model, global_step=7, learning_rate=0.5, num_iterations=2)
    message = str(raised.value)
    assert message.startswith(
        "Training diverged at global step 7: a gradient is not finite, so the optimizer"
    )
    assert "learning_rate=0.5" in message and "num_iterations=2" in message
    assert all(p.grad is None for p in model.parameters())  # cleared: no optimizer step can use them


def test_parameters_without_gradients_are_not_a_problem():
    model = torch.nn.Linear(2, 1)  # no backward yet: every grad is None
    assert nonfinite_step_problem(torch.tensor(0.0), model.parameters()) is None


@pytest.mark.parametrize("start_afresh", [None, False])
def test_no_resume_needs_no_checkpoint(start_afresh, tmp_path):
    assert checkpoint_to_resume(start_afresh, str(tmp_path)) is None


def test_resume_true_without_a_checkpoint_names_the_output_dir(tmp_path):
    with pytest.raises(ValueError, match=r"No checkpoint to resume from in output_dir='.*'\."):
        checkpoint_to_resume(True, str(tmp_path))


def test_resume_from_a_broken_checkpoint_raises_before_loading(tmp_path):
    broken = tmp_path / "checkpoint-2"
    broken.mkdir()
    with pytest.raises(CheckpointError):
        checkpoint_to_resume(str(broken), str(tmp_path))
    with pytest.raises(CheckpointError):
        checkpoint_to_resume(True, str(tmp_path))  # True finds the same (last) checkpoint
