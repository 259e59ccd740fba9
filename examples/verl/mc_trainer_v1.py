"""mcadvantage's advantages in verl's default (V1) trainer: a recipe (not run in CI: it needs Ray and GPUs; see
docs/howto/verl.md, and tests/integrations/test_integration_verl_v1.py for the training step it changes, run on CPU).

verl's V1 task runner builds the trainer its registry holds for ``trainer.v1.trainer_mode``. This recipe's task
runner first puts ``MCAdvantageV1Mixin`` on that trainer (``register_mc_trainer``), in the Ray actor that builds it,
and changes nothing else: ``_compute_advantage`` runs verl's own computation, then writes the configured
estimator's advantages (``mcadvantage.advantage_estimator``: ``vineppo``, ``anchor``, ...) in its place.

Run: python examples/verl/mc_trainer_v1.py [hydra overrides] (see run_mc_v1_gsm8k.sh).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def mc_task_runner(module: ModuleType | None = None) -> Any:
    """verl's V1 task runner, told to build the mcadvantage trainer, as the Ray actor class ``run_ppo`` expects.

    ``TaskRunnerV1`` is declared with ``@ray.remote`` and Ray refuses subclasses of actor classes, so the subclass
    derives from the plain class behind it and is made an actor here.

    Args:
        module: the module holding ``TaskRunnerV1`` (default: ``verl.trainer.main_ppo``).
    """
    import ray

    module = module if module is not None else importlib.import_module("verl.trainer.main_ppo")
    base = getattr(module.TaskRunnerV1, "__ray_actor_class__", module.TaskRunnerV1)

    class MCAdvantageTaskRunner(base):
        def run(self, config):
            from mcadvantage.integrations.verl_v1 import register_mc_trainer

            register_mc_trainer(
                config.trainer.v1.trainer_mode
            )  # in the actor: its registry builds the trainer
            return super().run(config)

    return ray.remote(MCAdvantageTaskRunner)


def main() -> None:
    """verl's ``main_ppo`` entry point (device, config checks, ``run_ppo``) with the recipe's task runner."""
    import hydra
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    runner = mc_task_runner()

    @hydra.main(config_path="config", config_name="mc_trainer_v1", version_base=None)
    def entry(config):
        auto_set_device(config)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        run_ppo(config, task_runner_class=runner)

    entry()


if __name__ == "__main__":
    main()
