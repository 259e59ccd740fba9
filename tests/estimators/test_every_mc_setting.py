"""Every Monte Carlo setting is honoured or refused by every registered estimator: nothing is silently ignored.

The walk goes over ``available_advantage_estimators()`` and over the fields of
:class:`~mcadvantage.core.settings.MCSettings` (a new setting without a case below fails
``test_every_setting_has_a_case``). Each estimator is built the way the trainer builds it, from a ``VinePPOConfig``
(``build_advantage_estimator``), on the exact toy (3 one-token steps, low pass rate, so the hybrid has degenerate
groups to credit). For an estimator that samples continuations, changing a setting (from a base where it applies)
must change the advantages or be refused when the config is built, with a message naming the config field. A
setting that would have no effect where it is given is refused, not ignored.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from mcadvantage import VinePPOConfig  # noqa: E402
from mcadvantage.core.settings import MCSettings, mc_config_names  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    available_advantage_estimators,
    build_advantage_estimator,
    get_advantage_estimator,
)
from testbed.toys import characters, toy_gradient_task  # noqa: E402

#: setting -> (a base where it applies, the change). The change is one setting, plus the companion a value needs
#: (``rollout_budget="fixed"`` needs ``fixed_rollout_budget``).
CASES: dict[str, tuple[dict, dict]] = {
    "num_rollouts": ({}, {"num_rollouts": 3}),
    "rollout_budget": ({}, {"rollout_budget": "fixed", "fixed_rollout_budget": 1}),
    "fixed_rollout_budget": (
        {"rollout_budget": "fixed", "fixed_rollout_budget": 3},
        {"fixed_rollout_budget": 1},
    ),
    "max_estimated_steps": ({}, {"max_estimated_steps": 1}),
    # A truncated continuation needs a budget shorter than what is left of the response.
    "truncated_reward": ({"rollout_budget": "fixed", "fixed_rollout_budget": 1}, {"truncated_reward": 0.5}),
    "steps_after_cap": ({"max_estimated_steps": 1}, {"steps_after_cap": "zero"}),
    "reuse_samples": ({}, {"reuse_samples": True}),
    "allocation": ({"num_rollouts": 4}, {"allocation": "variance"}),
    "min_rollouts": ({"num_rollouts": 4, "allocation": "variance"}, {"min_rollouts": 3}),
    "min_step_tokens": ({}, {"min_step_tokens": 2}),
}

#: Settings that only act beside another one: given without it they are refused, naming both.
ACTS_ONLY_WITH = {
    "fixed_rollout_budget": ({"fixed_rollout_budget": 4}, "rollout_budget"),
    "min_rollouts": ({"min_rollouts": 2}, "allocation"),
    "steps_after_cap": ({"steps_after_cap": "zero"}, "max_estimated_steps"),
}

LOW = [0.0, 0.05, 0.15, 0.4]  # the toy's pass rates: most groups of 8 all fail (degenerate, for the hybrid)


def _config(name: str, settings: dict, tmp_path) -> VinePPOConfig:
    names = mc_config_names()
    own = {
        "step_segmenter": characters,
        "hybrid_budget": 100.0,  # every degenerate response gets Monte Carlo credit
        "num_mc_rollouts": 2,
        **{names[key]: value for key, value in settings.items()},
    }
    reads = set(get_advantage_estimator(name).config_fields)
    # The base settings go only to the estimators that read them (another estimator's setting is refused); the
    # settings under test go to every estimator, so one that does not read them must refuse them.
    tested = {names[key] for key in settings}
    given = {key: value for key, value in own.items() if key in reads or key in tested}
    return VinePPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        advantage_estimator=name,
        temperature=1.0,
        num_generations=8,
        max_completion_length=8,
        **given,
    )


def _advantages(estimator) -> torch.Tensor:
    """The estimator's advantages on one fixed toy batch, with the sampler's random state reset each time, so two
    calls differ only by the estimator's settings."""
    task = toy_gradient_task(LOW, seed=5)[0]
    batch = task.sample_group(list(range(6)), 8)
    return estimator.estimate(batch, task.context()).advantages


def _mc_settings(estimator) -> MCSettings | None:
    settings = getattr(estimator, "settings", None)
    return settings if isinstance(settings, MCSettings) else None


def test_every_setting_has_a_case():
    assert set(CASES) == {f.name for f in dataclasses.fields(MCSettings)}


@pytest.mark.parametrize("setting", sorted(CASES))
@pytest.mark.parametrize("name", available_advantage_estimators())
def test_changing_a_setting_changes_the_advantages_or_is_refused(name, setting, tmp_path):
    base, change = CASES[setting]
    default = build_advantage_estimator(name, _config(name, {}, tmp_path))
    if _mc_settings(default) is None:
        # An estimator that samples no continuations reads no Monte Carlo setting, so it refuses one, naming it.
        assert not hasattr(default, "monte_carlo")
        with pytest.raises(ValueError, match=rf"advantage_estimator={name!r} does not read it.*Drop"):
            _config(name, {**base, **change}, tmp_path)
        return
    built = []
    for settings in (base, {**base, **change}):
        try:
            built.append(build_advantage_estimator(name, _config(name, settings, tmp_path)))
        except (
            ValueError
        ) as err:  # refused: the message names a config field it was given and says what to do
            assert any(mc_config_names()[key] in str(err) for key in settings), err
            assert "Set " in str(err), err
            return
    base_estimator, changed_estimator = built
    # The config's settings arrive whole.
    assert _mc_settings(base_estimator) == _mc_settings(default).replace(**base)
    assert _mc_settings(changed_estimator) == _mc_settings(base_estimator).replace(**change)
    assert not torch.equal(_advantages(base_estimator), _advantages(changed_estimator)), (name, setting)


@pytest.mark.parametrize("setting", sorted(ACTS_ONLY_WITH))
def test_a_setting_without_its_companion_is_refused(setting, tmp_path):
    given, companion = ACTS_ONLY_WITH[setting]
    names = mc_config_names()
    with pytest.raises(ValueError, match=rf"{names[setting]}=.*{names[companion]}"):
        _config("vineppo", given, tmp_path)
    with pytest.raises(ValueError, match=rf"{setting}=.*{companion}"):
        MCSettings(**given)


def test_the_hybrid_keeps_the_papers_gsm8k_state_cap(tmp_path):
    config = VinePPOConfig.from_paper(
        "gsm8k", output_dir=str(tmp_path), report_to="none", use_cpu=True, advantage_estimator="hybrid"
    )
    hybrid = build_advantage_estimator("hybrid", config)
    paper = VinePPOConfig.from_paper("gsm8k", output_dir=str(tmp_path), report_to="none", use_cpu=True)
    vineppo = build_advantage_estimator("vineppo", paper)
    assert (hybrid.settings.max_estimated_steps, hybrid.settings.steps_after_cap) == (26, "zero")
    assert hybrid.settings == vineppo.settings == MCSettings.from_config(config)


def test_a_setting_set_on_the_estimator_alone_is_refused():
    """``estimator.reuse_samples = True`` would be stored beside the settings the estimator reads, and ignored."""
    from mcadvantage.estimators import VinePPOEstimator

    estimator = VinePPOEstimator(num_rollouts=3)
    with pytest.warns(FutureWarning, match=r"write VinePPOEstimator.settings.num_rollouts instead"):
        assert estimator.num_rollouts == 3  # the old attribute names still read the settings, and warn
    with pytest.raises(
        AttributeError, match=r"VinePPOEstimator.reuse_samples is read from its Monte Carlo settings"
    ):
        estimator.reuse_samples = True
    with pytest.raises(TypeError, match=r"reuse_sample is not a Monte Carlo setting"):
        VinePPOEstimator(reuse_sample=True)


def test_a_mapping_gives_every_setting_under_the_config_names_with_the_one_definitions_defaults():
    """verl's ``vineppo`` section (and any YAML) reads the settings through ``MCSettings.from_mapping``: the same
    names and defaults as ``VinePPOConfig``, one spelling, other keys left to the caller."""
    from mcadvantage import MCSettings as Public

    assert Public is MCSettings
    assert (
        MCSettings.from_mapping({})
        == MCSettings()
        == MCSettings.from_config(VinePPOConfig(output_dir="/tmp/x"))
    )
    given = {
        "num_mc_rollouts": 4,
        "mc_max_estimated_steps": 3,
        "step_segmenter": "gsm8k",
        "whiten_advantages": 1,
    }
    assert MCSettings.from_mapping(given) == MCSettings(num_rollouts=4, max_estimated_steps=3)
    assert set(mc_config_names().values()) <= {f.name for f in dataclasses.fields(VinePPOConfig)}
    with pytest.raises(TypeError, match=r"max_estimated_steps \(use mc_max_estimated_steps\)"):
        MCSettings.from_mapping({"max_estimated_steps": 3})
    with pytest.raises(ValueError, match="num_mc_rollouts=0"):
        MCSettings.from_mapping({"num_mc_rollouts": 0})
