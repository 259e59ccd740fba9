"""VinePPO on MATH, as in the paper (Kazemnejad et al., arXiv 2410.01679): RhoMath 1.1B SFT checkpoint, K = 9
Monte Carlo rollouts per step, Table 1 hyperparameters, Pass@1 at temperature 0.35 over 16 samples.

    accelerate launch --config_file examples/accelerate_configs/single_gpu.yaml examples/math.py
    accelerate launch --config_file examples/accelerate_configs/multi_gpu_zero2.yaml examples/math.py \\
        --model_name_or_path realtreetune/deepseekmath-7b-sft-MATH-v2

Every ``mcadvantage.VinePPOConfig`` / ``trl.GRPOConfig`` field is a flag (``--num_mc_rollouts 3``,
``--vllm_mode server``, ...), as are ``trl.ModelConfig``'s and the data/evaluation flags of
``examples/_common.py`` (``--train_file``, ``--eval_file``, ``--pass_at_1_samples``, ...); ``--config
recipe.yaml`` sets any of them from a file. See examples/README.md.

Data: training problems from the MATH train split (7,500 problems; the paper trained on 11,500 problems of
the PRM800K split, pass them with --train_file), evaluation on MATH-500 (the paper's test set). Steps are
cut with the "math" segmenter (paper Appendix B); answers are graded by ``MathVerifier`` (last \\boxed{},
math-verify equivalence).
"""

from __future__ import annotations

import os
import sys

# This file is called math.py, and Python puts a script's folder first on sys.path, where the file would
# shadow the standard library's `math` module for every later import (math is not built into CPython on
# every platform). Move the folder to the end: `import math` then finds the standard library, and the
# examples' own `_common` module is still found.
_HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "math":  # a process started inside examples/ found this file before the standard library
    raise ImportError(
        f"{__file__} was imported in place of the standard library's math module because the current directory "
        "is examples/. Run the examples from the repository root: accelerate launch examples/math.py ..."
    )
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE] + [_HERE]

from _common import TaskSpec, run_from_command_line  # noqa: E402


def make_verifier():
    """MATH grader: the last \\boxed{} of a response, math-verify equivalence to the gold answer (the
    dataset's `answer` column, or the last box of its `solution` column)."""
    from mcadvantage import MathVerifier

    return MathVerifier()


TASK = TaskSpec(
    name="MATH",
    model_name_or_path="realtreetune/rho-1b-sft-MATH",
    dataset_name="DigitalLearningGmbH/MATH-lighteval",
    dataset_config=None,
    dataset_train_split="train",
    eval_dataset_name="HuggingFaceH4/MATH-500",
    eval_dataset_config=None,
    eval_dataset_split="test",
    problem_column="problem",
    gold_columns=("answer", "solution"),
    step_segmenter="math",
    ppo_iterations=1000,  # Table 1: 1000 PPO iterations on MATH
    make_verifier=make_verifier,
)


if __name__ == "__main__":
    run_from_command_line(TASK)
