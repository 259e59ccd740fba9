"""Guards a training run keeps while it runs: no non-finite loss or gradient reaches the optimizer, and no
damaged checkpoint is resumed from.

``Trainer`` steps the optimizer after the micro-batches' backward passes whatever their values: one NaN gradient
turns every weight NaN and the run goes on, logging a loss of 0 or NaN. And ``Trainer.train`` loads a checkpoint
file by file, so a run killed while saving leaves a checkpoint that fails halfway through loading, after some state
was already replaced. The trainer (``GRPOTrainerHooks.training_step`` and ``train`` in
:mod:`mcadvantage.trainer.trl_compat`) calls these functions; the decisions and the messages are here.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["checkpoint_to_resume", "nonfinite_step_problem", "refuse_nonfinite_step"]


def nonfinite_step_problem(loss: torch.Tensor, parameters: Iterable[torch.nn.Parameter]) -> str | None:
    """What is not finite after a training step's backward pass (the loss first, then the gradients), or None.

    Args:
        loss: the step's loss (any shape; every element is checked).
        parameters: the model's parameters; only those with a gradient are checked, and only when the loss is
            finite (the parameters are not walked otherwise).
    """
    if not bool(torch.isfinite(loss.detach()).all()):
        return f"the loss is {float(loss.detach().float().mean())}"
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)).all()):
        return "a gradient is not finite"
    return None


def refuse_nonfinite_step(
    loss: torch.Tensor, model: torch.nn.Module, *, global_step: int, learning_rate: float, num_iterations: int
) -> None:
    """Raise ``FloatingPointError`` when the step's loss or a gradient is not finite, after clearing the
    gradients, so the optimizer step that follows the backward passes is never taken with them: the weights stay
    those of the last optimizer step and the last checkpoint is intact.

    Args:
        loss: the loss ``training_step`` returned.
        model: the model whose gradients the backward pass filled.
        global_step: the optimizer step about to be taken (for the message).
        learning_rate, num_iterations: the run's settings, named in the message as the common causes.
    """
    problem = nonfinite_step_problem(loss, model.parameters())
    if problem is None:
        return
    model.zero_grad(set_to_none=True)
    raise FloatingPointError(
        f"Training diverged at global step {global_step}: {problem}, so the optimizer step was not "
        "taken (the weights are those of the last step; the last checkpoint is intact). Common causes: a "
        f"learning rate too high for this model (learning_rate={learning_rate}), several PPO epochs "
        f"on one batch (num_iterations={num_iterations}), or non-finite inputs. Lower the learning "
        "rate or resume from the last checkpoint with other settings."
    )


def checkpoint_to_resume(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint ``Trainer.train`` should resume from, with its files verified first.

    Args:
        resume_from_checkpoint: as for ``Trainer.train``: None or False (start afresh), True (the last checkpoint
            in ``output_dir``) or a checkpoint directory.
        output_dir: the run's ``output_dir``, searched when ``resume_from_checkpoint`` is True.

    Returns:
        None to start afresh, else the checkpoint directory (verified).

    Raises:
        ValueError: ``resume_from_checkpoint=True`` and ``output_dir`` holds no checkpoint.
        CheckpointError: an empty, truncated or corrupted file in the checkpoint (a run killed while saving),
            naming it and an earlier complete checkpoint, before anything is loaded or written
            (:func:`~mcadvantage.trainer.checkpoints.verify_checkpoint`).
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    from transformers.trainer_utils import get_last_checkpoint

    from mcadvantage.trainer.checkpoints import verify_checkpoint

    if resume_from_checkpoint is True:
        resume_from_checkpoint = get_last_checkpoint(output_dir)
        if resume_from_checkpoint is None:
            raise ValueError(f"No checkpoint to resume from in output_dir={output_dir!r}.")
    verify_checkpoint(resume_from_checkpoint)
    return resume_from_checkpoint
