"""Each estimator owns its settings: every field ``VinePPOConfig`` adds to ``GRPOConfig`` is walked against every
registered estimator. A field the estimator reads reaches it (the built estimator differs, or the config refuses the
value, naming the field); a field another estimator reads is refused with the field, the estimator in use and the
fix. The Monte Carlo settings' effect on the advantages themselves is walked in
``tests/estimators/test_every_mc_setting.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("trl")

from trl import GRPOConfig  # noqa: E402

from mcadvantage import VinePPOConfig  # noqa: E402
from mcadvantage.core.settings import mc_config_names  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    available_advantage_estimators,
    build_advantage_estimator,
    get_advantage_estimator,
)
from mcadvantage.testing import chunk4  # noqa: E402
from mcadvantage.trainer.config import estimator_owned_fields  # noqa: E402

#: Fields every estimator shares (read by the trainer, not by one estimator), and why none is owned.
TRAINER_FIELDS = {
    "advantage_estimator": "chooses the estimator",
    "whiten_advantages": "the trainer whitens any estimator's advantages",
    "truncated_completion_reward": "the trainer grades every training response",
    "mc_max_batch_sequences": "the transformers sampler's batch size, for rollouts, trees and evaluation",
    "mc_estimate_on_eval": "refused for estimators that sample nothing (uses_rollouts=False)",
    "env_max_sessions": "every estimator's episodes share an OpenEnv environment's sessions",
}

#: A non-default value for every owned field, with what it needs beside it to be valid.
CHANGES: dict[str, dict] = {
    "gae_gamma": {"gae_gamma": 0.9},
    "gae_lambda": {"gae_lambda": 0.95},
    "critic_value_clip": {"critic_value_clip": 0.5},
    "critic_learning_rate": {"critic_learning_rate": 1e-4},
    "critic_model": {"critic_model": "/nonexistent/value-model"},
    "critic_warmup_steps": {"critic_warmup_steps": 2},
    "hybrid_budget": {"hybrid_budget": 0.5},
    "tree_branching": {"tree_branching": [2, 4]},
    "tree_depths": {"tree_depths": [0, 3]},
    "anchor_state": {"anchor_state": "observation"},
    "anchor_gamma": {"anchor_gamma": 0.9},
    "anchor_weight": {"anchor_weight": 0.5},
    "anchor_scope": {"anchor_scope": "batch"},
    "anchor_credit": {"anchor_credit": "pooled"},
    "step_segmenter": {"step_segmenter": chunk4},
    "num_mc_rollouts": {"num_mc_rollouts": 3},
    "mc_rollout_budget": {"mc_rollout_budget": "fixed", "mc_fixed_rollout_budget": 4},
    "mc_fixed_rollout_budget": {"mc_rollout_budget": "fixed", "mc_fixed_rollout_budget": 4},
    "mc_max_estimated_steps": {"mc_max_estimated_steps": 2},
    "mc_truncated_reward": {"mc_truncated_reward": 0.0},
    "mc_steps_after_cap": {"mc_max_estimated_steps": 2, "mc_steps_after_cap": "zero"},
    "mc_min_step_tokens": {"mc_min_step_tokens": 2},
    "mc_reuse_samples": {"mc_reuse_samples": True},
    "mc_allocation": {"mc_allocation": "variance"},
    "mc_min_rollouts": {"mc_allocation": "variance", "mc_min_rollouts": 2},
}


def _config(name: str, **settings) -> VinePPOConfig:
    return VinePPOConfig(
        output_dir="unused",
        report_to="none",
        use_cpu=True,
        advantage_estimator=name,
        max_completion_length=16,
        **settings,
    )


def _own_fields() -> set[str]:
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {f.name for f in dataclasses.fields(VinePPOConfig)} - grpo


def test_every_own_field_is_owned_by_an_estimator_or_shared_for_a_reason():
    owned = estimator_owned_fields(VinePPOConfig)
    assert not owned & set(TRAINER_FIELDS)
    assert owned | set(TRAINER_FIELDS) == _own_fields()
    assert set(CHANGES) == owned  # a new owned field needs a value to walk with
    assert set(mc_config_names().values()) <= owned


def _state(estimator) -> dict:
    """What from_config put into the estimator (its attributes, Monte Carlo settings included)."""
    state = {key: repr(value) for key, value in vars(estimator).items() if key != "rng"}
    for part in ("monte_carlo", "grpo"):
        if part in vars(estimator):
            state.update({f"{part}.{k}": repr(v) for k, v in vars(vars(estimator)[part]).items()})
    return state


@pytest.mark.parametrize("field_name", sorted(CHANGES))
@pytest.mark.parametrize("name", available_advantage_estimators())
def test_a_field_reaches_the_estimator_that_reads_it_and_is_refused_by_the_others(name, field_name):
    change = CHANGES[field_name]
    reads = get_advantage_estimator(name).config_fields
    if field_name not in reads:
        with pytest.raises(ValueError) as refused:
            _config(name, **change)
        message = str(refused.value)
        assert f"advantage_estimator={name!r} does not read it" in message, message
        assert any(f"{given}=" in message for given in change) and "Drop " in message
        return
    try:
        changed = build_advantage_estimator(name, _config(name, **change))
    except ValueError as err:  # refused by the estimator's own rules, naming the field
        assert any(given in str(err) for given in change), err
        return
    default = build_advantage_estimator(name, _config(name))
    assert _state(changed) != _state(default), f"{field_name} did not reach {name!r}"


@pytest.mark.parametrize("name", available_advantage_estimators())
def test_the_paper_preset_builds_for_every_estimator(name, tmp_path):
    for task in ("gsm8k", "math"):
        config = VinePPOConfig.from_paper(
            task, output_dir=str(tmp_path), report_to="none", use_cpu=True, advantage_estimator=name
        )
        assert config.advantage_estimator == name
        build_advantage_estimator(name, config)
    reads = set(get_advantage_estimator(name).config_fields)
    if "num_mc_rollouts" in reads:
        assert config.num_mc_rollouts == 9 and config.mc_rollout_budget == "fixed"
    else:
        assert config.num_mc_rollouts == VinePPOConfig.__dataclass_fields__["num_mc_rollouts"].default
    if "step_segmenter" in reads:
        assert config.step_segmenter == "math"


def test_the_five_settings_of_the_issue_are_refused_with_the_fix():
    cases = [
        ("grpo", {"mc_reuse_samples": True}, "'hybrid' or 'vineppo'"),
        ("grpo", {"hybrid_budget": 0.5}, "'hybrid'"),
        ("vineppo", {"gae_gamma": 0.9}, "'gae'"),
        ("rloo", {"num_mc_rollouts": 3}, "'hybrid' or 'vineppo'"),
        ("gae", {"tree_branching": [2, 2]}, "'tree'"),
    ]
    for name, given, readers in cases:
        (field_name,) = given
        with pytest.raises(ValueError) as refused:
            _config(name, **given)
        assert str(refused.value).startswith(f"{field_name}=")
        assert f"Drop {field_name}, or choose advantage_estimator={readers}." in str(refused.value)


def test_mc_estimate_on_eval_is_refused_where_evaluation_is_estimated_anyway():
    for name in available_advantage_estimators():
        if get_advantage_estimator(name).uses_rollouts:
            assert _config(name, mc_estimate_on_eval=True).mc_estimate_on_eval
        else:
            with pytest.raises(ValueError, match=rf"mc_estimate_on_eval=True changes nothing .*{name!r}"):
                _config(name, mc_estimate_on_eval=True)


def test_a_third_party_estimator_declares_its_own_field_the_same_way(monkeypatch):
    import torch

    from mcadvantage.estimators import (
        AdvantageEstimator,
        AdvantageResult,
        register_advantage_estimator,
        registry,
    )

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # registered for this test only

    @dataclasses.dataclass
    class MyConfig(VinePPOConfig):
        my_temperature: float = dataclasses.field(default=1.0, metadata={"help": "'softened' only."})

    @register_advantage_estimator("softened")
    class Softened(AdvantageEstimator):
        config_fields = ("my_temperature",)

        def __init__(self, temperature: float = 1.0) -> None:
            self.temperature = temperature

        @classmethod
        def from_config(cls, config):
            return cls(config.my_temperature)

        def estimate(self, batch, context):
            return AdvantageResult(advantages=torch.zeros(batch.completion_mask.shape))

    def config(name, **settings):
        return MyConfig(
            output_dir="unused", report_to="none", use_cpu=True, advantage_estimator=name, **settings
        )

    assert build_advantage_estimator("softened", config("softened", my_temperature=0.5)).temperature == 0.5
    with pytest.raises(
        ValueError, match=r"my_temperature=0.5 is set, but advantage_estimator='vineppo' .*'softened'"
    ):
        config("vineppo", my_temperature=0.5)
    with pytest.raises(ValueError, match=r"num_mc_rollouts=3 is set, but advantage_estimator='softened'"):
        config("softened", num_mc_rollouts=3)
    assert "my_temperature" not in estimator_owned_fields(VinePPOConfig)  # the base config has no such field
