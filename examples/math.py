"""VinePPO on MATH, as in the paper (Kazemnejad et al., arXiv 2410.01679), or on GSM8K with ``--task gsm8k``: the
RhoMath 1.1B SFT checkpoint, ``VinePPOConfig.from_paper(task)`` (Table 1, K = 9 Monte Carlo rollouts per step, the official code's
rollout budget and truncation rewards), Pass@1 at temperature 0.35 over 16 samples.

    accelerate launch examples/math.py                                   # MATH, the paper's RhoMath 1.1B
    accelerate launch --config_file examples/accelerate_configs/single_gpu.yaml examples/math.py --task gsm8k
    accelerate launch --config_file examples/accelerate_configs/multi_gpu_zero2.yaml examples/math.py \\
        --task gsm8k --model_name_or_path realtreetune/deepseekmath-7b-sft-GSM8K

Every ``mcadvantage.VinePPOConfig`` / ``trl.GRPOConfig`` field is a flag (``--num_mc_rollouts 3``,
``--vllm_mode server``, ...), as are ``trl.ModelConfig``'s and the data/evaluation flags of
``examples/_common.py`` (``--train_file``, ``--eval_file``, ``--pass_at_1_samples``, ...); ``--config
recipe.yaml`` sets any of them from a file. See examples/README.md.

Data (``TASKS`` in ``examples/_common.py``): MATH train and MATH-500, or GSM8K train and test, from the Hub unless
``--train_file`` / ``--eval_file`` give local JSONL files. Steps are cut with the task's segmenter (paper
Appendix B); answers are graded by ``MathVerifier`` (last \\boxed{}, math-verify equivalence) or
``GSM8KVerifier`` (the number after the last ``####``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

# Named after the task, this script shares its name with the standard library's math module.
_HERE = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
_ELSEWHERE = [p for p in sys.path if os.path.realpath(os.path.abspath(p or os.curdir)) != _HERE]
if __name__ == "math":
    # This folder stood ahead of the standard library on a path (a PYTHONPATH holding it, `python -m` run from here)
    # and an `import math` found this file: it puts the standard library's module in its place (an import returns
    # what sys.modules holds once the file has run), and the rest of the file only defines functions.
    import importlib.machinery
    import importlib.util

    _spec = importlib.machinery.PathFinder.find_spec("math", _ELSEWHERE)
    sys.modules["math"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["math"])
else:
    # Run as the script: Python put this folder first on sys.path, where this file would shadow `import math` for
    # every library loaded after it; the folder moves behind the standard library (its helper _common.py still
    # imports from it).
    sys.path[:] = [*_ELSEWHERE, _HERE]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train VinePPO from the SFT checkpoint, save it, and measure Pass@1 (or, with ``--evaluate_only``, only
    measure the checkpoint). Returns a summary; everything is also written to ``--output_dir``."""
    from _common import (
        TASKS,
        eval_source,
        load_problems,
        logger,
        parse_args,
        pass_at_1_settings,
        prompt_token_limit,
        setup_logging,
    )
    from transformers import AutoTokenizer
    from trl import get_peft_config, get_quantization_config

    from mcadvantage import VinePPOTrainer, evaluate_checkpoint, evaluate_pass_at_1
    from mcadvantage.core.prompts import filter_long_prompts

    # Arguments: the paper's settings for --task as defaults; --config recipe.yaml and flags override them.
    script_args, training_args, model_args = parse_args(argv)
    setup_logging(training_args)
    task = TASKS[script_args.task]
    model_path, output_dir = model_args.model_name_or_path, training_args.output_dir
    verifier = task.verifier()
    settings = pass_at_1_settings(script_args, training_args)
    source = eval_source(script_args)
    summary: dict[str, Any] = {"task": task.name, "model": model_path, "output_dir": output_dir}

    if script_args.evaluate_only:  # Pass@1 of the checkpoint alone, in this process (e.g. the SFT model)
        if training_args.world_size > 1:
            raise ValueError(
                "--evaluate_only runs in one process; launch it with `python examples/math.py`, not with "
                "several accelerate processes (use tensor/data parallel vLLM settings for a large model instead)."
            )
        eval_dataset = load_problems(task=task, script_args=script_args, split="eval")
        result = evaluate_checkpoint(
            model_path,
            eval_dataset,
            verifier,
            settings,
            engine=script_args.pass_at_1_engine,
            dtype=model_args.dtype,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        path = result.save(
            output_dir, "pass_at_1", dataset=eval_dataset, model=model_path, eval_problems=source
        )
        logger.info("%s: %s (written to %s)", model_path, result.summary(), path)
        return {**summary, "pass_at_1": result.pass_at_1}

    # Data: the problems in the SFT checkpoints' prompt format. TRL does not truncate prompts and the trainer
    # refuses a prompt that leaves no room for a full response, so such training problems are dropped here.
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    with training_args.main_process_first(desc="loading the problems"):
        train_dataset = load_problems(task=task, script_args=script_args, split="train")
        max_prompt = prompt_token_limit(script_args, training_args, model_args)
        if max_prompt is not None:
            train_dataset = filter_long_prompts(train_dataset, tokenizer, max_prompt)
        need_eval = script_args.run_pass_at_1 or script_args.pass_at_1_before_training
        need_eval = need_eval or training_args.eval_strategy != "no"
        eval_dataset = load_problems(task=task, script_args=script_args, split="eval") if need_eval else None

    # Trainer: GRPOTrainer with Monte Carlo step advantages (vLLM colocated by default).
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }
    trainer = VinePPOTrainer(
        model=model_path,
        reward_funcs=verifier,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )
    is_main = trainer.accelerator.is_main_process
    engine = script_args.pass_at_1_engine
    if script_args.pass_at_1_before_training:  # the starting checkpoint, on the same engine
        initial = evaluate_pass_at_1(trainer, eval_dataset, verifier, settings, engine=engine)
        if is_main:
            initial.save(
                output_dir, "pass_at_1_initial", dataset=eval_dataset, model=model_path, eval_problems=source
            )
        logger.info("Before training: %s", initial.summary())
        summary["pass_at_1_initial"] = initial.pass_at_1

    # Train and save: the model and tokenizer, train_results.json, trainer_state.json (every logged metric,
    # VinePPO's mc/* included).
    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(output_dir)
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()
    logger.info("Model saved to %s", output_dir)

    # Evaluate: Pass@1 of the trained policy on the trainer's own engine.
    if script_args.run_pass_at_1:
        result = evaluate_pass_at_1(trainer, eval_dataset, verifier, settings, engine=engine)
        if is_main:
            path = result.save(
                output_dir, "pass_at_1", dataset=eval_dataset, model=output_dir, eval_problems=source
            )
            trainer.save_metrics(
                "pass_at_1", {"pass_at_1": result.pass_at_1, "pass_at_1_std": result.std_over_rounds}
            )
            logger.info("After training: %s (written to %s)", result.summary(), path)
        summary["pass_at_1"] = result.pass_at_1

    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    # End trackers and destroy the process group now: left to interpreter exit, gloo's worker threads can abort
    # the process after a finished run. Not with a colocated vLLM engine, whose shutdown still needs the group.
    if not (trainer.use_vllm and trainer.vllm_mode == "colocate"):
        trainer.accelerator.end_training()
    return summary


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers warns after fork otherwise
    main()
