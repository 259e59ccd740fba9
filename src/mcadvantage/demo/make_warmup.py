"""Train the demo's warm-up checkpoint: ``python -m mcadvantage.demo.make_warmup --output_dir DIR``.

The repository ships the result for seed 0 in ``mcadvantage/demo/warmup_policy/`` (made with
``python -m mcadvantage.demo.make_warmup --output_dir src/mcadvantage/demo/warmup_policy``), so the demo
starts RL at once instead of spending five of its ten minutes on supervised training. Next to the weights
it writes ``warmup.json``: the settings (the demo uses the checkpoint only when its own settings match),
the held-out learning curve of the warm-up, the held-out accuracy, the torch version and the machine.

What a seed fixes: the problem sets, the flawed demonstrations, the initial weights and the order of the
demonstrations. What it does not: floating-point results of CPU kernels differ between CPU types and
torch builds (vectorised reductions sum in different orders), and the argmax of a greedy decode or the
draw of a sample can flip on such a difference, after which two runs diverge. On one machine and one
torch build, two runs with the same seed give bit-identical weights (checked by
``tests/test_demo.py::test_warmup_is_bit_identical_on_one_machine``); on another machine, retraining gives
a different, equally valid checkpoint. Shipping the checkpoint removes that source of difference from the
demo; the RL part still runs CPU kernels, so its numbers agree across machines only within run-to-run
noise.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mcadvantage.demo.config import WARMUP_FIELDS, DemoConfig, build_data
from mcadvantage.demo.run import _quiet_libraries

__all__ = ["make_warmup", "main"]


def make_warmup(config: DemoConfig, output_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Train the warm-up policy of ``config`` and save it, with ``warmup.json``, to ``output_dir``.
    Returns the metadata written to ``warmup.json``."""
    import torch
    from tqdm.auto import tqdm

    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.arms import train_warmup_policy
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
    t0 = time.perf_counter()
    with tqdm(total=config.warmup_steps, desc="warm-up (SFT)", unit="step", disable=not progress) as bar:
        model, tokenizer, curve = train_warmup_policy(
            config,
            data,
            output_dir,
            evaluate=lambda m: accuracy(m, curve_set),
            on_step=lambda step, loss: bar.update(1),
        )
    seconds = time.perf_counter() - t0
    meta = {
        "config": {name: getattr(config, name) for name in WARMUP_FIELDS},
        "full_config": asdict(config),
        "curve_on_first_problems": curve,
        "curve_problems": config.curve_problems,
        "held_out_accuracy": accuracy(model, data.eval_set),
        "eval_problems": len(data.eval_set),
        "seconds": seconds,
        "torch": torch.__version__,
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "command": f"python -m mcadvantage.demo.make_warmup --seed {config.seed} --output_dir {output_dir}",
    }
    (Path(output_dir) / "warmup.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m mcadvantage.demo.make_warmup``."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see mcadvantage.demo.run.main
    parser = argparse.ArgumentParser(
        prog="python -m mcadvantage.demo.make_warmup", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup_steps", type=int, default=DemoConfig.warmup_steps)
    parser.add_argument("--quick", action="store_true", help="the demo's --quick sizes (tests)")
    args = parser.parse_args(argv)
    config = DemoConfig(seed=args.seed, warmup_steps=args.warmup_steps)
    if args.quick:
        config.apply_quick()
        config.quick = True
        config.warmup_steps = args.warmup_steps if args.warmup_steps != DemoConfig.warmup_steps else 20
    meta = make_warmup(config, args.output_dir)
    print(
        f"warm-up: held-out accuracy {meta['held_out_accuracy']:.3f} ({meta['eval_problems']} problems), "
        f"{meta['seconds']:.0f} s; wrote {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
