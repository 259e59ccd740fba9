"""The estimator registry and the contract's defaults: registration by identity, classes and instances written to
the 0.1 protocol adapted, one table of built-ins that every hand-written list agrees with, and no optional estimator
attribute read with a default outside the contract."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.estimators import (  # noqa: E402
    BUILTIN_ESTIMATORS,
    AdvantageEstimator,
    AdvantageResult,
    DrawsTrees,
    KeepsMonteCarloEstimate,
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


def test_the_contract_defaults_suit_a_reward_only_estimator():
    estimator = Zeros.from_config(None)
    assert isinstance(estimator, Zeros) and Zeros.name is None  # unregistered
    assert (Zeros.whiten_by_default, Zeros.default_scale_rewards) == (False, "none")
    # Most built-ins read only the batch, so that is the default: evaluation batches get its advantages.
    assert (estimator.metric_prefix, estimator.uses_rollouts) == ("advantage", False)
    assert (Zeros.config_fields, Zeros.config_rules) == ((), ())
    assert Zeros.validate_config(object()) is None
    # Monte Carlo-only and tree-only members are optional capabilities, not part of the contract.
    assert not isinstance(estimator, (KeepsMonteCarloEstimate, DrawsTrees))
    assert not hasattr(estimator, "last_estimate") and not hasattr(estimator, "tree_schedule")
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
    # The 0.1 protocol's default stays: an adapted class samples (evaluation batches skip it) unless it says not.
    assert (built.metric_prefix, built.uses_rollouts) == ("legacy", True)
    assert not isinstance(built, DrawsTrees)


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


def test_the_builtin_table_is_what_the_package_registers():
    registered = {
        name
        for name in available_advantage_estimators()
        if get_advantage_estimator(name).__module__.startswith("mcadvantage.estimators.")
    }
    assert registered == set(BUILTIN_ESTIMATORS)
    for name, row in BUILTIN_ESTIMATORS.items():
        assert get_advantage_estimator(name).__module__ == f"mcadvantage.estimators{row.module}"
        assert row.summary and not row.summary.endswith(".")


def test_every_list_of_builtins_is_made_from_the_table(monkeypatch):
    """The config's help and the docs' lists come from the table: a new row appears in each without an edit."""
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import estimators as docs_hook
    finally:
        sys.path.pop(0)
    from mcadvantage.estimators import registry
    from mcadvantage.trainer.config import VinePPOConfig

    help_text = VinePPOConfig.__dataclass_fields__["advantage_estimator"].metadata["help"]
    assert all(f"{name!r}" in help_text for name in BUILTIN_ESTIMATORS)
    table = docs_hook.table_markdown()
    for name, row in BUILTIN_ESTIMATORS.items():
        assert f'`"{name}"`' in docs_hook.names_markdown() and row.summary in table
    # A scratch row (registered to an existing class) shows up in every generated list.
    scratch = registry.BuiltinEstimator(".baselines", "a scratch row for this test")
    monkeypatch.setitem(registry.BUILTIN_ESTIMATORS, "scratch_row", scratch)
    monkeypatch.setitem(registry._REGISTRY, "scratch_row", get_advantage_estimator("rloo"))
    assert "'scratch_row' (a scratch row for this test)" in registry.estimator_choices_text()
    assert '`"scratch_row"`' in docs_hook.names_markdown() and "a scratch row" in docs_hook.table_markdown()


def test_the_docs_pages_use_the_generated_lists_not_hand_written_ones():
    """Each page that lists the built-ins holds a marker the docs hook fills; no page spells the six names by hand."""
    pages = {
        "docs/howto/custom-advantage-estimator.md": "<!-- builtin-estimators: names -->",
        "docs/howto/choose-an-estimator.md": "<!-- builtin-estimators: table -->",
    }
    for page, marker in pages.items():
        assert marker in (ROOT / page).read_text(encoding="utf-8"), f"{page} lacks {marker}"
    hand_written = re.compile(r'`"vineppo"`, `"grpo"`, `"rloo"`')
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "docs").rglob("*.md"))
        if hand_written.search(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"hand-written lists of the built-ins (use the hook's markers): {offenders}"


def test_the_config_docstring_has_a_section_per_estimator_naming_its_fields():
    from mcadvantage.trainer.config import VinePPOConfig

    doc = VinePPOConfig.__doc__
    for name in BUILTIN_ESTIMATORS:
        match = re.search(rf'\*\*`"{name}"`\*\*(.*?)(?=\n\n)', doc, re.S)
        assert match, f"VinePPOConfig's docstring has no section for {name!r}"
        section = match.group(1)
        for field_name in get_advantage_estimator(name).config_fields:
            if field_name.startswith("mc_") or field_name == "num_mc_rollouts":
                continue  # the hybrid's section refers to VinePPO's Monte Carlo settings as a whole
            assert f"`{field_name}`" in section, f"{name!r}'s section does not name {field_name}"


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
        # the contract, the registry's adaptation of 0.1-protocol classes, and the public contract check
        if path in (
            SRC / "estimators" / "base.py",
            SRC / "estimators" / "registry.py",
            SRC / "testing" / "estimator_check.py",
        ):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in patterns):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offending, (
        "read the attribute from the estimator; its default belongs in AdvantageEstimator:\n"
        + ("\n".join(offending))
    )


# ------------------------------------------------------------------------------------------- entry points


def _install_scratch_package(root: Path, entry_points: str) -> None:
    """A package installed the way pip leaves one (a module and its .dist-info with entry points) under ``root``."""
    package = root / "scratch_estimators"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import torch\n"
        "from mcadvantage.estimators import AdvantageEstimator, AdvantageResult\n\n\n"
        "class ScratchEstimator(AdvantageEstimator):\n"
        "    def estimate(self, batch, context):\n"
        "        return AdvantageResult(advantages=torch.zeros(batch.completion_mask.shape))\n",
        encoding="utf-8",
    )
    info = root / "scratch_estimators-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: scratch-estimators\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


def test_an_installed_package_registers_its_estimator_through_an_entry_point(tmp_path, monkeypatch, caplog):
    from mcadvantage.estimators import registry

    _install_scratch_package(
        tmp_path,
        "[mcadvantage.advantage_estimators]\n"
        "scratch_ep = scratch_estimators:ScratchEstimator\n"
        "broken_ep = scratch_estimators:DoesNotExist\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "scratch_ep" not in registry._REGISTRY
    with caplog.at_level("WARNING", logger=registry.__name__):
        cls = get_advantage_estimator("scratch_ep")  # no import line: the entry point registers it
    assert cls.__name__ == "ScratchEstimator" and cls.name == "scratch_ep"
    assert (
        "scratch_ep" in available_advantage_estimators()
        and "broken_ep" not in available_advantage_estimators()
    )
    assert "broken_ep" in caplog.text and "could not be registered" in caplog.text
    from mcadvantage import VinePPOConfig

    config = VinePPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", advantage_estimator="scratch_ep"
    )
    assert config.advantage_estimator == "scratch_ep"
