"""The estimator registry and the contract's defaults: registration by identity, classes and instances written to
the 0.1 protocol adapted, one table of built-ins that every hand-written list agrees with, and no optional estimator
attribute read with a default outside the contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import mcadvantage  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    BUILTIN_ESTIMATORS,
    AdvantageEstimator,
    AdvantageResult,
    as_advantage_estimator,
    available_advantage_estimators,
    build_advantage_estimator,
    get_advantage_estimator,
    register_advantage_estimator,
)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "mcadvantage"


class Zeros(AdvantageEstimator):
    """Zero advantages (a minimal subclass)."""

    def estimate(self, batch, context):
        return AdvantageResult(advantages=torch.zeros(batch.completion_mask.shape))


# ---------------------------------------------------------------------------------------------------- defaults


def test_the_contract_defaults_are_the_ones_the_trainer_used_to_assume():
    estimator = Zeros.from_config(None)
    assert isinstance(estimator, Zeros) and Zeros.name is None  # unregistered
    assert (Zeros.whiten_by_default, Zeros.default_scale_rewards) == (False, "none")
    assert (estimator.metric_prefix, estimator.uses_rollouts) == ("advantage", True)
    assert estimator.last_estimate is None and list(estimator.last_rows) == []
    assert Zeros.validate_config(object()) is None
    assert estimator.tree_schedule(64) is None
    assert estimator.state_dict() == {} and not estimator.has_state
    estimator.load_state_dict({})  # the default's empty state loads


def test_state_that_cannot_be_restored_is_refused_not_lost():
    class SavesOnly(Zeros):
        def state_dict(self):
            return {"seen": 3}

    estimator = SavesOnly()
    assert estimator.has_state
    with pytest.raises(NotImplementedError, match=r"SavesOnly saved state .*\['seen'\].*load_state_dict"):
        estimator.load_state_dict(estimator.state_dict())


def test_estimate_is_required():
    with pytest.raises(
        TypeError, match=r"register_advantage_estimator\('test_no_estimate'\): .* has no estimate"
    ):

        @register_advantage_estimator("test_no_estimate")
        class Nothing(AdvantageEstimator):
            pass

    with pytest.raises(NotImplementedError, match="does not implement estimate"):
        AdvantageEstimator().estimate(None, None)


# ------------------------------------------------------------------------------------------ identity, messages


def test_registering_the_same_class_again_is_a_no_op():
    @register_advantage_estimator("test_identity_same")
    class Same(Zeros):
        pass

    assert register_advantage_estimator("TEST_identity_same")(Same) is Same
    assert get_advantage_estimator("test_identity_same") is Same and Same.name == "test_identity_same"


def test_another_class_of_the_same_name_is_refused_with_the_fix():
    def define():
        class Twin(Zeros):
            pass

        return Twin

    first, second = define(), define()
    assert first.__qualname__ == second.__qualname__  # what the old check compared: it replaced silently
    register_advantage_estimator("test_identity_twin")(first)
    with pytest.raises(ValueError) as err:
        register_advantage_estimator("test_identity_twin")(second)
    message = str(err.value)
    qualified = f"{__name__}.{first.__qualname__}"
    assert message == (
        f"advantage estimator 'test_identity_twin' is already registered to {qualified}; {qualified} is a different "
        "class of the same name (its definition ran twice: a re-run notebook cell, a module imported under two "
        "names). Register Twin under another name, or pass register_advantage_estimator('test_identity_twin', "
        "replace=True) to replace the registered class on purpose."
    )
    assert get_advantage_estimator("test_identity_twin") is first
    assert register_advantage_estimator("test_identity_twin", replace=True)(second) is second
    assert get_advantage_estimator("test_identity_twin") is second


def test_a_builtin_name_is_taken_by_the_builtin():
    with pytest.raises(
        ValueError, match=r"'grpo' is already registered to mcadvantage\.estimators\.baselines\."
    ):

        @register_advantage_estimator("grpo")
        class MyGRPO(Zeros):
            pass

    assert get_advantage_estimator("grpo").__name__ == "GRPOEstimator"


# --------------------------------------------------------------------------------------- the 0.1 protocol


def test_a_class_written_to_the_old_protocol_is_adapted_when_registered():
    @register_advantage_estimator("test_legacy_protocol")
    class Legacy:
        whiten_by_default = True
        metric_prefix = "legacy"

        def __init__(self, scale=1.0):
            self.scale = scale

        @classmethod
        def from_config(cls, config):
            return cls(scale=2.0)

        def estimate(self, batch, context):
            return AdvantageResult(advantages=self.scale * batch.completion_mask.float())

    assert issubclass(Legacy, AdvantageEstimator) and Legacy.__name__ == "Legacy"
    assert get_advantage_estimator("test_legacy_protocol") is Legacy
    assert register_advantage_estimator("test_legacy_protocol")(Legacy) is Legacy  # still the same class
    assert Legacy.whiten_by_default and Legacy.default_scale_rewards == "none"  # its own, then the defaults
    built = build_advantage_estimator("test_legacy_protocol", None)
    assert isinstance(built, Legacy) and built.scale == 2.0
    assert (built.metric_prefix, built.uses_rollouts, built.tree_schedule(8)) == ("legacy", True, None)


def test_an_unregistered_instance_of_the_old_protocol_is_viewed_through_the_contract():
    class Counting:
        uses_rollouts = False

        def __init__(self):
            self.calls = 0

        def estimate(self, batch, context):
            self.calls += 1

    original = Counting()
    estimator = build_advantage_estimator(original, None)
    assert isinstance(estimator, AdvantageEstimator) and isinstance(estimator, Counting)
    assert type(estimator).__name__ == "Counting"  # error messages name the user's class
    assert (estimator.uses_rollouts, estimator.metric_prefix, estimator.has_state) == (
        False,
        "advantage",
        False,
    )
    estimator.estimate(None, None)
    assert original.calls == 1  # one estimator: the view shares the instance's attributes
    assert type(as_advantage_estimator(Counting())) is type(estimator)  # one adapted class per class
    subclassed = Zeros()
    assert as_advantage_estimator(subclassed) is subclassed


def test_what_cannot_be_an_estimator_is_refused():
    with pytest.raises(
        TypeError, match=r"advantage_estimator=42 is neither a registered name nor an estimator"
    ):
        build_advantage_estimator(42, None)
    with pytest.raises(TypeError, match="neither a registered name nor an estimator instance"):
        build_advantage_estimator(Zeros, None)  # the class, not an instance

    class Slotted:
        __slots__ = ()

        def estimate(self, batch, context):
            return None

    with pytest.raises(TypeError, match="__slots__.*subclass mcadvantage.AdvantageEstimator"):
        as_advantage_estimator(Slotted())


# ------------------------------------------------------------------------------------- one table of built-ins


def _quoted_names(text: str) -> set[str]:
    return set(re.findall(r"""["'](\w+)["']""", text))


def test_the_builtin_table_is_what_the_package_registers():
    registered = {
        name
        for name in available_advantage_estimators()
        if get_advantage_estimator(name).__module__.startswith("mcadvantage.estimators.")
    }
    assert registered == set(BUILTIN_ESTIMATORS)
    for name, module in BUILTIN_ESTIMATORS.items():
        assert get_advantage_estimator(name).__module__ == f"mcadvantage.estimators{module}"


def _listed_in_every_hand_written_list() -> dict[str, set[str]]:
    from mcadvantage.trainer import vineppo_trainer
    from mcadvantage.trainer.config import VinePPOConfig

    howto = (ROOT / "docs" / "howto" / "custom-advantage-estimator.md").read_text(encoding="utf-8")
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    config_entry = re.search(r"advantage_estimator \(str\):(.*?)\n {8}\w+ \(", VinePPOConfig.__doc__, re.S)
    trainer_list = re.search(
        r"``args.advantage_estimator``:(.*?)registered one", vineppo_trainer.__doc__, re.S
    )
    return {
        "docs/howto/custom-advantage-estimator.md (the built-in list)": _quoted_names(
            re.search(r"\(([^()]*) built in\)", howto).group(1)
        ),
        "docs/design.md (the seam's registry line)": _quoted_names(
            next(line for line in design.splitlines() if "registry:" in line)
        ),
        "docs/design.md (the package map's estimators/ line)": set(
            re.findall(r"\w+", next(line for line in design.splitlines() if line.startswith("estimators/")))
        ),
        "VinePPOConfig advantage_estimator help": _quoted_names(
            VinePPOConfig.__dataclass_fields__["advantage_estimator"].metadata["help"]
        ),
        "VinePPOConfig docstring (advantage_estimator)": _quoted_names(config_entry.group(1)),
        "mcadvantage.trainer.vineppo_trainer docstring": _quoted_names(trainer_list.group(1)),
        "mcadvantage.estimators docstring": _quoted_names(mcadvantage.estimators.__doc__),
    }


@pytest.mark.parametrize("where", list(_listed_in_every_hand_written_list()))
def test_every_hand_written_list_names_every_builtin(where):
    listed = _listed_in_every_hand_written_list()[where]
    missing = sorted(set(BUILTIN_ESTIMATORS) - listed)
    assert not missing, f"{where} omits the built-in estimators {missing} (table: estimators/base.py)"


# ------------------------------------------------------------------------------- no defaults outside the contract


def _contract_hooks() -> set[str]:
    return {name for name in dir(AdvantageEstimator) if not name.startswith("_")}


def test_no_estimator_attribute_is_read_with_a_default_outside_the_contract():
    """Every optional estimator attribute has its default in AdvantageEstimator; a ``getattr(estimator, name,
    default)`` elsewhere would be a second, silent definition of it."""
    hooks = "|".join(sorted(_contract_hooks()))
    patterns = [
        re.compile(r"getattr\(\s*[^,()]*estimator[^,()]*,[^)]*,"),  # getattr(<an estimator>, name, default)
        re.compile(rf"""getattr\([^)]*["']({hooks})["']"""),  # any getattr of a contract hook
        re.compile(rf"""hasattr\([^)]*["']({hooks})["']"""),
    ]
    offending = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "estimators" / "base.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in patterns):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offending, (
        "read the attribute from the estimator; its default belongs in AdvantageEstimator:\n"
        + ("\n".join(offending))
    )
