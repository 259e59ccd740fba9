"""The estimator contract, checked on every registered estimator with the public check users run themselves,
:func:`mcadvantage.testing.check_advantage_estimator`: the built-ins, a 20-line user estimator, and planted broken
estimators that must fail with the rule they break named.

Each check trains a tiny offline VinePPOTrainer two optimizer steps from one generation batch (a few seconds), then
gives copies of the estimator a hand-built batch of agent episodes (the multi-turn part, skipped for the estimators
that sample continuations; its rules one by one, without a trainer: ``tests/testing/test_multi_turn.py``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from mcadvantage.core.advantages import loss_token_mask  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    AdvantageBatch,
    AdvantageEstimator,
    AdvantageResult,
    EstimatorContext,
    available_advantage_estimators,
    get_advantage_estimator,
    register_advantage_estimator,
    sequence_to_token_advantages,
)
from mcadvantage.estimators.anchor import AnchorEstimator  # noqa: E402
from mcadvantage.testing import (  # noqa: E402
    CONTRACT_RULES,
    EstimatorContractError,
    check_advantage_estimator,
)
from mcadvantage.testing.multi_turn import MULTI_TURN_RULES  # noqa: E402


# A user's estimator, as the how-to writes one: 20 lines, tool results left out, state of its own so the checkpoint carries something.
@register_advantage_estimator("contract_test_baseline")
class GroupMeanWithCount(AdvantageEstimator):
    """GRPO's group-mean baseline without scaling, counting the batches it has seen."""

    metric_prefix = "contract"

    def __init__(self) -> None:
        self.batches_seen = 0

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        rewards = torch.nan_to_num(batch.all_rewards.cpu(), nan=0.0).view(-1, batch.group_size)
        advantages = (rewards - rewards.mean(dim=1, keepdim=True)).view(-1)[batch.local_slice]
        self.batches_seen += 1
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)  # the model's tokens, not tool results
        return AdvantageResult(
            advantages=sequence_to_token_advantages(advantages, mask),
            token_mask=mask.bool(),
            metrics={"mean_reward": float(rewards.mean()), "responses": float(len(batch.completion_ids))},
            metric_reductions={"responses": "sum"},
        )

    def state_dict(self) -> dict:
        return {"batches_seen": self.batches_seen}

    def load_state_dict(self, state: dict) -> None:
        self.batches_seen = int(state["batches_seen"])


@pytest.mark.parametrize("name", available_advantage_estimators())
def test_every_registered_estimator_keeps_the_contract(name, tmp_path):
    report = check_advantage_estimator(name, workdir=tmp_path)
    assert report.estimator == name and report.batches >= 1
    assert report.padding_tokens > 0  # the zero-on-padding rule was checked on real padding
    assert report.logged_metrics, f"{name} logged no metric under its prefix"
    if get_advantage_estimator(name).uses_rollouts:  # vineppo, hybrid: their turn credit needs live episodes
        assert report.multi_turn_rules == () and "EstimatorContext.episodes" in report.multi_turn_skipped
    elif name == "anchor":  # reads state keys: every multi-turn rule
        assert report.multi_turn_skipped is None and report.multi_turn_rules == MULTI_TURN_RULES
    else:
        assert report.multi_turn_skipped is None and report.multi_turn_rules == MULTI_TURN_RULES[:5]


@pytest.mark.parametrize(
    "settings",
    [{"anchor_credit": "pooled"}, {"anchor_scope": "batch"}, {"anchor_state": "observation"}],
    ids=["pooled", "batch-scope", "observation"],
)
def test_every_anchor_variant_keeps_the_multi_turn_contract(settings, tmp_path):
    report = check_advantage_estimator("anchor", workdir=tmp_path, config_overrides=settings)
    # keyed by its tool results' tokens, the observation variant reads no turn_keys: no state-key rules
    expected = MULTI_TURN_RULES[:5] if settings.get("anchor_state") == "observation" else MULTI_TURN_RULES
    assert report.multi_turn_rules == expected


def test_a_user_estimator_passes_and_its_state_survives_the_checkpoint(tmp_path):
    report = check_advantage_estimator(GroupMeanWithCount(), workdir=tmp_path)
    assert report.state_keys == ("batches_seen",)
    assert {"contract/mean_reward", "contract/responses"} <= set(report.logged_metrics)


# ----------------------------------------------------------------------------- planted broken estimators


class _Planted(GroupMeanWithCount):
    """Unregistered: passed to the check as an instance."""


class UnmaskedPadding(_Planted):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        result.advantages = result.advantages + 1.0  # padding positions get 1.0 too
        return result


class WrongShape(_Planted):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        result.advantages = result.advantages[:, 0]  # (B,) instead of (B, T)
        return result


class NonFinite(_Planted):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        result.advantages[0, 0] = float("nan")  # the first token of a response is always a completion token
        return result


class ForgetsItsState(_Planted):
    def load_state_dict(self, state):
        pass  # the count is lost on resume


class StringMetric(_Planted):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        result.metrics["responses"] = len(batch.completion_ids)  # an int, not a float
        return result


class CreditsToolTokens(_Planted):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        rewards = torch.nan_to_num(batch.all_rewards.cpu(), nan=0.0).view(-1, batch.group_size)
        advantages = (rewards - rewards.mean(dim=1, keepdim=True)).view(-1)[batch.local_slice]
        result.advantages = sequence_to_token_advantages(
            advantages, batch.completion_mask
        )  # tool results too
        result.token_mask = None
        return result


class KeysByText(AnchorEstimator):
    """Anchor credit that compares state keys by their text: distinct states that print alike share a step group."""

    def local_keys(self, batch):
        return [[str(key) for key in keys] for keys in super().local_keys(batch)]


@pytest.mark.parametrize(
    ("planted", "rule"),
    [
        (CreditsToolTokens, "tool-result tokens: zero and outside the token mask"),
        (KeysByText, "state keys renamed one-to-one, the same advantages"),
        (UnmaskedPadding, "zero on padding"),
        (WrongShape, "(B, T) float advantages"),
        (NonFinite, "finite on the token mask"),
        (StringMetric, "float metrics under its prefix"),
        (ForgetsItsState, "state_dict round trip through a checkpoint"),
    ],
)
def test_a_planted_bad_estimator_fails_naming_the_rule(planted, rule, tmp_path):
    assert rule in CONTRACT_RULES
    with pytest.raises(EstimatorContractError) as caught:
        check_advantage_estimator(planted(), workdir=tmp_path)
    assert caught.value.rule == rule
    assert repr(rule) in str(caught.value) and planted.__name__ in str(caught.value)


def test_multi_turn_false_skips_the_multi_turn_part(tmp_path):
    report = check_advantage_estimator(CreditsToolTokens(), workdir=tmp_path, multi_turn=False)
    assert report.multi_turn_rules == () and report.multi_turn_skipped == "multi_turn=False"


def test_a_class_that_is_not_an_estimator_fails_the_declaration(tmp_path):
    class NoEstimate(AdvantageEstimator):
        pass

    with pytest.raises(EstimatorContractError, match="declares the contract.*estimate"):
        check_advantage_estimator(NoEstimate, workdir=tmp_path)
