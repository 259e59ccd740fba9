"""VinePPO in verl: a ``RayPPOTrainer`` recipe (not run in CI: it needs Ray and GPUs; see docs/howto/verl.md).

``VinePPORayTrainer`` leaves ``RayPPOTrainer.fit`` as it is and overrides one hook, ``_update_actor``, which
``fit`` calls after reward computation and ``compute_advantage``: it wakes the rollout replicas (``fit`` puts
them to sleep after generation), samples Monte Carlo continuations from every step boundary through
``mcadvantage.integrations.verl.VerlRolloutSampler`` on ``self.async_rollout_manager``, overwrites
``batch.batch["advantages"]`` / ``["returns"]``, puts the replicas back to sleep and updates the actor.
``algorithm.adv_estimator=vineppo`` selects a registered placeholder (zeros) so ``compute_advantage`` does no
wasted group statistics; the real advantages are written just before the update.

Run: python examples/verl/vineppo_trainer.py --config-path examples/verl/config --config-name vineppo_trainer ...
(see run_vineppo_gsm8k.sh).
"""

from __future__ import annotations

import importlib
import os
import sys

import torch
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from mcadvantage import MCSettings, VinePPOEstimator
from mcadvantage.integrations.verl import VerlRolloutSampler, compute_vineppo_advantage, verl_reward_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # prefix_agent_loop for the rollout workers

PREFIX_AGENT_LOOP = "mcadvantage_prefix"


def register_vineppo_estimator() -> None:
    """``algorithm.adv_estimator=vineppo``: zeros from ``compute_advantage``; the trainer writes the real ones."""
    try:
        core_algos.get_adv_estimator_fn("vineppo")
        return
    except ValueError:
        pass

    @core_algos.register_adv_est("vineppo")
    def vineppo_placeholder(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **_):
        zeros = torch.zeros_like(token_level_rewards, dtype=torch.float32)
        return zeros, zeros


class VinePPORayTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` with VinePPO's Monte Carlo advantages; configured by the ``vineppo`` config section."""

    def _vineppo(self):
        cfg = self.config.get("vineppo", {})
        return cfg

    def _update_actor(self, batch: DataProto) -> DataProto:
        cfg = self._vineppo()
        if self.use_critic:
            raise ValueError("VinePPO replaces the critic: set critic.enable=False.")
        rollout_cfg = self.config.actor_rollout_ref.rollout
        sampler = VerlRolloutSampler(
            self.async_rollout_manager,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            temperature=rollout_cfg.temperature,
            max_batch_size=cfg.get("max_batch_size", None),
            # verl's agent-loop manager splits every call evenly over its workers (DataProto.chunk).
            size_divisor=int(rollout_cfg.agent.num_workers),
            agent_name=PREFIX_AGENT_LOOP,
        )
        estimator = VinePPOEstimator(
            # the Monte Carlo keys under VinePPOConfig's names, each missing one at the library's default
            settings=MCSettings.from_mapping(cfg),
            step_segmenter=cfg.get("step_segmenter", "gsm8k"),
        )
        self.checkpoint_manager.wake_up_replicas()  # fit sleeps them after generation; weights are unchanged
        try:
            metrics = compute_vineppo_advantage(
                batch,
                sampler=sampler,
                reward_funcs=verl_reward_function(),
                tokenizer=self.tokenizer,
                estimator=estimator,
                max_completion_length=int(self.config.data.max_response_length),
                whiten=bool(cfg.get("whiten_advantages", True)),
            )
        finally:
            self.checkpoint_manager.sleep_replicas()
        actor_output = super()._update_actor(batch)
        actor_output.meta_info.setdefault("metrics", {}).update(metrics)
        return actor_output


def _task_runner_module():
    """verl 0.9 keeps the RayPPOTrainer task runner in main_ppo_v0, 0.8 in main_ppo."""
    try:
        return importlib.import_module("verl.trainer.main_ppo_v0")
    except ImportError:
        return importlib.import_module("verl.trainer.main_ppo")


def vineppo_task_runner(module=None):
    """verl's task runner, told to build ``VinePPORayTrainer``, as the Ray actor class ``run_ppo`` expects.

    ``run_ppo(config, task_runner_class)`` calls ``task_runner_class.remote()``. verl 0.9 declares its
    ``TaskRunner`` with ``@ray.remote``, and Ray refuses a subclass of an actor class, so the subclass derives
    from the plain class behind it (``__ray_actor_class__``); verl 0.8's ``TaskRunner`` is a plain class. Either
    way the subclass is made an actor here, with ``num_cpus=1`` as verl 0.8's ``run_ppo`` gives its own runner.

    Args:
        module: the module holding ``TaskRunner`` and the ``RayPPOTrainer`` name its ``run`` builds (default:
            the installed verl's, see ``_task_runner_module``).
    """
    import ray

    module = module if module is not None else _task_runner_module()
    base = getattr(module.TaskRunner, "__ray_actor_class__", module.TaskRunner)

    class VinePPOTaskRunner(base):
        def run(self, config):
            register_vineppo_estimator()
            # The task runner builds this class (its module's global RayPPOTrainer); nothing else changes.
            module.RayPPOTrainer = VinePPORayTrainer
            return super().run(config)

    return ray.remote(num_cpus=1)(VinePPOTaskRunner)


def main() -> None:
    import hydra
    from verl.trainer.main_ppo import run_ppo

    runner = vineppo_task_runner()

    @hydra.main(config_path="config", config_name="vineppo_trainer", version_base=None)
    def entry(config):
        register_vineppo_estimator()
        run_ppo(config, task_runner_class=runner)

    entry()


if __name__ == "__main__":
    main()
