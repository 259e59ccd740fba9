"""The ``"anchor"`` estimator (GiGPO's anchor-state turn credit) on hand-built batches: its per-token advantages
equal a recomputation written here from the formula (not from :mod:`mcadvantage.core.anchors`), tool results get 0
and stay out of the token mask, the keys come from where ``anchor_state`` says, and bad keys are refused.
"""

from __future__ import annotations

import math
import statistics

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.estimators import AdvantageBatch, EstimatorContext, get_advantage_estimator  # noqa: E402
from mcadvantage.estimators.anchor import (  # noqa: E402
    AnchorEstimator,
    check_state_key_property,
    observation_keys,
    recorded_turn_keys,
)

EPS = 1e-4


def _episode(turns: list[int], tool: int = 2, obs: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Completion ids and tool mask of an episode whose model turns have ``turns`` tokens, separated by ``tool``
    tool-result tokens (ids ``obs`` when given)."""
    ids, mask = [], []
    for t, n in enumerate(turns):
        if t:
            ids += obs[t - 1] if obs else [90 + t] * tool
            mask += [0] * (len(obs[t - 1]) if obs else tool)
        ids += [10 + t] * n
        mask += [1] * n
    return ids, mask


def _batch(episodes, rewards, group_size, turn_keys=None, prompt_ids=None) -> AdvantageBatch:
    width = max(len(ids) for ids, _ in episodes) + 1  # one padding column at least
    completion_mask = torch.zeros(len(episodes), width)
    tool_mask = torch.ones(len(episodes), width, dtype=torch.long)
    for r, (ids, mask) in enumerate(episodes):
        completion_mask[r, : len(ids)] = 1
        tool_mask[r, : len(ids)] = torch.tensor(mask)
    return AdvantageBatch(
        prompt_ids=prompt_ids or [[1, 2, 3 + r // group_size] for r in range(len(episodes))],
        completion_ids=[ids for ids, _ in episodes],
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor(rewards, dtype=torch.float32).view(-1, 1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(episodes)),
        group_size=group_size,
        tool_mask=tool_mask,
        turn_keys=turn_keys,
    )


def _context() -> EstimatorContext:
    return EstimatorContext.single_process(None, [lambda **kw: None], tokenizer=None)


# Two prompt groups of three episodes; keys recur across episodes (at other turn indices too) and across groups.
EPISODES = [
    _episode([2, 3, 1]),
    _episode([1, 2]),
    _episode([2, 2, 2]),
    _episode([3, 1]),
    _episode([1]),
    _episode([2, 2]),
]
KEYS = [["s0", "a", "b"], ["s0", "b"], ["s0", "a", "c"], ["s0", "x"], ["s0"], ["s0", "x"]]
REWARDS = [1.0, 0.0, 1.0, 0.5, 0.0, 1.0]


def _recompute(keys, rewards, group_size, weight=1.0, scale=True, batch_scope=False):
    """The formula of issue 49, written independently: per turn A_ep + weight * A_step (single final reward, gamma 1)."""
    n = len(rewards)
    groups = [rewards[g : g + group_size] for g in range(0, n, group_size)]
    a_ep = []
    for i, r in enumerate(rewards):
        g = groups[i // group_size]
        std = statistics.stdev(g) if len(g) > 1 else 0.0
        a_ep.append((r - statistics.fmean(g)) / (std + EPS) if scale else r - statistics.fmean(g))
    members: dict = {}
    for i, ks in enumerate(keys):
        for k in ks:
            members.setdefault((0 if batch_scope else i // group_size, k), []).append(rewards[i])
    out = []
    for i, ks in enumerate(keys):
        row = []
        for k in ks:
            returns = members[(0 if batch_scope else i // group_size, k)]
            step = 0.0
            if len(returns) > 1:
                centred = rewards[i] - statistics.fmean(returns)
                step = centred / (statistics.stdev(returns) + EPS) if scale else centred
            row.append(a_ep[i] + weight * step)
        out.append(row)
    return out


def _per_turn(advantages: torch.Tensor, batch: AdvantageBatch) -> list[list[float]]:
    """Each turn's advantage read back from its tokens (all tokens of a turn must carry the same value)."""
    out = []
    for r, ids in enumerate(batch.completion_ids):
        mask = batch.tool_mask[r, : len(ids)].tolist()
        turns, current = [], []
        for j, m in enumerate(mask + [0]):
            if m:
                current.append(float(advantages[r, j]))
            elif current:
                assert max(current) == min(current), f"row {r}: one turn, several advantages {current}"
                turns.append(current[0])
                current = []
        out.append(turns)
    return out


@pytest.mark.parametrize("weight", [1.0, 0.5])
@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_normalized_credit_equals_the_formula_recomputed(weight, scale_rewards):
    batch = _batch(EPISODES, REWARDS, 3, turn_keys=KEYS)
    est = AnchorEstimator(weight=weight, scale_rewards=scale_rewards)
    result = est.estimate(batch, _context())
    want = _recompute(KEYS, REWARDS, 3, weight=weight, scale=scale_rewards != "none")
    got = _per_turn(result.advantages, batch)
    for w_row, g_row in zip(want, got, strict=True):
        assert g_row == pytest.approx(w_row, abs=1e-5)
    # tool results: 0, and outside the token mask; padding 0
    outside = batch.completion_mask.bool() & ~batch.tool_mask.bool()
    assert outside.any() and not result.advantages[outside].any()
    assert torch.equal(result.token_mask, (batch.completion_mask * batch.tool_mask).bool())
    assert not result.advantages[~batch.completion_mask.bool()].any()


def test_batch_scope_pools_keys_across_prompt_groups():
    batch = _batch(EPISODES, REWARDS, 3, turn_keys=KEYS)
    result = AnchorEstimator(scope="batch").estimate(batch, _context())
    want = _recompute(KEYS, REWARDS, 3, batch_scope=True)
    assert _per_turn(result.advantages, batch) == [pytest.approx(row, abs=1e-5) for row in want]
    group = _per_turn(AnchorEstimator().estimate(batch, _context()).advantages, batch)
    assert group != _per_turn(result.advantages, batch)  # "s0" now pools both groups' returns


def test_weight_zero_is_grpo_exactly_on_the_model_tokens():
    from mcadvantage.estimators import GRPOEstimator

    batch = _batch(EPISODES, REWARDS, 3, turn_keys=KEYS)
    ours = AnchorEstimator(weight=0.0).estimate(batch, _context()).advantages
    grpo = GRPOEstimator().estimate(batch, _context()).advantages
    assert torch.equal(ours, grpo)


def test_pooled_credit_is_the_td_of_batch_values_recomputed():
    batch = _batch(EPISODES, REWARDS, 3, turn_keys=KEYS)
    result = AnchorEstimator(credit="pooled", scale_rewards="none").estimate(batch, _context())
    values: dict = {}
    for i, ks in enumerate(KEYS):
        for k in ks:
            values.setdefault((i // 3, k), []).append(REWARDS[i])
    want = []
    for i, ks in enumerate(KEYS):
        v = [statistics.fmean(values[(i // 3, k)]) for k in ks] + [REWARDS[i]]
        want.append([v[t + 1] - v[t] for t in range(len(ks))])
    assert _per_turn(result.advantages, batch) == [pytest.approx(row, abs=1e-6) for row in want]
    # scaled: divided by the prompt group's reward std + eps, so the turns sum to GRPO's advantage (shared s0)
    scaled = AnchorEstimator(credit="pooled").estimate(batch, _context())
    grpo = _recompute([["only"]] * 6, REWARDS, 3, weight=0.0)
    for row, g in zip(_per_turn(scaled.advantages, batch), grpo, strict=True):
        assert sum(row) == pytest.approx(g[0], abs=1e-4)


def test_singleton_turns_get_zero_step_credit_and_are_counted():
    keys = [["s0", f"u{i}"] for i in range(3)]
    episodes = [_episode([1, 1]) for _ in range(3)]
    batch = _batch(episodes, [1.0, 0.0, 0.0], 3, turn_keys=keys)
    result = AnchorEstimator().estimate(batch, _context())
    turns = _per_turn(result.advantages, batch)
    grpo = _recompute([["s0"]] * 3, [1.0, 0.0, 0.0], 3, weight=0.0)
    for row, g in zip(turns, grpo, strict=True):
        assert row[1] == pytest.approx(g[0], abs=1e-5)  # singleton: GRPO's credit only
        assert row[0] == pytest.approx(2 * g[0], abs=1e-4)  # s0 is the whole group: A_step = A_ep
    assert result.metrics["singleton_turn_share"] == pytest.approx(0.5)
    assert result.metrics["grouped_turn_share"] == pytest.approx(0.5)
    assert result.metrics["mean_step_group_size"] == pytest.approx(2.0)


def test_pooled_credit_warns_when_most_turns_are_singletons(caplog):
    keys = [["s0", f"u{i}", f"v{i}"] for i in range(3)]
    batch = _batch([_episode([1, 1, 1]) for _ in range(3)], [1.0, 0.0, 0.0], 3, turn_keys=keys)
    with caplog.at_level("WARNING", logger="mcadvantage.estimators.anchor"):
        AnchorEstimator(credit="pooled").estimate(batch, _context())
        AnchorEstimator().estimate(batch, _context())  # the normalized credit does not warn
    warnings = [r for r in caplog.records if "singleton" not in r.getMessage() or "pooled" in r.getMessage()]
    assert len(warnings) == 1 and "67% of this batch's turns" in warnings[0].getMessage()


def test_observation_keys_group_turns_after_identical_tool_results():
    # Episodes 0 and 1 see the same tool result before turn 1; episode 2 another.
    episodes = [_episode([1, 1], obs=[[7, 7]]), _episode([2, 1], obs=[[7, 7]]), _episode([1, 1], obs=[[8]])]
    keys = [observation_keys([1, 2], ids, mask) for ids, mask in episodes]
    assert keys[0][1] == keys[1][1] != keys[2][1] and keys[0][0] == keys[2][0]
    batch = _batch(episodes, [1.0, 0.0, 0.0], 3, prompt_ids=[[1, 2]] * 3)
    result = AnchorEstimator(state_source="observation").estimate(batch, _context())
    want = _recompute([["p", "o7"], ["p", "o7"], ["p", "o8"]], [1.0, 0.0, 0.0], 3)
    assert _per_turn(result.advantages, batch) == [pytest.approx(row, abs=1e-4) for row in want]


def test_a_single_turn_batch_keys_each_response_by_its_prompt():
    batch = _batch([_episode([3]), _episode([2])], [1.0, 0.0], 2)
    batch.tool_mask = None
    result = AnchorEstimator().estimate(batch, _context())
    assert result.token_mask is None
    grpo = _recompute([["p"]] * 2, [1.0, 0.0], 2, weight=0.0)
    assert float(result.advantages[0, 0]) == pytest.approx(2 * grpo[0][0], abs=1e-3)


def test_unscorable_episodes_get_zero_and_leave_the_statistics():
    batch = _batch(EPISODES[:3], [1.0, float("nan"), 0.0], 3, turn_keys=KEYS[:3])
    result = AnchorEstimator().estimate(batch, _context())
    turns = _per_turn(result.advantages, batch)
    assert turns[1] == [0.0, 0.0]
    want = _recompute([["s0", "a", "b"], ["s0", "a", "c"]], [1.0, 0.0], 2)
    assert turns[0] == pytest.approx(want[0], abs=1e-4) and turns[2] == pytest.approx(want[1], abs=1e-4)


def test_keys_are_gathered_across_processes_so_a_group_spanning_them_is_one_step_group():
    whole = _batch(EPISODES, REWARDS, 3, turn_keys=KEYS)
    want = AnchorEstimator().estimate(whole, _context()).advantages
    for start, stop in ((0, 2), (2, 6)):  # a prompt group split over two processes
        part = _batch(EPISODES[start:stop], REWARDS[start:stop], 1, turn_keys=KEYS[start:stop])
        local = AdvantageBatch(
            prompt_ids=part.prompt_ids, completion_ids=part.completion_ids, completion_mask=part.completion_mask,
            rewards_per_func=whole.rewards_per_func, reward_weights=whole.reward_weights,
            local_slice=slice(start, stop), group_size=3, tool_mask=part.tool_mask, turn_keys=KEYS[start:stop],
        )  # fmt: skip
        context = _context()
        context.gather_object = lambda objs, start=start, stop=stop: KEYS[:start] + list(objs) + KEYS[stop:]
        got = AnchorEstimator().estimate(local, context).advantages
        width = got.shape[1]
        assert torch.allclose(got, want[start:stop, :width])


def test_missing_wrong_and_unhashable_keys_are_refused_with_the_fix():
    with pytest.raises(
        ValueError, match="no state keys .* state_key property .*'turn_keys'.*anchor_state='observation'"
    ):
        AnchorEstimator().estimate(_batch(EPISODES, REWARDS, 3), _context())
    short = [k[:1] for k in KEYS]
    with pytest.raises(ValueError, match="local response 0 has 3 model turns .* but 1 state keys"):
        AnchorEstimator().estimate(_batch(EPISODES, REWARDS, 3, turn_keys=short), _context())
    bad = [[["s0"]] + k[1:] for k in KEYS]
    with pytest.raises(TypeError, match="episode 0, turn 0 .* is a list, which is unhashable.*tuple"):
        AnchorEstimator().estimate(_batch(EPISODES, REWARDS, 3, turn_keys=bad), _context())


def test_settings_are_checked_and_owned_by_the_estimator(tmp_path):
    from mcadvantage import VinePPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, advantage_estimator="anchor")
    cfg = VinePPOConfig(
        **base, anchor_state="observation", anchor_weight=0.5, anchor_scope="batch", anchor_gamma=0.9
    )
    est = get_advantage_estimator("anchor").from_config(cfg)
    assert (est.state_source, est.weight, est.scope, est.gamma, est.scale_rewards) == (
        "observation", 0.5, "batch", 0.9, "group",
    )  # fmt: skip
    for field, value, match in [
        ("anchor_state", "text", r"anchor_state='text' is invalid .* \['state_key', 'observation'\]"),
        ("anchor_credit", "td", r"anchor_credit='td' is invalid"),
        ("anchor_gamma", 0.0, r"anchor_gamma=0.0 is invalid"),
        ("anchor_weight", -1.0, r"anchor_weight=-1.0 is invalid"),
    ]:
        with pytest.raises(ValueError, match=match):
            VinePPOConfig(**base, **{field: value})
    with pytest.raises(ValueError, match="anchor_weight=0.5 is set with anchor_credit='pooled'"):
        VinePPOConfig(**base, anchor_credit="pooled", anchor_weight=0.5)
    with pytest.raises(ValueError, match="anchor_scope='batch' is set, but advantage_estimator='grpo'"):
        VinePPOConfig(**{**base, "advantage_estimator": "grpo"}, anchor_scope="batch")


def test_state_key_must_be_a_property():
    class NoKey:
        def reset(self, **row): ...

    class MethodKey:
        def state_key(self):
            return 0

    class Keyed:
        @property
        def state_key(self):
            return 0

    with pytest.raises(TypeError, match="NoKey does not have.*anchor_state='observation'"):
        check_state_key_property(NoKey)
    with pytest.raises(TypeError, match="MethodKey.state_key is a function, not a property.*@property"):
        check_state_key_property(MethodKey)
    check_state_key_property(Keyed)


def test_recorded_keys_take_each_episodes_turns_from_the_loops_calls():
    snapshots = [["a0", "b0", "c0"], ["a1", "b1", "c1"], ["a2", "b2", "c2"]]
    assert recorded_turn_keys(snapshots, [3, 1, 0]) == [["a0", "a1", "a2"], ["b0"], []]
    with pytest.raises(ValueError, match="episode 0 has 4 model turns but state_key was recorded at 3"):
        recorded_turn_keys(snapshots, [4, 1, 1])


def test_step_groups_mean_returns_converge_to_the_testbeds_exact_state_values():
    """The pooled credit's batch values are the step groups' mean returns: on the agent testbed, with a scripted
    policy and many episodes of one prompt keyed by the environment's true state, every group's mean return is
    within 5 standard errors of the exact value of its state (backward induction)."""
    import random

    from testbed.agent_env import AgentEnv, AgentTask, KeyPolicy, exact_values, simulate_episode

    task = AgentTask("recovery", 4, key=1, decisive_turn=1)
    policy = KeyPolicy(lambda turn, state: 0.3 + 0.15 * turn + 0.1 * state)
    rng, n = random.Random(0), 3000
    episodes = [simulate_episode(task, policy, rng) for _ in range(n)]
    env = AgentEnv()  # the keys are what the environment's state_key reads before each turn
    keys = []
    for ep in episodes:
        env.reset(**task.row())
        row = []
        for choice in ep.choices:
            row.append(env.state_key)
            env.act(choice)
        keys.append(row)
    rewards = [[0.0] * (len(ep.choices) - 1) + [ep.reward] for ep in episodes]
    from mcadvantage.core.anchors import pooled_anchor_advantages

    _, values = pooled_anchor_advantages(keys, rewards, [0] * n)
    exact = exact_values(task, policy)
    seen: dict = {}
    for ks, vs in zip(keys, values, strict=True):
        for (turn, state), v in zip(ks, vs, strict=False):
            seen[(turn, state)] = v
    counts = {k: sum(row.count(k) for row in keys) for k in seen}
    assert len(seen) >= 6  # both states reached at several turns
    for (turn, state), v in seen.items():
        p = exact[turn][state]
        bound = 5 * math.sqrt(max(p * (1 - p), 1e-3) / counts[(turn, state)]) + 1e-9
        assert abs(v - p) <= bound, ((turn, state), v, p, counts[(turn, state)])
