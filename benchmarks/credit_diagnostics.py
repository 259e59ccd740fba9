"""Credit-assignment diagnostics on the demo's starting policy: how close each estimator's values and advantages
are to ground truth, and the paper's ranking test.

    python benchmarks/credit_diagnostics.py                      # the shipped warm-up checkpoint (seed 0)
    python benchmarks/credit_diagnostics.py --model DIR --prompts 16 --ground_truth_k 256
    python benchmarks/credit_diagnostics.py --critic RUN/ppo_trainer/final \
        --json benchmarks/results/credit_diagnostics_ppo.json --output_dir benchmarks/results/credit_diagnostics_ppo

``--critic DIR``: a policy and its PPO critic saved together (the ``ppo`` arm of
``benchmarks/learning_efficiency.py`` keeps them in ``<arm>_trainer/final``); the diagnostics then run on that
policy and score the critic's values (``diagnose_credit(value_functions=...)``) next to Monte Carlo's.

Held-out demo problems (disjoint from every training prompt), responses sampled at the RL temperature (0.6) with
the transformers sampler, ``mcadvantage.evaluation.diagnostics.diagnose_credit``: ground-truth state values from
``--ground_truth_k`` rollouts, VinePPO at K = 1, 3, 9 from fresh rollouts, GRPO's and RLOO's implied credit, the
ranking test on sampled alternative next steps. Prints the table, writes
``benchmarks/results/credit_diagnostics.json`` and the plots and HTML report under
``benchmarks/results/credit_diagnostics/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the shipped demo warm-up checkpoint")
    parser.add_argument(
        "--critic", default=None, help="a directory with a policy and its advantage_estimator.pt"
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--responses_per_prompt", type=int, default=4)
    parser.add_argument("--ground_truth_k", type=int, default=128)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 9])
    parser.add_argument("--alternatives", type=int, default=4)
    parser.add_argument("--ranking_states", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output_dir", default=str(ROOT / "benchmarks" / "results" / "credit_diagnostics"))
    parser.add_argument(
        "--min_operations",
        type=int,
        default=0,
        help="only held-out prompts with at least this many operations (5: the plateau policy's hard prompts)",
    )
    parser.add_argument(
        "--task",
        default="demo",
        help="the study task whose held-out problems and response budget to use (testbed.tasks."
        "TASK_PRESETS: demo, long, slip, sign); give its policy with --model",
    )
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "credit_diagnostics.json"))
    args = parser.parse_args(argv)

    import torch

    from mcadvantage import GSM8KVerifier, TransformersSampler
    from mcadvantage.demo.arms import load_policy
    from mcadvantage.demo.config import shipped_warmup_dir
    from mcadvantage.evaluation.diagnostics import diagnose_credit
    from testbed.tasks import TASK_PRESETS, StudyConfig, held_out_problems

    if args.task not in TASK_PRESETS:
        parser.error(
            f"--task {args.task!r} is not a study task; choose one of {', '.join(sorted(TASK_PRESETS))}."
        )
    torch.set_num_threads(args.threads)
    config = replace(StudyConfig(), **TASK_PRESETS[args.task])
    model_dir = args.model or args.critic or str(shipped_warmup_dir())
    model, tokenizer = load_policy(model_dir)
    model.eval()
    value_functions = {}
    if args.critic is not None:
        from mcadvantage.estimators import CriticEstimator, EstimatorContext

        critic = CriticEstimator()
        critic.load_state_dict(torch.load(Path(args.critic) / "advantage_estimator.pt", weights_only=True))
        critic.ensure_value_model(EstimatorContext.single_process(None, [], tokenizer, policy_model=model))
        value_functions["ppo critic"] = critic.predict_values
    problems = held_out_problems(config, args.prompts, min_operations=args.min_operations)
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in problems]
    sampler = TransformersSampler(model, tokenizer, temperature=config.temperature, max_batch_sequences=1024)
    t0 = time.perf_counter()
    result = diagnose_credit(
        sampler,
        tokenizer,
        GSM8KVerifier(),
        rows,
        segmenter="gsm8k",
        responses_per_prompt=args.responses_per_prompt,
        ground_truth_k=args.ground_truth_k,
        ks=args.ks,
        alternatives=args.alternatives,
        ranking_states=args.ranking_states,
        max_new_tokens=config.max_completion_length,
        seed=args.seed,
        value_functions=value_functions,
    )
    seconds = time.perf_counter() - t0
    print(result.table())
    paths = result.save(args.output_dir)
    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    out = {
        "machine": machine_info(threads=args.threads),
        "command": "python benchmarks/credit_diagnostics.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "model": "shipped demo warm-up (seed 0)" if args.model is None and args.critic is None else model_dir,
        "seconds": seconds,
        "settings": result.settings,
        "estimators": result.estimators,
        "outputs": {
            k: str(Path(v).relative_to(ROOT)) if Path(v).is_relative_to(ROOT) else str(v)
            for k, v in paths.items()
        },
    }
    Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    print(f"{seconds:.0f} s; wrote {args.json} and {args.output_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
