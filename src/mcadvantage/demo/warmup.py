"""Supervised warm-up for the demo: a plain PyTorch loop on (prompt, reference solution) pairs.

The examples are ``(prompt, completion)`` pairs, so the caller decides what is demonstrated (the demo
mixes in flawed solutions, see :func:`mcadvantage.demo.task.skip_last_solution`).

A hand-written loop rather than TRL's ``SFTTrainer`` because the demo needs exactly one thing, a
few hundred AdamW steps on a 1M-parameter model with the loss on completion tokens only, and a
plain loop keeps that fast (no dataset preprocessing pass, no Trainer start-up) and its progress bar
in one place. :func:`train_to_plateau` runs it under the regime protocol's plateau rule (:func:`plateau_reached`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from mcadvantage.demo.config import DemoConfig, DemoData

__all__ = ["TrainingState", "encode_example", "plateau_reached", "supervised_warmup", "train_to_plateau"]


@dataclass
class TrainingState:
    """Where a :func:`supervised_warmup` run stands after ``step`` steps, besides the model's weights: enough to
    continue it exactly (same batches, same optimizer moments, same learning rate) after an interruption.

    Attributes:
        step: steps taken.
        optimizer: the AdamW state dict.
        scheduler: the learning-rate scheduler's state dict.
        data_rng: the shuffling generator's state (``random.Random.getstate()``).
        order: the examples of the current pass not yet used (taken from its end).
    """

    step: int
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    data_rng: Any
    order: list[int] = field(default_factory=list)


def encode_example(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt + completion + EOS`` and the matching labels (``-100`` on the prompt,
    so only the completion is learned). The prompt is tokenized on its own, as TRL tokenizes
    prompts at RL time, so the warm-up sees exactly the token boundary the RL trainer will."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, [-100] * len(prompt_ids) + completion_ids


def supervised_warmup(
    model: torch.nn.Module,
    tokenizer: Any,
    examples: Sequence[tuple[str, str]],
    *,
    steps: int,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    warmup_ratio: float = 0.05,
    decay_ratio: float = 0.2,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    resume_from: TrainingState | None = None,
    save_state: Callable[[TrainingState], None] | None = None,
    save_every: int = 0,
) -> list[dict[str, float]]:
    """Train ``model`` in place for ``steps`` AdamW steps on ``examples``, ``(prompt, completion)``
    pairs (shuffled, cycled; the loss is on the completion and EOS only).

    The learning rate warms up linearly over the first ``warmup_ratio`` of the steps, stays at
    ``learning_rate``, then decays linearly to a tenth of it over the last ``decay_ratio`` of the steps
    (a warmup-stable-decay schedule: in a short run, the constant phase learns faster than a cosine
    that starts decaying at once, and the final decay settles the weights).

    ``progress(step, loss)`` is called after every step; ``stop(step)``, if given, right after it, and a true answer
    ends the training there (the schedule is not shortened: stopping early leaves the learning rate where it was).
    Returns the loss log
    (``{"step", "loss", "seconds"}`` every step).

    Resuming: ``save_state(state)`` is called every ``save_every`` steps, after ``progress`` and before ``stop``;
    a run given that state as ``resume_from`` (same arguments, the model holding that step's weights) continues at
    the next step and takes exactly the steps the uninterrupted run would (its log starts there).
    """
    _check_schedule(steps, batch_size, len(examples), warmup_ratio, decay_ratio)
    encoded = [encode_example(tokenizer, prompt, completion) for prompt, completion in examples]
    rng = random.Random(seed)
    order: list[int] = []
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0, betas=(0.9, 0.98))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _warmup_stable_decay(steps, warmup_ratio, decay_ratio)
    )
    first = 0
    if resume_from is not None:
        optimizer.load_state_dict(resume_from.optimizer)
        scheduler.load_state_dict(resume_from.scheduler)
        rng.setstate(resume_from.data_rng)
        order = list(resume_from.order)
        first = resume_from.step
    model.train()
    log: list[dict[str, float]] = []
    start = time.perf_counter()
    pad = tokenizer.pad_token_id
    for step in range(first, steps):
        batch = []
        for _ in range(batch_size):
            if not order:  # the examples shuffled again, in place
                order[:] = range(len(encoded))
                rng.shuffle(order)
            batch.append(encoded[order.pop()])
        input_ids, labels, attention = _padded(batch, pad)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        value = loss.detach().item()
        log.append({"step": step + 1, "loss": value, "seconds": time.perf_counter() - start})
        if progress is not None:
            progress(step + 1, value)
        if save_state is not None and save_every and (step + 1) % save_every == 0:
            save_state(
                TrainingState(
                    step=step + 1,
                    optimizer=optimizer.state_dict(),
                    scheduler=scheduler.state_dict(),
                    data_rng=rng.getstate(),
                    order=list(order),
                )
            )
            model.train()
        if stop is not None and stop(step + 1):
            break
    model.eval()
    return log


def _check_schedule(
    steps: int, batch_size: int, examples: int, warmup_ratio: float, decay_ratio: float
) -> None:
    """:func:`supervised_warmup`'s arguments, refused with what they must be."""
    if steps < 0:
        raise ValueError(f"supervised_warmup: steps must be >= 0, got {steps}.")
    if batch_size < 1:
        raise ValueError(f"supervised_warmup: batch_size must be >= 1, got {batch_size}.")
    if not examples:
        raise ValueError("supervised_warmup: examples is empty; pass at least one (prompt, completion) pair.")
    if not 0 <= warmup_ratio + decay_ratio <= 1 or warmup_ratio < 0 or decay_ratio < 0:
        raise ValueError(
            f"supervised_warmup: warmup_ratio ({warmup_ratio}) and decay_ratio ({decay_ratio}) must be >= 0 "
            "and sum to at most 1."
        )


def _warmup_stable_decay(steps: int, warmup_ratio: float, decay_ratio: float) -> Callable[[int], float]:
    """The learning rate's factor at each step: a linear warm-up over ``warmup_ratio`` of the steps, 1, then a linear
    decay to 0.1 over the last ``decay_ratio``."""
    warmup_steps = max(1, int(warmup_ratio * steps))
    decay_steps = int(decay_ratio * steps)
    decay_start = steps - decay_steps

    def lr_factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if step < decay_start or decay_steps == 0:  # no decay phase asked for
            return 1.0
        return 1.0 - 0.9 * (step - decay_start + 1) / decay_steps

    return lr_factor


def _padded(
    batch: list[tuple[list[int], list[int]]], pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids (right-padded with ``pad``), labels (-100 past each example) and the attention mask of a batch."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, lab) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(lab)] = torch.tensor(lab)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention


def plateau_reached(scores: Sequence[float], *, patience: int, num_problems: int) -> bool:
    """The plateau stop rule of docs/regime-protocol.md on a list of validation accuracies (oldest first): True once
    the last ``patience`` evaluations have not beaten the best *earlier* one by more than one binomial standard error
    of that best (``sqrt(b (1 - b) / num_problems)``). Fewer than ``patience + 1`` evaluations never stop.

    Why one SE and not "any improvement": on 600 problems the SE is about 0.02, so a policy still rising by less
    than that per ``patience`` evaluations gains less than one accuracy's noise, which is the protocol's meaning of a
    plateau (the "more SFT" arm must then gain no more than 1 SE)."""
    if patience < 1:
        raise ValueError(f"plateau_reached: patience must be >= 1, got {patience}.")
    if num_problems < 1:
        raise ValueError(f"plateau_reached: num_problems must be >= 1, got {num_problems}.")
    if len(scores) <= patience:
        return False
    best = max(scores[:-patience])
    margin = math.sqrt(max(best * (1.0 - best), 0.0) / num_problems)
    return max(scores[-patience:]) <= best + margin


def train_to_plateau(
    config: DemoConfig,
    data: DemoData,
    model: Any,
    tokenizer: Any,
    *,
    evaluate: Callable[[Any], float] | None,
    on_step: Callable[[int, float], None] | None,
    log_path: Path | None = None,
    state_path: Path | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """The regime protocol's warm-up (docs/regime-protocol.md): a constant learning rate after the fixed recipe's
    40-step linear warm-up, greedy accuracy on ``data.validation_set`` every ``config.warmup_eval_every`` steps, stop
    by :func:`~mcadvantage.demo.warmup.plateau_reached` from ``config.warmup_min_steps`` on (or at
    ``config.warmup_max_steps``), back to the best
    checkpoint, then ``config.warmup_decay_steps`` steps with the learning rate decaying linearly to a tenth (a fresh
    AdamW: the decay is short and the moments of the constant phase would be from a later policy than the best one).

    Returns the record ``warmup.json`` keeps: the validation curve, the held-out curve (``evaluate``, at the same
    points, when given), the best step and the stop step. ``log_path`` gets the curves so far after every
    evaluation (an hour-long run shows where it is, and a killed one what it had reached). ``state_path`` gets what
    resuming needs after every evaluation of the constant phase, and ``resume=True`` continues from it (see
    :func:`train_warmup_policy`)."""
    if not data.validation_set:
        raise ValueError("warmup_schedule='plateau' needs a validation set: set validation_problems >= 1.")
    run = _PlateauRun(config, data, model, tokenizer, evaluate, log_path, state_path)
    resumed = run.resume() if resume and state_path is not None and state_path.exists() else None
    if resumed is None:
        run.checkpoint(0)
    stop_step = resumed.step if resumed is not None else 0
    # A run resumed exactly where the rule had stopped has nothing left to train.
    if resumed is None or not run.stop(resumed.step):
        log = supervised_warmup(
            model,
            tokenizer,
            data.warmup,
            steps=config.warmup_max_steps,
            batch_size=config.warmup_batch_size,
            learning_rate=config.warmup_lr,
            warmup_ratio=min(1.0, 40 / config.warmup_max_steps),
            decay_ratio=0.0,
            seed=config.seed,
            progress=lambda step, loss: run.progress(step, loss, on_step),
            stop=run.stop,
            resume_from=resumed,
            save_state=run.save_state if state_path is not None else None,
            save_every=config.warmup_eval_every,
        )
        stop_step = int(log[-1]["step"]) if log else stop_step
    run.record["stop_step"] = stop_step
    model.load_state_dict(run.best["state"])
    if config.warmup_decay_steps:
        supervised_warmup(
            model,
            tokenizer,
            data.warmup,
            steps=config.warmup_decay_steps,
            batch_size=config.warmup_batch_size,
            learning_rate=config.warmup_lr,
            warmup_ratio=0.0,
            decay_ratio=1.0,
            seed=config.seed + 1,
            progress=(lambda step, loss: on_step(run.record["stop_step"] + step, loss)) if on_step else None,
        )
    # The final policy is the best checkpoint plus the decay, reported apart from the curves (whose steps count the
    # constant phase).
    run.record["final_validation"] = run.validation_accuracy()
    if evaluate is not None:
        run.record["final_held_out"] = evaluate(model)
    model.eval()
    if resumed is not None:
        run.record["resumed_from_step"] = resumed.step
    return run.record


class _PlateauRun:
    """What :func:`train_to_plateau`'s constant phase keeps between steps: the record (``warmup.json``'s curves),
    the best checkpoint so far, and the settings a resumed run must share."""

    def __init__(
        self,
        config: DemoConfig,
        data: DemoData,
        model: Any,
        tokenizer: Any,
        evaluate: Callable[[Any], float] | None,
        log_path: Path | None,
        state_path: Path | None,
    ) -> None:
        from mcadvantage.demo.config import warmup_settings
        from mcadvantage.tasks.gsm8k import GSM8KVerifier

        self.config, self.data, self.model, self.tokenizer = config, data, model, tokenizer
        self.evaluate, self.log_path, self.state_path = evaluate, log_path, state_path
        self.grade = GSM8KVerifier().score
        self.record: dict[str, Any] = {"validation": [], "held_out": [], "best_step": 0, "stop_step": 0}
        self.best: dict[str, Any] = {
            "score": -1.0,
            "state": None,
        }  # the best step itself is record["best_step"]
        # Thread counts change kernels' summation order, hence the weights: a resumed run must keep its own.
        self.settings = {**warmup_settings(config), "threads": config.threads}

    def validation_accuracy(self) -> float:
        """Greedy accuracy on the validation set (the model back in training mode after)."""
        from mcadvantage.demo.evaluation import evaluate_accuracy

        acc, _, _ = evaluate_accuracy(
            self.model,
            self.tokenizer,
            self.data.validation_set,
            self.grade,
            max_new_tokens=self.config.max_completion_length,
        )
        self.model.train()
        return acc

    def checkpoint(self, step: int) -> None:
        """Evaluate at ``step``: the curves, the best checkpoint, and the log so far."""
        import copy
        import json

        score = self.validation_accuracy()
        self.record["validation"].append((float(step), score))
        if self.evaluate is not None:
            self.record["held_out"].append((float(step), self.evaluate(self.model)))
            self.model.train()
        if score > self.best["score"]:
            self.best.update(score=score, state=copy.deepcopy(self.model.state_dict()))
            self.record["best_step"] = step
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text(json.dumps(self.record), encoding="utf-8")

    def resume(self) -> Any:
        """Load the saved state (the model, the record, the best checkpoint); returns the training state to resume."""
        import torch

        # Our own file (written by save_state), so a full unpickle is safe; it holds the data generator's state.
        saved = torch.load(self.state_path, weights_only=False)
        # (A state saved before "threads" was recorded does not hold it.)
        changed = sorted(
            k for k in self.settings if saved["settings"].get(k, self.settings[k]) != self.settings[k]
        )
        if changed:
            raise ValueError(
                f"{self.state_path} was written by a warm-up with other settings ({', '.join(changed)} differ); "
                "resume it with the settings it was started with, or delete the file to start afresh."
            )
        self.model.load_state_dict(saved["model"])
        self.record = saved["record"]
        self.best.update(score=saved["best_score"], state=saved["best_state"])
        return saved["training"]

    def save_state(self, state: Any) -> None:
        """What resuming needs, written beside and then renamed: a run killed while saving keeps its previous one."""
        import torch

        partial = self.state_path.with_name(self.state_path.name + ".partial")
        torch.save(
            {
                "settings": self.settings,
                "model": self.model.state_dict(),
                "record": self.record,
                "best_score": self.best["score"],
                "best_state": self.best["state"],
                "training": state,
            },
            partial,
        )
        partial.replace(self.state_path)

    def progress(self, step: int, loss: float, on_step: Callable[[int, float], None] | None) -> None:
        """After each step: a checkpoint every ``warmup_eval_every`` steps, then the caller's ``on_step``."""
        if step % self.config.warmup_eval_every == 0:
            self.checkpoint(step)
        if on_step is not None:
            on_step(step, loss)

    def stop(self, step: int) -> bool:
        """The plateau rule, from ``warmup_min_steps`` on, at evaluation steps."""
        if step % self.config.warmup_eval_every or step < self.config.warmup_min_steps:
            return False
        scores = [score for _, score in self.record["validation"]]
        return plateau_reached(
            scores, patience=self.config.warmup_patience, num_problems=len(self.data.validation_set)
        )
