"""Train a warm-up checkpoint of the demo or a study task: ``python -m testbed.make_warmup --output_dir DIR`` (run from
the repository's root; the research testbed is not in the installed package).

The package ships the demo's start for seed 0, trained to a plateau (``src/mcadvantage/demo/warmup_plateau/``, made with
``python -m testbed.make_warmup --warmup_schedule plateau --sft_check_steps 400 --output_dir
src/mcadvantage/demo/warmup_plateau``); the repository keeps the 0.1 demo's fixed-schedule one in
``testbed/warmup_policy/`` (``python -m testbed.make_warmup --output_dir testbed/warmup_policy``). So the demo
starts RL at once instead of spending five of its ten minutes on supervised training. Next to the weights
it writes ``warmup.json``: the settings (the demo uses the checkpoint only when its own settings match),
the held-out learning curve of the warm-up, the held-out accuracy, the torch version and the machine.

What a seed fixes: the problem sets, the flawed demonstrations, the initial weights and the order of the
demonstrations. What it does not: floating-point results of CPU kernels differ between CPU types and
torch builds (vectorised reductions sum in different orders), and the argmax of a greedy decode or the
draw of a sample can flip on such a difference, after which two runs diverge. On one machine and one
torch build, two runs with the same seed give bit-identical weights (checked by
``tests/demo/test_demo.py::test_warmup_is_bit_identical_on_one_machine``); on another machine, retraining gives
a different, equally valid checkpoint. Shipping the checkpoint removes that source of difference from the
demo; the RL part still runs CPU kernels, so its numbers agree across machines only within run-to-run
noise.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mcadvantage.demo.config import DemoConfig, validate_config, warmup_settings
from mcadvantage.demo.run import _quiet_libraries
from testbed.machine import machine_info  # where the warm-up was made: commit, versions, CPU, threads
from testbed.tasks import FLAWS, TASK_PRESETS, StudyConfig, build_data

__all__ = [
    "COMMAND",
    "LEGACY_COMMAND",
    "InterruptedWarmup",
    "current_command",
    "make_warmup",
    "main",
    "resumable_step",
]

#: How this module is run (what ``warmup.json`` records as its ``command``).
COMMAND = "python -m testbed.make_warmup"
#: The same command before the research testbed left the package (``command`` of checkpoints recorded until then).
LEGACY_COMMAND = "python -m mcadvantage.demo.make_warmup"


def current_command(recorded: str) -> str:
    """The command that retrains a recorded warm-up today: a ``warmup.json`` ``command`` recorded when this module was
    ``mcadvantage.demo.make_warmup`` runs as ``python -m testbed.make_warmup`` with the same flags (the recorded
    string stays as the history of how the checkpoint was made)."""
    if recorded.startswith(LEGACY_COMMAND + " ") or recorded == LEGACY_COMMAND:
        return COMMAND + recorded[len(LEGACY_COMMAND) :]
    return recorded


class InterruptedWarmup(ValueError):
    """An output directory holds an interrupted warm-up, and the caller did not ask to resume it."""


def resumable_step(save_dir: str | Path) -> int | None:
    """The step an interrupted plateau warm-up in ``save_dir`` would resume from, or None when there is none (its
    state is :data:`mcadvantage.demo.arms.RESUME_FILE`, written by the demo's warm-up trainer)."""
    import torch

    from mcadvantage.demo.arms import RESUME_FILE

    path = Path(save_dir) / RESUME_FILE
    if not path.exists():
        return None
    return int(torch.load(path, weights_only=False)["training"].step)


def make_warmup(
    config: StudyConfig,
    output_dir: str | Path,
    *,
    progress: bool = True,
    sft_check_steps: int = 0,
    task: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train the warm-up policy of ``config`` and save it, with ``warmup.json``, to ``output_dir``.
    Returns the metadata written to ``warmup.json``. With the plateau schedule and ``sft_check_steps``, also the
    plateau evidence of :func:`sft_check`. ``task`` names the ``TASK_PRESETS`` entry ``config`` was made from, for the
    recorded command; by default the first preset whose settings ``config`` has (else ``demo``). ``resume``: continue
    an interrupted plateau warm-up from its last evaluation (``resume_state.pt`` in ``output_dir``, removed once
    ``warmup.json`` is written)."""
    from mcadvantage.demo.arms import RESUME_FILE, train_warmup_policy

    if (Path(output_dir) / RESUME_FILE).exists() and not resume:
        raise InterruptedWarmup(
            f"{Path(output_dir) / RESUME_FILE} holds an interrupted warm-up: pass --resume (resume=True) to continue "
            "it with the same settings, or delete it to start afresh."
        )
    if task is None:
        task = next(
            (name for name, preset in TASK_PRESETS.items()
             if preset and all(getattr(config, k) == v for k, v in preset.items())),
            "demo",
        )  # fmt: skip
    import torch
    from tqdm.auto import tqdm

    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.evaluation import evaluate_accuracy
    from mcadvantage.testing import build_char_tokenizer

    _quiet_libraries()
    torch.set_num_threads(max(1, config.threads))
    data = build_data(config)
    tokenizer = build_char_tokenizer()
    verifier = GSM8KVerifier()

    def accuracy(model: Any, problems: Sequence[Any]) -> float:
        acc, _, _ = evaluate_accuracy(
            model, tokenizer, problems, verifier.score, max_new_tokens=config.max_completion_length
        )
        return acc

    curve_set = data.eval_set[: config.curve_problems]
    plateau = config.warmup_schedule == "plateau"
    record: dict[str, Any] = {}
    t0 = time.perf_counter()
    start_step = (resumable_step(output_dir) if resume and plateau else None) or 0
    if resume and progress:
        print(
            f"warm-up: resuming {output_dir} from step {start_step}"
            if start_step
            else f"warm-up: nothing to resume in {output_dir}; starting afresh"
        )
    with tqdm(
        total=config.warmup_total_steps(),
        initial=start_step,
        desc="warm-up (SFT)",
        unit="step",
        disable=not progress,
    ) as bar:
        model, tokenizer, curve = train_warmup_policy(
            config,
            data,
            output_dir,
            evaluate=lambda m: accuracy(m, curve_set),
            on_step=lambda step, loss: bar.update(1),
            schedule_record=record,
            resume=resume,
            keep_resume_state=True,
        )
    seconds = time.perf_counter() - t0
    meta = {
        "config": warmup_settings(config),
        "full_config": asdict(config),
        "curve_on_first_problems": curve,
        "curve_problems": config.curve_problems,
        "held_out_accuracy": accuracy(model, data.eval_set),
        "eval_problems": len(data.eval_set),
        "seconds": seconds,
        "torch": torch.__version__,
        "machine": machine_info(),
        "command": f"{COMMAND} --seed {config.seed} --output_dir {output_dir}"
        + (f" --warmup_schedule plateau --warmup_patience {config.warmup_patience}" if plateau else "")
        + (
            f" --warmup_decay_steps {config.warmup_decay_steps}"
            if plateau and config.warmup_decay_steps != DemoConfig.warmup_decay_steps
            else ""
        )
        + (f" --task {task}" if task != "demo" else "")
        + (f" --threads {config.threads}" if config.threads != DemoConfig.threads else "")
        + (
            f" --flaw {config.flaw}"
            if config.flaw != TASK_PRESETS[task].get("flaw", StudyConfig.flaw)
            else ""
        ),
    }
    if plateau:
        meta["plateau"] = {
            "validation_curve": record["validation"],
            "final_validation": record["final_validation"],
            "validation_problems": len(data.validation_set),
            "best_step": record["best_step"],
            "stop_step": record["stop_step"],
            "rule": f"from step {config.warmup_min_steps} on, stop when {config.warmup_patience} evaluations in a row (every {config.warmup_eval_every} steps) "
            "have not beaten the best earlier one by more than one binomial SE; then the best checkpoint "
            + (
                f"and {config.warmup_decay_steps} steps of linear decay to 0.1x"
                if config.warmup_decay_steps
                else "as it is (no decay)"
            )
            + " (docs/regime-protocol.md)",
        }
        if sft_check_steps:
            meta["sft_check"] = sft_check(
                config,
                data,
                output_dir,
                steps=sft_check_steps,
                accuracy=accuracy,
                held_out_before=meta["held_out_accuracy"],
            )
    if "resumed_from_step" in record:  # then "seconds" counts the last process only
        meta["plateau"]["resumed_from_step"] = record["resumed_from_step"]
    (Path(output_dir) / "warmup.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    (Path(output_dir) / RESUME_FILE).unlink(missing_ok=True)
    return meta


def sft_check(
    config: StudyConfig,
    data: Any,
    policy_dir: str | Path,
    *,
    steps: int,
    accuracy: Any,
    held_out_before: float,
) -> dict[str, Any]:
    """The protocol's plateau evidence: ``steps`` more supervised steps from the saved policy on the same
    demonstrations, at the decayed learning rate (a tenth of ``warmup_lr``, constant), and the held-out gain they
    buy. The policy counts as plateaued when the gain is at most one binomial SE of the starting accuracy.
    ``held_out_before`` is the saved policy's held-out accuracy, already measured by the caller."""
    import math

    from mcadvantage.demo.arms import load_policy
    from mcadvantage.demo.warmup import supervised_warmup

    model, tokenizer = load_policy(policy_dir)
    before = held_out_before
    model.train()
    supervised_warmup(
        model,
        tokenizer,
        data.warmup,
        steps=steps,
        batch_size=config.warmup_batch_size,
        learning_rate=config.warmup_lr * 0.1,
        warmup_ratio=0.0,
        decay_ratio=0.0,
        seed=config.seed + 2,
    )
    after = accuracy(model, data.eval_set)
    se = math.sqrt(max(before * (1 - before), 0.0) / len(data.eval_set))
    return {
        "steps": steps,
        "learning_rate": config.warmup_lr * 0.1,
        "held_out_before": before,
        "held_out_after": after,
        "gain": after - before,
        "one_se": se,
        "plateaued": after - before <= se,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m testbed.make_warmup``."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see mcadvantage.demo.run.main
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=DemoConfig.threads,
        help="torch intra-op threads (1 leaves a core to another job; kernels' summation order, hence the exact "
        "weights, can depend on it)",
    )
    parser.add_argument("--warmup_steps", type=int, default=DemoConfig.warmup_steps)
    parser.add_argument("--quick", action="store_true", help="the demo's --quick sizes (tests)")
    parser.add_argument(
        "--warmup_schedule",
        choices=("fixed", "plateau"),
        default="fixed",
        help="see DemoConfig.warmup_schedule",
    )
    parser.add_argument(
        "--warmup_patience",
        type=int,
        default=DemoConfig.warmup_patience,
        help="plateau schedule: evaluations without a gain of 1 SE before stopping",
    )
    parser.add_argument(
        "--warmup_decay_steps",
        type=int,
        default=None,
        help=f"plateau schedule: steps of linear learning-rate decay from the best checkpoint (default "
        f"{DemoConfig.warmup_decay_steps}, --quick 10; 0: the best validation checkpoint as it is, the paper's SFT "
        "selection, appendix C.3)",
    )
    parser.add_argument(
        "--sft_check_steps",
        type=int,
        default=400,
        help="plateau schedule: supervised steps of the plateau check (0 skips it)",
    )
    parser.add_argument(
        "--task",
        choices=sorted(TASK_PRESETS),
        default="demo",
        help="the study task whose problems and demonstrations to train on (testbed.tasks.TASK_PRESETS)",
    )
    parser.add_argument(
        "--flaw",
        choices=FLAWS,
        default=None,
        help="how flawed demonstrations go wrong (see testbed.tasks.StudyConfig.flaw; default: the task's; "
        "'--flaw slip' is '--task slip')",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="plateau schedule: continue an interrupted warm-up in --output_dir from its last evaluation",
    )
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}.")
    if args.warmup_decay_steps is not None and args.warmup_schedule != "plateau":
        parser.error("--warmup_decay_steps belongs to the plateau schedule; add --warmup_schedule plateau.")
    if args.resume and args.warmup_schedule != "plateau":
        parser.error(
            "--resume continues a plateau warm-up; add --warmup_schedule plateau (a fixed one is short)."
        )
    config = StudyConfig(
        seed=args.seed,
        threads=args.threads,
        warmup_steps=args.warmup_steps,
        warmup_schedule=args.warmup_schedule,
        warmup_patience=args.warmup_patience,
    )
    config = replace(config, **TASK_PRESETS[args.task])
    if args.flaw is not None:
        config.flaw = args.flaw
    if args.quick:
        config.apply_quick()
        config.quick = True
        config.warmup_steps = args.warmup_steps if args.warmup_steps != DemoConfig.warmup_steps else 20

    if args.warmup_decay_steps is not None:  # after the quick sizes: an explicit value beats them
        config.warmup_decay_steps = args.warmup_decay_steps
    try:
        validate_config(config)  # the demo's one definition of every setting's valid range
    except SystemExit as invalid:
        parser.error(str(invalid))
    try:
        meta = make_warmup(
            config, args.output_dir, sft_check_steps=args.sft_check_steps, task=args.task, resume=args.resume
        )
    except InterruptedWarmup as refused:
        parser.error(str(refused))
    print(
        f"warm-up: held-out accuracy {meta['held_out_accuracy']:.3f} ({meta['eval_problems']} problems), "
        f"{meta['seconds']:.0f} s; wrote {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
