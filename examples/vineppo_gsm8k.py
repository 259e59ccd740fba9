"""VinePPO on GSM8K, as in the paper (Kazemnejad et al., arXiv 2410.01679): RhoMath 1.1B SFT checkpoint, K = 9
Monte Carlo rollouts per step, Table 1 hyperparameters, Pass@1 at temperature 0.35 over 16 samples.

    accelerate launch --config_file examples/accelerate_configs/single_gpu.yaml examples/gsm8k.py
    accelerate launch --config_file examples/accelerate_configs/multi_gpu_zero2.yaml examples/gsm8k.py \\
        --model_name_or_path realtreetune/deepseekmath-7b-sft-GSM8K

Every ``mcadvantage.VinePPOConfig`` / ``trl.GRPOConfig`` field is a flag (``--num_mc_rollouts 3``,
``--vllm_mode server``, ...), as are ``trl.ModelConfig``'s and the data/evaluation flags of
``examples/_common.py`` (``--train_file``, ``--eval_file``, ``--pass_at_1_samples``, ...); ``--config
recipe.yaml`` sets any of them from a file. See examples/README.md.

Data: GSM8K train (7,473 problems; the paper held 373 out for validation) and test (1,319 problems, the
paper's test set). Steps are one per line, the final ``#### N`` line joining the last step ("gsm8k"
segmenter, paper Appendix B); answers are graded by ``GSM8KVerifier`` (the number after the last ``####``).
"""

from __future__ import annotations

import os
import sys

# Keep the examples' folder after the standard library on sys.path (see math.py, whose name needs it), and
# still find the shared `_common` module.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE] + [_HERE]

from _common import TaskSpec, run_from_command_line  # noqa: E402


def make_verifier():
    """GSM8K grader: the number after the last `####` must equal the gold answer (the dataset's `answer`
    column, a reference solution ending in `#### N`)."""
    from mcadvantage import GSM8KVerifier

    return GSM8KVerifier()


TASK = TaskSpec(
    name="GSM8K",
    model_name_or_path="realtreetune/rho-1b-sft-GSM8K",
    dataset_name="openai/gsm8k",
    dataset_config="main",
    dataset_train_split="train",
    eval_dataset_name="openai/gsm8k",
    eval_dataset_config="main",
    eval_dataset_split="test",
    problem_column="question",
    gold_columns=("answer",),
    step_segmenter="gsm8k",
    ppo_iterations=650,  # Table 1: 650 PPO iterations on GSM8K
    make_verifier=make_verifier,
)


if __name__ == "__main__":
    run_from_command_line(TASK)
