"""The studies' arm names: every RL arm of the demo's grammar (:func:`mcadvantage.demo.config.parse_arm`) and the
arms without RL that the studies compare against, run by ``benchmarks/rl_free_arms.py``:

- ``"sft"``: more supervised steps on the warm-up demonstrations, what a user could do instead of RL;
- ``"restem"``: RestEM (the paper's RL-free baseline): rounds of sampling from the current policy, keeping the
  verified-correct responses, and fine-tuning the starting policy on them;
- ``"dpo_plus"``: DPO+ (the paper's other RL-free baseline): responses sampled once from the starting policy,
  (correct, incorrect) pairs per prompt, ``trl.DPOTrainer`` with the NLL term on the chosen response.

The demo runs RL arms only, so these names are the testbed's, not the package's.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcadvantage.demo import config as demo_config
from mcadvantage.demo.config import ArmSpec

__all__ = ["RL_FREE_ARMS", "RLFreeArm", "parse_arm"]

#: The arms without RL, by name (each is its own kind).
RL_FREE_ARMS = ("sft", "restem", "dpo_plus")


@dataclass(frozen=True)
class RLFreeArm:
    """An arm without RL (one of :data:`RL_FREE_ARMS`); ``prompts_per_step`` None means the config's, as for an RL
    arm without ``_p<P>``."""

    name: str
    prompts_per_step: int | None = None


def parse_arm(name: str) -> ArmSpec | RLFreeArm:
    """:class:`RLFreeArm` for a name in :data:`RL_FREE_ARMS`, else the demo's :class:`~mcadvantage.demo.config.ArmSpec`
    (:func:`mcadvantage.demo.config.parse_arm`'s grammar); an unknown name is refused with both lists."""
    if name in RL_FREE_ARMS:
        return RLFreeArm(name)
    try:
        return demo_config.parse_arm(name)
    except ValueError as err:
        raise ValueError(
            f"{str(err).rstrip('.')}, or an arm without RL: {', '.join(map(repr, RL_FREE_ARMS))}."
        ) from None
