"""A tiny VinePPOTrainer run for the fault-injection suite, importable by the tests and runnable as a script.

As a script it trains in its own process (so that process can be SIGKILLed) and, with ``--kill-at-step K``,
SIGKILLs itself in the middle of optimizer step K+1: after the responses of that step were generated and graded,
before its loss. Every reward call appends the prompts it graded, with the global step, to ``--record``, so the
tests can compare the data order of two runs.

    python _fault_training.py --model DIR --out DIR --record FILE [--estimator gae] [--max-steps 4]
                              [--kill-at-step K] [--resume CHECKPOINT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

PROMPTS = [f"{a}+{a}=" for a in range(16)]


def make_reward(record: str | os.PathLike[str] | None, kill_at_step: int | None = None):
    """A reward (share of vowels) that logs what it grades; SIGKILLs the process while grading step
    ``kill_at_step + 1`` (``trainer_state.global_step == kill_at_step``)."""

    def vowels(prompts, completions, trainer_state=None, **kwargs):
        step = None if trainer_state is None else trainer_state.global_step
        if kill_at_step is not None and step == kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if record is not None:
            with open(record, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "prompts": list(prompts)}) + "\n")
        text = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in text]

    return vowels


def make_args(out: str | os.PathLike[str], *, estimator: str = "gae", max_steps: int = 4, **overrides: Any):
    from mcadvantage import VinePPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=str(out),
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        advantage_estimator=estimator,
        beta=0.0,
        learning_rate=1e-3,
        max_steps=max_steps,
        num_iterations=1,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        seed=0,
        disable_tqdm=True,
    )
    if estimator == "gae":
        kwargs["critic_learning_rate"] = 1e-3
    else:
        kwargs.update(num_mc_rollouts=2, step_segmenter="newline")
    kwargs.update(overrides)
    return VinePPOConfig(**kwargs)


def make_trainer(
    model: str | os.PathLike[str],
    out,
    *,
    record=None,
    kill_at_step=None,
    reward=None,
    trainer_kwargs=None,
    **kw,
):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from mcadvantage import VinePPOTrainer

    return VinePPOTrainer(
        model=str(model),
        reward_funcs=reward or make_reward(record, kill_at_step),
        args=make_args(out, **kw),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=AutoTokenizer.from_pretrained(str(model)),
        **(trainer_kwargs or {}),
    )


def losses(trainer_or_history) -> dict[int, float]:
    """Logged training loss per global step."""
    history = getattr(getattr(trainer_or_history, "state", None), "log_history", trainer_or_history)
    return {e["step"]: e["loss"] for e in history if "loss" in e}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--record")
    parser.add_argument("--estimator", default="gae")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--resume")
    parser.add_argument("--result")
    a = parser.parse_args()
    trainer = make_trainer(
        a.model,
        a.out,
        record=a.record,
        kill_at_step=a.kill_at_step,
        estimator=a.estimator,
        max_steps=a.max_steps,
    )
    trainer.train(resume_from_checkpoint=a.resume)
    if a.result:
        Path(a.result).write_text(
            json.dumps({"global_step": trainer.state.global_step, "log_history": trainer.state.log_history})
        )


if __name__ == "__main__":
    main()
