"""The multi-turn part of the estimator contract check (:mod:`mcadvantage.testing.multi_turn`), without a trainer:
the hand-built batch is what it says it is, the built-ins that read the batch pass, and a planted estimator for each
rule fails with that rule named (every rule can fail). End to end through ``check_advantage_estimator``:
``tests/estimators/test_contract.py``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.agents.turns import model_spans  # noqa: E402
from mcadvantage.core.advantages import loss_token_mask  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    AdvantageEstimator,
    AdvantageResult,
    EstimatorContext,
    sequence_to_token_advantages,
)
from mcadvantage.estimators.anchor import AnchorEstimator  # noqa: E402
from mcadvantage.estimators.baselines import GRPOEstimator, RLOOEstimator  # noqa: E402
from mcadvantage.estimators.tree import TreeEstimator  # noqa: E402
from mcadvantage.testing import build_char_tokenizer  # noqa: E402
from mcadvantage.testing.multi_turn import (  # noqa: E402
    MULTI_TURN_RULES,
    MultiTurnRuleBroken,
    RenamedKey,
    check_multi_turn,
    multi_turn_batch,
    multi_turn_skip_reason,
    rename_keys,
    reorder_within_groups,
    with_unhashable_key,
)

TOKENIZER = build_char_tokenizer()
CONTEXT = EstimatorContext.single_process(sampler=None, reward_funcs=[], tokenizer=TOKENIZER)


def _batch(estimator=None):
    return multi_turn_batch(estimator or GRPOEstimator(), TOKENIZER, 4, 8, "cpu")


def _check(estimator):
    return check_multi_turn(estimator, CONTEXT, _batch(estimator), lambda batch, result: None)


# ----------------------------------------------------------------------------- the batch


def test_the_batch_holds_agent_episodes_with_recurring_states():
    batch = _batch()
    mask, tools = batch.completion_mask.bool(), batch.tool_mask.bool()
    assert len(batch.completion_ids) == 8 and batch.group_size == 4
    assert bool((mask & ~tools).any()), "no tool-result tokens inside the completions"
    assert bool((~mask).any(dim=1).all()), "a row without padding"
    turns = [
        len(model_spans(batch.tool_mask[i, : len(ids)].tolist()))
        for i, ids in enumerate(batch.completion_ids)
    ]
    assert turns == [len(keys) for keys in batch.turn_keys] and sorted(set(turns)) == [1, 2, 3]
    group = [key for keys in batch.turn_keys[:4] for key in keys]
    assert len(set(group)) < len(group), "no state recurs within a group"
    revisited = {k for keys in batch.turn_keys[:4] for t, k in enumerate(keys) if t == 2} & {
        k for keys in batch.turn_keys[:4] for t, k in enumerate(keys) if t == 1
    }
    assert revisited, "no state recurs at another turn index"
    assert len(set(batch.all_rewards[:4].tolist())) == 4  # rewards differ within a group


def test_a_tree_drawing_estimator_gets_trees_that_branch_in_the_first_turn():
    estimator = TreeEstimator(branching=[2, 2])
    batch = _batch(estimator)
    depth = estimator.tree_schedule(8).depths[-1]
    first_turn = model_spans(batch.tool_mask[0].tolist())[0]
    assert first_turn[1] > depth  # the branch point lies inside the first model turn
    paths = batch.tree_paths
    assert [p.children for p in paths[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for a in range(4):
        for b in range(4):
            shared = paths[a].children[0] == paths[b].children[0]
            same = batch.completion_ids[a][:depth] == batch.completion_ids[b][:depth]
            assert shared == same, "leaves share their prefix exactly when they share the node above it"


def test_the_variants_move_rename_and_break_keys_as_described():
    batch = _batch()
    moved, order = reorder_within_groups(batch)
    assert sorted(order[:4]) == [0, 1, 2, 3] and sorted(order[4:]) == [4, 5, 6, 7] and order != list(range(8))
    assert [moved.turn_keys[k] for k in range(8)] == [batch.turn_keys[i] for i in order]
    assert torch.equal(moved.tool_mask, batch.tool_mask[order])
    renamed = rename_keys(batch).turn_keys
    flat = [k for keys in batch.turn_keys for k in keys]
    new = [k for keys in renamed for k in keys]
    assert all(isinstance(k, RenamedKey) for k in new)
    assert all(
        (a == b) == (c == d) for a, c in zip(flat, new, strict=True) for b, d in zip(flat, new, strict=True)
    )
    assert (
        len({repr(k) for k in new}) == 1 and new[0] is not new[4]
    )  # all print alike, every one a new object
    broken = with_unhashable_key(batch).turn_keys
    assert sum(isinstance(k, list) for keys in broken for k in keys) == 1
    assert batch.turn_keys == _batch().turn_keys  # the variants leave the batch as it was


# ----------------------------------------------------------------------------- which estimators it covers


@pytest.mark.parametrize(
    "estimator",
    [
        GRPOEstimator(),
        RLOOEstimator(),
        TreeEstimator(branching=[2, 2]),
        AnchorEstimator(),
        AnchorEstimator(credit="pooled"),
        AnchorEstimator(scope="batch"),
        AnchorEstimator(state_source="observation"),
    ],
    ids=["grpo", "rloo", "tree", "anchor", "anchor-pooled", "anchor-batch", "anchor-observation"],
)
def test_the_built_ins_that_read_the_batch_pass(estimator):
    rules = _check(estimator)
    reads_keys = isinstance(estimator, AnchorEstimator) and estimator.state_source == "state_key"
    assert rules == (MULTI_TURN_RULES if reads_keys else MULTI_TURN_RULES[:5])


def test_sampling_estimators_are_skipped_with_the_reason():
    class ContinuesThem(GRPOEstimator):  # as "vineppo" and "hybrid": samples, continues agent episodes
        uses_rollouts = True

        def check_agent_support(self, given):
            pass

    class Sampling(GRPOEstimator):  # samples, cannot continue episodes: the trainer refuses it agents
        uses_rollouts = True

    assert "EstimatorContext.episodes" in multi_turn_skip_reason(ContinuesThem())
    assert "refuses it agent episodes" in multi_turn_skip_reason(Sampling())
    assert (
        multi_turn_skip_reason(AnchorEstimator()) is None and multi_turn_skip_reason(GRPOEstimator()) is None
    )


# ----------------------------------------------------------------------------- planted broken estimators


class GroupMean(AdvantageEstimator):
    """A correct reward-only estimator: the group-mean baseline, tool results left out."""

    def estimate(self, batch, context):
        rewards = batch.all_rewards.view(-1, batch.group_size)
        advantages = (rewards - rewards.mean(dim=1, keepdim=True)).view(-1)[batch.local_slice]
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        return AdvantageResult(sequence_to_token_advantages(advantages, mask), token_mask=mask.bool())


class CreditsToolTokens(GroupMean):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        rewards = batch.all_rewards.view(-1, batch.group_size)
        advantages = (rewards - rewards.mean(dim=1, keepdim=True)).view(-1)[batch.local_slice]
        result.advantages = sequence_to_token_advantages(advantages, batch.completion_mask)  # tool tokens too
        return result


class WhitensToolTokens(GroupMean):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        result.token_mask = None  # every completion token, tool results included, enters the whitening
        return result


class NaNOutsideItsTokenMask(GroupMean):
    def estimate(self, batch, context):
        result = super().estimate(batch, context)
        result.token_mask[:, 0] = False
        result.advantages[:, 0] = float("nan")  # a model token, outside token_mask, not finite
        return result


class HiddenRunningBaseline(AdvantageEstimator):
    """Subtracts a moving average of the batches' mean rewards, kept outside state_dict (a resumed run loses it)."""

    def __init__(self):
        self.baseline, self.batches = 0.0, 0

    def estimate(self, batch, context):
        rewards = batch.all_rewards
        self.baseline, self.batches = 0.5 * self.baseline + 0.5 * float(rewards.mean()), self.batches + 1
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        advantages = rewards[batch.local_slice] - self.baseline
        return AdvantageResult(sequence_to_token_advantages(advantages, mask), token_mask=mask.bool())


class MutatesTheBatch(GroupMean):
    def estimate(self, batch, context):
        batch.completion_ids[0] = batch.completion_ids[0][:-1]  # drops a token of the caller's batch
        return super().estimate(batch, context)


class FirstEpisodeBaseline(GroupMean):
    """Uses the first response of each group as the baseline: depends on the order of exchangeable responses."""

    def estimate(self, batch, context):
        rewards = batch.all_rewards.view(-1, batch.group_size)
        advantages = (rewards - rewards[:, :1]).view(-1)[batch.local_slice]
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        return AdvantageResult(sequence_to_token_advantages(advantages, mask), token_mask=mask.bool())


class AcceptsUnhashableKeys(AnchorEstimator):
    def local_keys(self, batch):
        return [[repr(k) for k in keys] for keys in batch.turn_keys]  # a list key silently becomes text


class KeysByText(AnchorEstimator):
    def local_keys(self, batch):
        return [
            [str(k) for k in keys] for keys in super().local_keys(batch)
        ]  # equal text merges distinct states


class RaisesOnToolMask(GroupMean):
    def estimate(self, batch, context):
        if batch.tool_mask is not None:
            raise NotImplementedError("no agents")
        return super().estimate(batch, context)


@pytest.mark.parametrize(
    ("planted", "rule", "says"),
    [
        (RaisesOnToolMask, MULTI_TURN_RULES[0], "NotImplementedError: no agents"),
        (CreditsToolTokens, MULTI_TURN_RULES[1], "non-zero advantage"),
        (WhitensToolTokens, MULTI_TURN_RULES[1], "token_mask is None"),
        (NaNOutsideItsTokenMask, MULTI_TURN_RULES[2], "non-finite"),
        (HiddenRunningBaseline, MULTI_TURN_RULES[3], "second call"),
        (MutatesTheBatch, MULTI_TURN_RULES[3], "completion_ids in place"),
        (FirstEpisodeBaseline, MULTI_TURN_RULES[4], "reverse order"),
        (AcceptsUnhashableKeys, MULTI_TURN_RULES[5], "was accepted"),
        (KeysByText, MULTI_TURN_RULES[6], "keys renamed"),
    ],
)
def test_a_planted_estimator_breaks_the_rule_named(planted, rule, says):
    with pytest.raises(MultiTurnRuleBroken) as caught:
        _check(planted())
    assert caught.value.rule == rule and says in caught.value.detail


def test_the_check_leaves_the_estimator_as_it_was():
    estimator = HiddenRunningBaseline()
    with pytest.raises(MultiTurnRuleBroken):
        _check(estimator)
    assert estimator.batches == 0  # every call went to a copy
