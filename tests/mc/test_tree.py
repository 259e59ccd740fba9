"""Tree sampling and tree credit (:mod:`mcadvantage.mc.tree`, ``advantage_estimator="tree"``).

Hand-computed advantages; exactly ``G`` leaves however the branches end; on the exact toy the node values are
unbiased and a leaf's own outcome does not covary with its baselines; masked responses chosen by their outcome leave
every other response's credit unchanged; the batch gradient matches the exact gradient in expectation.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.estimators import AdvantageBatch, TreeEstimator  # noqa: E402
from mcadvantage.estimators.base import EstimatorContext  # noqa: E402
from mcadvantage.evaluation.gradient_instrument import estimator_gradient, gradient_metrics  # noqa: E402
from mcadvantage.mc.tree import TreePath, TreeSchedule, draw_trees, tree_advantages, tree_node_values  # noqa: E402
from mcadvantage.samplers.base import Continuation  # noqa: E402
from mcadvantage.testing import StepTreeSampler  # noqa: E402
from testbed.toys import toy_gradient_task  # noqa: E402


def test_hand_computed_two_level_tree():
    # Root -> children 0 and 1 (branch points at tokens 3 and 2), each with two leaves. Rewards 1, 0 | 1, 1.
    paths = [
        TreePath((0, 0), (0, 3), (2, 2)),
        TreePath((0, 1), (0, 3), (2, 2)),
        TreePath((1, 0), (0, 2), (2, 2)),
        TreePath((1, 1), (0, 2), (2, 2)),
    ]
    values = tree_node_values(paths, [1.0, 0.0, 1.0, 1.0])
    assert values[()] == 0.75 and values[(0,)] == 0.5 and values[(1,)] == 1.0
    advs, path_values = tree_advantages(paths, [1.0, 0.0, 1.0, 1.0], [5, 6, 4, 4])
    # Segment 0: Q(own child) - Q(sibling child); segment 1: own reward - sibling leaf's reward.
    assert advs[0].tolist() == [-0.5, -0.5, -0.5, 1.0, 1.0]
    assert advs[1].tolist() == [-0.5, -0.5, -0.5, -1.0, -1.0, -1.0]
    assert advs[2].tolist() == [0.5, 0.5, 0.0, 0.0]
    assert advs[3].tolist() == [0.5, 0.5, 0.0, 0.0]
    assert path_values[0] == [0.75, 0.5, 1.0]


def test_top_up_children_train_but_count_in_no_value():
    # Node () has 2 design children; child 2 is a top-up (drawn because both design children ended early).
    paths = [TreePath((0,), (0,), (2,)), TreePath((1,), (0,), (2,)), TreePath((2,), (0,), (2,))]
    values = tree_node_values(paths, [1.0, 0.0, 1.0])
    assert values[()] == 0.5  # the top-up's reward is not in it
    advs, _ = tree_advantages(paths, [1.0, 0.0, 1.0], [2, 2, 2])
    assert [a[0].item() for a in advs] == [1.0, -1.0, 0.5]  # the top-up's baseline: every design child


class ScriptedSampler:
    """Continuations from a queue of ``(tokens, truncated)`` per call order; records requests."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []

    def sample(self, requests):
        self.requests.append(list(requests))
        return [[Continuation(*self.script.pop(0)) for _ in range(r.n)] for r in requests]


def test_exactly_g_leaves_when_branches_end_early():
    schedule = TreeSchedule((2, 2), (0, 3))
    # Level 1 from the prompt: the first child ends early (EOS at token 2), the second reaches depth 3.
    # The open child must then produce 3 leaves: 2 design children and 1 top-up.
    sampler = ScriptedSampler(
        [((5, 9), False), ((6, 6, 6), True), ((7, 9), False), ((8, 9), False), ((4, 9), False)]
    )
    [tree] = draw_trees(sampler, [[1, 2]], schedule, max_completion_length=16)
    assert len(tree.completions) == 4
    assert tree.completions[0] == [5, 9]
    assert tree.completions[1:] == [[6, 6, 6, 7, 9], [6, 6, 6, 8, 9], [6, 6, 6, 4, 9]]
    assert [p.children for p in tree.paths] == [(0,), (1, 0), (1, 1), (1, 2)]
    assert tree.paths[1].offsets == (0, 3) and tree.paths[3].widths == (2, 2)
    assert tree.generated_tokens == 2 + 3 + 2 + 2 + 2  # the shared prefix was generated once
    assert sampler.requests[0][0].max_tokens == 3 and sampler.requests[1][0].n == 3
    advs, _ = tree_advantages(tree.paths, [0.0, 1.0, 1.0, 0.0], [len(c) for c in tree.completions])
    assert advs[0].tolist() == [
        -1.0,
        -1.0,
    ]  # Q(ended child) 0 vs Q(open child) = mean of its 2 design leaves = 1


def test_every_child_ending_early_tops_up_from_the_node():
    schedule = TreeSchedule((2, 2), (0, 3))
    sampler = ScriptedSampler([((5, 9), False), ((6, 9), False), ((7, 9), False), ((8, 9), False)])
    [tree] = draw_trees(sampler, [[1]], schedule, max_completion_length=16)
    assert [p.children for p in tree.paths] == [(0,), (1,), (2,), (3,)]
    assert all(p.widths == (2,) for p in tree.paths)
    assert sampler.requests[1][0].n == 2 and sampler.requests[1][0].max_tokens == 16


@pytest.mark.parametrize(
    "branching, depths, match",
    [
        ((1, 8), (0, 4), "at least 2"),
        ((4, 2), (0,), "one token depth per level"),
        ((4, 2), (2, 4), "start at 0"),
    ],
)
def test_bad_schedules_are_refused(branching, depths, match):
    with pytest.raises(ValueError, match=match):
        TreeSchedule(branching, depths)


def test_config_checks_the_tree_settings():
    from mcadvantage import VinePPOConfig

    with pytest.raises(ValueError, match="product equal num_generations"):
        VinePPOConfig(
            "/tmp/x",
            advantage_estimator="tree",
            num_generations=6,
            per_device_train_batch_size=6,
            tree_branching=[4, 2],
        )
    with pytest.raises(ValueError, match="below max_completion_length"):
        VinePPOConfig(
            "/tmp/x",
            advantage_estimator="tree",
            num_generations=8,
            max_completion_length=16,
            tree_depths=[0, 16],
        )
    config = VinePPOConfig("/tmp/x", advantage_estimator="tree", num_generations=8, max_completion_length=64)
    assert TreeEstimator.from_config(config).tree_schedule(64) == TreeSchedule((4, 2), (0, 32))


def _toy(seed: int) -> StepTreeSampler:
    # 3 step tokens (ids 10, 11) per response, then success (1) / failure (2), then EOS (0).
    return StepTreeSampler(
        step_token_ids=[10, 11],
        step_probs=[0.6, 0.4],
        depth=3,
        success_prob=lambda steps: [0.2, 0.5, 0.5, 0.9][steps[0] + 2 * steps[1]] if len(steps) >= 2 else 0.5,
        success_token_id=1,
        failure_token_id=2,
        eos_token_id=0,
        seed=seed,
    )


def test_node_values_are_unbiased_and_own_outcomes_do_not_covary_with_baselines():
    """Exact toy: 3,000 trees of 2 x 2 branching at step 2. Every inner node's estimate is within 4 SE of its exact
    value on average, and the product (own reward - exact child value) x (baseline - exact node value) averages to
    0 within 4 SE: a leaf's baselines are made of siblings only."""
    toy = _toy(seed=0)
    schedule = TreeSchedule((2, 2), (0, 2))
    prompt = [7]
    errors: list[float] = []
    products: list[float] = []
    for _ in range(3000):
        [tree] = draw_trees(toy, [prompt], schedule, max_completion_length=toy.response_length)
        rewards = [1.0 if ids[-2] == 1 else 0.0 for ids in tree.completions]
        values = tree_node_values(tree.paths, rewards)
        for path, ids, reward in zip(tree.paths, tree.completions, rewards, strict=True):
            node_ids = ids[: path.offsets[-1]]
            errors.append(values[path.children[:-1]] - toy.value(prompt + node_ids))
            siblings = [
                values[(*path.children[:-1], j)] for j in range(path.widths[-1]) if j != path.children[-1]
            ]
            baseline = sum(siblings) / len(siblings)
            exact = toy.value(prompt + node_ids)
            products.append((reward - exact) * (baseline - exact))
    for xs in (errors, products):
        mean, se = statistics.mean(xs), statistics.stdev(xs) / math.sqrt(len(xs))
        assert abs(mean) < 4 * se + 1e-9, (mean, se)


def _batch(paths, rewards, lengths, mask_rows=()):
    mask = torch.zeros((len(paths), max(lengths)), dtype=torch.long)
    for i, n in enumerate(lengths):
        if i not in mask_rows:
            mask[i, :n] = 1
    return AdvantageBatch(
        prompt_ids=[[1]] * len(paths),
        completion_ids=[[3] * n for n in lengths],
        completion_mask=mask,
        rewards_per_func=torch.tensor(rewards, dtype=torch.float32).unsqueeze(1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(paths)),
        group_size=len(paths),
        tree_paths=paths,
    )


def test_masked_responses_chosen_by_outcome_change_no_other_credit():
    rng = random.Random(0)
    schedule_paths = [TreePath((a, b), (0, 3), (2, 2)) for a in range(2) for b in range(2)]  # one 2 x 2 tree
    context = EstimatorContext(policy_sampler=None, reward_funcs=[], reward_weights=[1.0], tokenizer=None)
    for _ in range(20):
        rewards = [float(rng.random() < 0.5) for _ in range(4)]
        full = TreeEstimator(branching=(2, 2)).estimate(
            _batch(schedule_paths, rewards, [6, 5, 7, 4]), context
        )
        masked_rows = {i for i, r in enumerate(rewards) if r == 1.0}  # masked because they passed
        masked = TreeEstimator(branching=(2, 2)).estimate(
            _batch(schedule_paths, rewards, [6, 5, 7, 4], masked_rows), context
        )
        for i in range(4):
            if i in masked_rows:
                assert not masked.advantages[i].any() and not masked.token_mask[i].any()
            else:
                assert torch.equal(masked.advantages[i], full.advantages[i])


def test_training_batches_without_trees_are_refused():
    context = EstimatorContext(policy_sampler=None, reward_funcs=[], reward_weights=[1.0], tokenizer=None)
    batch = _batch([TreePath((0,), (0,), (2,))] * 2, [1.0, 0.0], [2, 2])
    batch.tree_paths = None
    with pytest.raises(ValueError, match="tree-sampled groups"):
        TreeEstimator(branching=(2,)).estimate(batch, context)
    batch.mode = "eval"  # independent responses: RLOO's leave-one-out, a one-level tree
    result = TreeEstimator(branching=(2,)).estimate(batch, context)
    assert result.advantages[:, 0].tolist() == [1.0, -1.0]


@pytest.mark.slow
def test_tree_gradient_is_unbiased_on_the_exact_toy():
    """The exact toy of the gradient instrument (known policy gradient): 300 tree batches (4 prompts, 4 x 2 trees
    branching at token 1, no whitening, which would rescale by the batch). The mean gradient's cosine to the exact
    gradient is near 1 and its error is within what the repeats' noise explains (bias ratio under 4, as for GRPO in
    test_hybrid)."""
    task = toy_gradient_task([0.05, 0.3, 0.6, 0.9], seed=3)[0]
    exact = task.oracle.exact_gradient()
    estimator = TreeEstimator(branching=(4, 2), depths=(0, 1))
    estimator.whiten_by_default = False
    runs = [estimator_gradient(task, estimator, [(4 * r + j) % 64 for j in range(4)], 8) for r in range(300)]
    metrics = gradient_metrics([r.gradient for r in runs], exact)
    assert metrics["mean_cosine"] > 0.9 and metrics["bias_ratio"] < 4.0, metrics
    # The tree shares its first token across pairs of leaves: fewer sampled tokens than trained ones.
    assert statistics.mean(r.sampled_tokens for r in runs) < statistics.mean(r.trained_tokens for r in runs)
