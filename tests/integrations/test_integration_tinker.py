"""mcadvantage.integrations.tinker on real ``tinker`` types, built offline (the Tinker service is not reached), and
on tinker-cookbook's own ``trajectory_to_data`` / ``assemble_training_data``: every datum field checked against the
estimator's output."""

from __future__ import annotations

import random

import pytest
import torch

tinker = pytest.importorskip(
    "tinker", reason="tinker is installed by scripts/_setup_venv.sh (install_tinker)"
)

from mcadvantage.core.advantages import loss_token_mask  # noqa: E402
from mcadvantage.estimators.anchor import AnchorEstimator  # noqa: E402
from mcadvantage.estimators.batch import AdvantageBatch, EstimatorContext, finalize_advantages  # noqa: E402
from mcadvantage.integrations import tinker as mctinker  # noqa: E402


def _fields(d):
    """A datum's model input and loss inputs as plain lists."""
    inputs = {k: v.to_torch() for k, v in d.loss_fn_inputs.items()}
    return d.model_input.to_ints(), inputs


def _multi_turn_batch():
    """Two groups of two episodes, each with model turns and tool tokens, keyed for anchor credit."""
    gen = random.Random(0)
    completions, tool_masks, keys, prompts = [], [], [], []
    for g in range(2):
        for _ in range(2):
            ids, mask, turn_keys = [], [], []
            for t in range(gen.randint(1, 3)):
                model = [gen.randint(4, 50) for _ in range(gen.randint(1, 4))]
                ids += model + [7, 7]
                mask += [1] * len(model) + [0, 0]
                turn_keys.append((g, t, gen.randint(0, 1)))
            completions.append(ids)
            tool_masks.append(mask)
            keys.append(turn_keys)
            prompts.append([1, 10 + g, 11])
    width = max(map(len, completions))
    completion_mask = torch.zeros((4, width), dtype=torch.long)
    tool_mask = torch.zeros_like(completion_mask)
    for i, (ids, mask) in enumerate(zip(completions, tool_masks, strict=True)):
        completion_mask[i, : len(ids)], tool_mask[i, : len(ids)] = 1, torch.tensor(mask)
    return AdvantageBatch(
        prompt_ids=prompts,
        completion_ids=completions,
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor([[1.0], [0.0], [0.5], [0.0]]),
        reward_weights=torch.ones(1),
        local_slice=slice(0, 4),
        group_size=2,
        tool_mask=tool_mask,
        turn_keys=keys,
    )


@pytest.mark.parametrize("whiten", [False, True])
def test_datums_from_result_field_by_field(whiten):
    batch = _multi_turn_batch()
    result = AnchorEstimator().estimate(batch, EstimatorContext.single_process(None, [], None))
    logprobs = [[-0.1 * (j + 1) for j in range(len(c))] for c in batch.completion_ids]
    data = mctinker.datums_from_result(batch, result, logprobs, whiten=whiten)
    expected = finalize_advantages(
        result, loss_token_mask(batch.completion_mask, batch.tool_mask), whiten=whiten
    )
    assert expected.abs().sum() > 0
    for i, d in enumerate(data):
        prompt, completion = batch.prompt_ids[i], batch.completion_ids[i]
        model_input, inputs = _fields(d)
        assert set(inputs) == set(mctinker.LOSS_FN_INPUTS)
        assert model_input == (prompt + completion)[:-1]
        assert inputs["target_tokens"].dtype == torch.int64
        assert inputs["target_tokens"].tolist() == (prompt + completion)[1:]
        head = len(prompt) - 1  # targets before the first completion token: the prompt's own
        assert inputs["advantages"].dtype == torch.float32 and inputs["logprobs"].dtype == torch.float32
        assert torch.equal(inputs["advantages"][head:], expected[i, : len(completion)])
        assert inputs["advantages"][:head].eq(0).all()
        assert inputs["logprobs"][head:].tolist() == pytest.approx(logprobs[i])
        assert inputs["logprobs"][:head].eq(0).all()
        tools = [j for j, m in enumerate(batch.tool_mask[i, : len(completion)].tolist()) if not m]
        assert inputs["advantages"][[head + j for j in tools]].eq(0).all()
    for loss_fn in ("importance_sampling", "ppo"):  # the request type forward_backward sends, built offline
        request = tinker.types.ForwardBackwardInput(data=data, loss_fn=loss_fn)
        assert len(request.data) == 4


def test_datums_from_mc_estimate(char_tokenizer):
    from _verl_standins import ScriptedEngine

    from mcadvantage import MCValueEstimator, Trajectory, segment_completion

    tok = char_tokenizer

    def answer(prefix, rng):
        p = 0.9 if tok.decode(list(prefix)).endswith("2+3=5\n") else 0.2
        return tok.encode("#### 5" if rng.random() < p else "#### 7") + [tok.eos_token_id]

    def reward(prompts, completions, **_):
        return [float(c.strip().endswith("#### 5")) for c in completions]

    trajectories = []
    for prompt, response in [
        ("Start at 2. Add 3.\n", "2+3=5\n#### 5"),
        ("Start at 2. Add 3.\n", "2+3=6\n#### 7"),
    ]:
        ids = tok.encode(response) + [tok.eos_token_id]
        trajectories.append(
            Trajectory(
                prompt_ids=tok.encode(prompt),
                completion_ids=ids,
                step_boundaries=segment_completion("gsm8k", tok, ids),
                reward=reward([prompt], [response])[0],
                prompt=prompt,
            )
        )
    estimate = MCValueEstimator(
        ScriptedEngine(answer), reward, tok, num_rollouts=4, max_completion_length=24
    ).estimate(trajectories)
    logprobs = [[-1.0] * len(t.completion_ids) for t in trajectories]
    data = mctinker.datums_from_estimate(trajectories, estimate, logprobs)
    for traj, advs, d in zip(trajectories, estimate.token_advantages, data, strict=True):
        _, inputs = _fields(d)
        head = len(traj.prompt_ids) - 1
        assert torch.equal(inputs["advantages"][head:], advs.to(torch.float32))
    assert float(estimate.token_advantages[0].abs().sum()) > 0


def test_datum_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="one value per completion token"):
        mctinker.datum([1], [2, 3], [0.5], [0.0, 0.0])
    with pytest.raises(ValueError, match="needs a prompt"):
        mctinker.datum([], [2], [0.5], [0.0])


# -- tinker-cookbook --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cookbook():
    return pytest.importorskip(
        "tinker_cookbook.rl.data_processing", reason="tinker-cookbook is installed by scripts/_setup_venv.sh"
    )


def _groups(cookbook):
    """Two groups of two trajectories: multi-turn, each observation extending the sequence so far except one (a
    context reset), one parse-error turn the cookbook masks, states in ``logs["state"]``."""
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.rl.types import (
        PARSE_ERROR_MASKED_METRIC_KEY,
        Trajectory,
        TrajectoryGroup,
        Transition,
    )

    gen = random.Random(1)
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(2):
            sequence, transitions = [1, 20 + g], []
            for t in range(3):
                reset = g == 1 and i == 0 and t == 2
                ob = [1, 30] if reset else sequence + ([5, 6] if t else [])
                action = [gen.randint(40, 90) for _ in range(gen.randint(1, 3))]
                masked = g == 0 and i == 1 and t == 1
                transitions.append(
                    Transition(
                        ob=tinker.ModelInput.from_ints(ob),
                        ac=TokensWithLogprobs(
                            tokens=action, maybe_logprobs=[-0.25 * (k + 1) for k in range(len(action))]
                        ),
                        reward=0.0,
                        episode_done=t == 2,
                        metrics={PARSE_ERROR_MASKED_METRIC_KEY: 1.0} if masked else {},
                        logs={"state": f"g{g}t{t}s{gen.randint(0, 1)}"},
                    )
                )
                sequence = ob + action
            trajectories.append(
                Trajectory(transitions=transitions, final_ob=tinker.ModelInput.from_ints(sequence))
            )
        groups.append(TrajectoryGroup(trajectories, final_rewards_G=[float(i == g), 0.5], metrics_G=[{}, {}]))
    return groups


def _anchor_per_turn(groups) -> list[list[float]]:
    """AnchorEstimator run directly on the trajectories' turns (keys, total rewards, groups): per trajectory, each
    action's value."""
    completions, masks, keys, rewards = [], [], [], []
    for group in groups:
        rewards += group.get_total_rewards()
        for traj in group.trajectories_G:
            ids, mask = [], []
            for tr in traj.transitions:
                ids += list(tr.ac.tokens) + [3]
                mask += [1] * len(tr.ac.tokens) + [0]
            completions.append(ids)
            masks.append(mask)
            keys.append([tr.logs["state"] for tr in traj.transitions])
    width = max(map(len, completions))
    cm, tm = (
        torch.zeros((len(completions), width), dtype=torch.long),
        torch.zeros((len(completions), width), dtype=torch.long),
    )
    for i, (ids, mask) in enumerate(zip(completions, masks, strict=True)):
        cm[i, : len(ids)], tm[i, : len(ids)] = 1, torch.tensor(mask)
    batch = AdvantageBatch(
        prompt_ids=[[1]] * len(completions),
        completion_ids=completions,
        completion_mask=cm,
        rewards_per_func=torch.tensor(rewards).unsqueeze(1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(completions)),
        group_size=2,
        tool_mask=tm,
        turn_keys=keys,
    )
    result = AnchorEstimator().estimate(batch, EstimatorContext.single_process(None, [], None))
    adv = finalize_advantages(result, loss_token_mask(cm, tm), whiten=False)
    out = []
    for i, mask in enumerate(masks):
        starts = [j for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1])]
        out.append([float(adv[i, j]) for j in starts])
    return out


def test_cookbook_training_data_per_token(cookbook):
    groups = _groups(cookbook)
    data, metadata, metrics = mctinker.cookbook_training_data(
        groups, AnchorEstimator(), state_key=lambda transition: transition.logs["state"]
    )
    # The cookbook's own layout, with its one advantage per trajectory (1.0 marks its action tokens).
    reference, reference_meta = cookbook.assemble_training_data(groups, [torch.ones(2), torch.ones(2)])
    assert (
        metadata == reference_meta and len(data) == len(reference) == 5
    )  # the context reset splits one trajectory
    per_turn = iter(_anchor_per_turn(groups))
    values = {(m["group_idx"], m["traj_idx"]): None for m in metadata}
    for key in values:
        values[key] = next(per_turn)
    position = {}
    for d, ref, meta in zip(data, reference, metadata, strict=True):
        model_input, inputs = _fields(d)
        _, ref_inputs = _fields(ref)
        assert model_input == ref.model_input.to_ints()
        assert (
            d.model_input_spans == ref.model_input_spans and d.loss_fn_input_spans == ref.loss_fn_input_spans
        )
        for name in ("target_tokens", "mask", "logprobs"):
            assert torch.equal(inputs[name], ref_inputs[name]), name
        traj = groups[meta["group_idx"]].trajectories_G[meta["traj_idx"]]
        # Walk the cookbook's action positions (where it put its 1.0 or a masked 0) in order: turn by turn.
        key = (meta["group_idx"], meta["traj_idx"])
        turn = position.get(key, 0)
        expected = torch.zeros_like(inputs["advantages"])
        actions = [j for j, lp in enumerate(ref_inputs["logprobs"].tolist()) if lp != 0]
        cursor = 0
        while cursor < len(actions) and turn < len(traj.transitions):
            tr = traj.transitions[turn]
            span = actions[cursor : cursor + len(tr.ac.tokens)]
            if not tr.metrics:  # a masked parse-error turn keeps 0, as the cookbook's
                expected[span] = values[key][turn]
            cursor += len(tr.ac.tokens)
            turn += 1
        position[key] = turn
        assert torch.equal(inputs["advantages"], expected), meta
    assert any(float(d.loss_fn_inputs["advantages"].to_torch().abs().sum()) > 0 for d in data)
    assert 0.0 <= metrics["singleton_turn_share"] <= 1.0


def test_cookbook_refuses_sampling_estimators_and_uneven_groups(cookbook):
    from mcadvantage.estimators.vineppo import VinePPOEstimator

    groups = _groups(cookbook)
    with pytest.raises(ValueError, match="samples continuations"):
        mctinker.cookbook_training_data(groups, VinePPOEstimator())
    groups[1].trajectories_G.pop()
    groups[1].final_rewards_G.pop()
    groups[1].metrics_G.pop()
    with pytest.raises(ValueError, match="sizes"):
        mctinker.advantage_batch_from_trajectory_groups(groups)
