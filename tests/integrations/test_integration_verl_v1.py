"""mcadvantage in verl 0.9's default trainer (V1), on CPU: a real ``PPOTrainerSync._step_once`` with
``MCAdvantageV1Mixin``, rows put into TransferQueue by verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess``, and
verl's own ``_compute_advantage``, ``_balance_batch`` (its padding rows included) and bypass-mode
``_compute_old_log_prob``. Stood in (tests/integrations/_verl_v1_standins.py says why): TransferQueue's Ray-backed
storage, the replay buffer, the GPU actor workers, the rollout replicas and their client.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys

import pytest
import torch
from packaging.version import Version

pytest.importorskip("verl", reason="verl is installed by scripts/_setup_venv.sh (install_verl_cpu)")
pytest.importorskip(
    "transfer_queue", reason="verl's V1 trainer needs TransferQueue (install_verl_cpu installs it)"
)
tensordict = pytest.importorskip("tensordict")
if Version(tensordict.__version__) < Version("0.10"):
    pytest.skip(
        "verl's V1 trainer stores non-tensor fields, which needs tensordict>=0.10", allow_module_level=True
    )

from _verl_standins import ScriptedEngine, hydra_standin  # noqa: E402
from _verl_v1_standins import (  # noqa: E402
    InProcessTransferQueue,
    ScriptedLLMClient,
    agent_loop_worker,
    put_session,
    v1_trainer,
)
from omegaconf import OmegaConf  # noqa: E402

from mcadvantage.core.advantages import loss_token_mask  # noqa: E402
from mcadvantage.estimators.anchor import AnchorEstimator  # noqa: E402
from mcadvantage.estimators.batch import AdvantageBatch, EstimatorContext, finalize_advantages  # noqa: E402
from mcadvantage.estimators.vineppo import VinePPOEstimator  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def v1():
    """verl's V1 modules and ``mcadvantage.integrations.verl_v1``, imported with a hydra stand-in where hydra cannot
    be imported (verl's agent-loop module imports it; see ``_verl_standins.hydra_standin``); the modules bound to
    the stand-in are dropped from ``sys.modules`` afterwards."""
    saved = {name: sys.modules.get(name) for name in ("hydra", "hydra.utils")}
    if importlib.util.find_spec("hydra") is None:
        standin = hydra_standin()
        sys.modules.update({"hydra": standin, "hydra.utils": standin.utils})
    before = set(sys.modules)
    try:
        from verl.trainer.ppo.v1 import agent_loop_tq, trainer_base

        from mcadvantage.integrations import verl_v1

        yield type("V1", (), {"tq": agent_loop_tq, "base": trainer_base, "mc": verl_v1})
    finally:
        for name in set(sys.modules) - before:
            if name.startswith(
                (
                    "verl.experimental",
                    "verl.trainer.ppo.v1",
                    "verl.trainer.main_ppo",
                    "mcadvantage.integrations.verl_v1",
                )
            ):
                del sys.modules[name]
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _config(estimator: str, kwargs: dict, *, n: int, mini_batch: int = 1) -> OmegaConf:
    """verl's own generated PPO config with the recipe's mcadvantage section (examples/verl/config/...)."""
    import verl

    cfg = OmegaConf.load(
        os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml")
    )
    overrides = OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "grpo", "rollout_correction": {"bypass_mode": True}},
            "actor_rollout_ref": {
                "rollout": {"n": n, "temperature": 0.6, "top_p": 1.0, "top_k": -1},
                "actor": {"ppo_mini_batch_size": mini_batch, "use_kl_loss": False},
            },
            "critic": {"enable": False},
            "data": {"max_response_length": 24},
            "trainer": {"critic_warmup": 0},
            "mcadvantage": {"advantage_estimator": estimator, "estimator_kwargs": kwargs},
        }
    )
    return OmegaConf.merge(cfg, overrides)


def _output(v1, prompt: list[int], response: list[int], mask: list[int], score: float | None, keys=None):
    """verl's ``AgentLoopOutput`` as an agent loop that scores its own episodes returns it (log-probs of the sampled
    tokens included; ``reward_extra_info`` is what verl's reward loop would have added)."""
    extra = {"reward_extra_info": {}, **({} if keys is None else {"turn_keys": list(keys)})}
    return v1.tq.AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=[-0.5] * len(response),
        reward_score=score,
        num_turns=2,
        metrics={},
        extra_fields=extra,
    )


def _step(trainer):
    metrics: dict = {}
    batch = trainer._step_once(metrics, {}, sample_batch_size=4)
    return batch, metrics, trainer.actor_rollout_wg.updates[-1]


# -- anchor: per-turn rows of multi-turn sessions ---------------------------------------------------------------------

# Two prompts, two sessions each (groups of two). A session is a list of agent-loop outputs (rows); a row is
# (model turns, each: (state key, model tokens, tool tokens)). Keys recur across a group's sessions.
EPISODES = {
    "p0": [
        ([[("s0", "ab", "T"), ("s1", "cd", "")]], [[("s2", "e", "")]], 1.0),
        ([[("s0", "ab", "T"), ("s3", "xy", "")]], [], 0.0),
    ],
    "p1": [
        ([[("s0", "hi", "U"), ("s4", "jk", "")]], [], 1.0),
        ([[("s0", "hq", "U"), ("s4", "jz", "VV")], [("s5", "m", "")]], [], 0.0),
    ],
}


def _rows_of(session) -> list[list[tuple[str, str, str]]]:
    first, more, _ = session
    return first + more


def _put_anchor_batch(v1, worker, tok) -> dict[str, list[tuple[list[str], list[int]]]]:
    """Put every session's rows; returns, per row key, its turns' state keys and response_mask."""
    layout = {}
    for p, sessions in EPISODES.items():
        prompt = tok.encode(f"Q {p}\n")
        for number, session in enumerate(sessions):
            history, outputs = list(prompt), []
            rows = _rows_of(session)
            for index, turns in enumerate(rows):
                response, mask = [], []
                for _, model, tool in turns:
                    response += tok.encode(model) + tok.encode(tool)
                    mask += [1] * len(model) + [0] * len(tool)
                last = index == len(rows) - 1
                outputs.append(
                    _output(
                        v1, list(history), response, mask, session[2] if last else None, [t[0] for t in turns]
                    )
                )
                layout[f"{p}_{number}_{index}"] = ([t[0] for t in turns], mask)
                history += response + tok.encode("\n")
            put_session(worker, outputs, uid=p, session_id=number, columns={"data_source": "toy"})
    return layout


def _anchor_reference(tok) -> list[list[float]]:
    """AnchorEstimator run directly on the episodes: per session (batch order), the value of each model turn."""
    completions, masks, keys, rewards = [], [], [], []
    for sessions in EPISODES.values():
        for session in sessions:
            ids, mask, turn_keys = [], [], []
            for turns in _rows_of(session):
                for key, model, tool in turns:
                    ids += tok.encode(model) + tok.encode(tool or "|")  # a tool token between every two turns
                    mask += [1] * len(model) + [0] * len(tool or "|")
                    turn_keys.append(key)
            completions.append(ids)
            masks.append(mask)
            keys.append(turn_keys)
            rewards.append(session[2])
    width = max(map(len, completions))
    completion_mask = torch.zeros((len(completions), width), dtype=torch.long)
    tool_mask = torch.zeros_like(completion_mask)
    for i, (ids, mask) in enumerate(zip(completions, masks, strict=True)):
        completion_mask[i, : len(ids)], tool_mask[i, : len(ids)] = 1, torch.tensor(mask)
    batch = AdvantageBatch(
        prompt_ids=[[1]] * len(completions),
        completion_ids=completions,
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor(rewards).unsqueeze(1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(completions)),
        group_size=2,
        tool_mask=tool_mask,
        turn_keys=keys,
    )
    estimator = AnchorEstimator()
    result = estimator.estimate(batch, EstimatorContext.single_process(None, [], tok))
    adv = finalize_advantages(result, loss_token_mask(completion_mask, tool_mask), whiten=False)
    out = []
    for i, mask in enumerate(masks):  # the value of each model turn: its first model token's advantage
        starts = [j for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1])]
        out.append([float(adv[i, j]) for j in starts])
    return out


def test_v1_training_step_with_anchor_turn_credit(v1, char_tokenizer, monkeypatch):
    tok = char_tokenizer
    store = InProcessTransferQueue().install(monkeypatch)
    config = _config("anchor", {}, n=2, mini_batch=2)
    layout = _put_anchor_batch(v1, agent_loop_worker(v1.tq.AgentLoopWorkerTQ, config, tok), tok)
    trainer = v1_trainer(v1.mc.register_mc_trainer(), config, tok, store, client=None)
    batch, metrics, update = _step(trainer)

    # 6 rows; ppo_mini_batch_size * n = 4, so verl's _balance_batch added two padding rows.
    assert len(layout) == 6 and len(update["keys"]) == 8
    padding = [k for k, tag in zip(update["keys"], update["tags"], strict=True) if tag.get("is_padding")]
    assert len(padding) == 2
    reference = iter(_anchor_reference(tok))
    expected_by_session = {
        f"{p}_{n}": next(reference) for p, sessions in EPISODES.items() for n in range(len(sessions))
    }
    for key, advantages, returns in zip(update["keys"], update["advantages"], update["returns"], strict=True):
        assert torch.equal(advantages, returns)
        if key in padding:
            assert advantages.abs().sum() == 0
            continue
        session, index = key.rsplit("_", 1)
        turn_keys, mask = layout[key]
        values = iter(
            expected_by_session[session][sum(len(layout[f"{session}_{j}"][0]) for j in range(int(index))) :]
        )
        expected, previous = [], 0
        for m in mask:  # each model turn's tokens carry its turn's value, tool tokens 0
            value = next(values) if m and not previous else (expected[-1] if m else 0.0)
            expected.append(value if m else 0.0)
            previous = m
        assert advantages.tolist() == pytest.approx(expected, abs=0), key
    assert metrics["anchor/singleton_turn_share"] < 1.0
    # the episode credit under the turn credit: the rewarded session's first turn beats its group-mate's
    assert expected_by_session["p0_0"][0] > expected_by_session["p0_1"][0]
    assert trainer.checkpoint_manager.calls == [
        ("sleep_replicas", None)
    ]  # on_sample_end only: nothing sampled


# -- vineppo: Monte Carlo continuations through the rollout servers ----------------------------------------------------

PROMPTS = ["Start at 2. Add 3.\n", "Start at 4. Add 1.\n"]
RESPONSES = [["2+3=5\n#### 5", "2+3=6\n#### 6"], ["4+1=5\n#### 5", "4+1=5\n#### 7"]]
GOLD = "5"


def _engine(tok):
    """Answers right with probability 0.9 after a correct first line, else 0.2."""

    def answer(prefix, rng):
        text = tok.decode(list(prefix))
        p = 0.9 if text.endswith(("2+3=5\n", "4+1=5\n")) else 0.2
        return tok.encode("#### 5" if rng.random() < p else "#### 7") + [tok.eos_token_id]

    return ScriptedEngine(answer)


def test_v1_training_step_with_vineppo(v1, char_tokenizer, monkeypatch):
    tok = char_tokenizer
    store = InProcessTransferQueue().install(monkeypatch)
    config = _config("vineppo", {"num_rollouts": 4, "step_segmenter": "gsm8k"}, n=2)
    worker = agent_loop_worker(v1.tq.AgentLoopWorkerTQ, config, tok)
    columns = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": GOLD}}
    rows = []
    for p, (prompt, responses) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        for number, response in enumerate(responses):
            ids = tok.encode(response) + [tok.eos_token_id]
            score = float(response.endswith(GOLD))
            put_session(
                worker,
                [_output(v1, tok.encode(prompt), ids, [1] * len(ids), score)],
                uid=f"u{p}",
                session_id=number,
                columns=columns,
            )
            rows.append((tok.encode(prompt), ids, score))
    client = ScriptedLLMClient(_engine(tok))
    trainer = v1_trainer(v1.mc.register_mc_trainer(), config, tok, store, client)
    _, metrics, update = _step(trainer)

    # The reference: VinePPOEstimator on the same responses, through a plain Sampler on the same engine.
    width = max(len(ids) for _, ids, _ in rows)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (_, ids, _) in enumerate(rows):
        mask[i, : len(ids)] = 1
    from mcadvantage.integrations.verl import verl_reward_function

    batch = AdvantageBatch(
        prompt_ids=[p for p, _, _ in rows],
        completion_ids=[ids for _, ids, _ in rows],
        completion_mask=mask,
        rewards_per_func=torch.tensor([[s] for _, _, s in rows]),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(rows)),
        group_size=2,
        rows=[dict(columns) for _ in rows],
    )
    context = EstimatorContext.single_process(
        _engine(tok), [verl_reward_function()], tok, max_completion_length=24
    )
    estimator = VinePPOEstimator(num_rollouts=4, step_segmenter="gsm8k")
    expected = finalize_advantages(estimator.estimate(batch, context), mask, whiten=True)

    assert update["keys"] == [f"u{p}_{n}_0" for p in range(2) for n in range(2)]
    for i, (advantages, returns) in enumerate(zip(update["advantages"], update["returns"], strict=True)):
        assert torch.equal(advantages, expected[i, : len(rows[i][1])]), i  # token for token
        assert torch.equal(advantages, returns)
    assert metrics["mc/rollouts"] > 0 and metrics["mc/rollouts"] % 4 == 0
    assert len(client.sampling_params) == metrics["mc/rollouts"]
    assert {(p["temperature"], p["top_p"], p["top_k"]) for p in client.sampling_params} == {(0.6, 1.0, -1)}
    # on_sample_end slept the replicas; the Monte Carlo step woke them with the step's weights and slept them again
    assert trainer.checkpoint_manager.calls == [
        ("sleep_replicas", None),
        ("update_weights", 1),
        ("sleep_replicas", None),
    ]


def test_vineppo_refuses_multi_turn_sessions(v1, char_tokenizer, monkeypatch):
    tok = char_tokenizer
    store = InProcessTransferQueue().install(monkeypatch)
    config = _config("vineppo", {"num_rollouts": 2}, n=2)
    _put_anchor_batch(v1, agent_loop_worker(v1.tq.AgentLoopWorkerTQ, config, tok), tok)
    trainer = v1_trainer(v1.mc.register_mc_trainer(), config, tok, store, ScriptedLLMClient(_engine(tok)))
    with pytest.raises(NotImplementedError, match="anchor"):
        _step(trainer)


def test_v1_interfaces_we_rely_on(v1):
    """Fails when verl renames or reshapes what the mixin relies on."""
    base = v1.base.PPOTrainer
    assert list(inspect.signature(base._compute_advantage).parameters) == ["self", "batch", "metrics"]
    src = inspect.getsource(base._compute_advantage)
    assert "compute_advantage_for_multi_trajectories(" in src and "response_to_nested" in src
    assert 'fields = ["advantages", "returns"]' in src
    step = inspect.getsource(base._step_once)
    assert step.index("self._compute_advantage(") < step.index("self._update_actor(")
    assert "self.llm_server_manager.get_client()" in inspect.getsource(base.get_llm_client)
    assert '_{session_id}_{i}"' in inspect.getsource(
        v1.tq.AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess
    )
    cls = v1.mc.register_mc_trainer()
    assert v1.base.get_trainer_cls("sync") is cls and v1.mc.register_mc_trainer() is cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    assert issubclass(cls, PPOTrainerSync) and "_compute_advantage" in vars(v1.mc.MCAdvantageV1Mixin)
    # verl reads the mode name beyond the registry: "sync" picks the synchronous replay buffer.
    assert 'self.trainer_mode == "sync"' in inspect.getsource(base._build_replay_buffer)
    assert "get_trainer_cls(config.trainer.v1.trainer_mode)" in _source("verl.trainer.main_ppo")


def _source(module: str) -> str:
    """An installed module's source, read without importing it (verl.trainer.main_ppo imports hydra)."""
    from pathlib import Path

    return Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")


def test_async_modes_refuse_sampling_estimators(v1, char_tokenizer, monkeypatch):
    tok = char_tokenizer
    store = InProcessTransferQueue().install(monkeypatch)
    config = _config("vineppo", {"num_rollouts": 2}, n=2)
    config.trainer.v1.trainer_mode = "colocate_async"
    cls = v1.mc.register_mc_trainer("colocate_async")
    trainer = v1_trainer(cls, config, tok, store, ScriptedLLMClient(_engine(tok)))
    put_session(
        agent_loop_worker(v1.tq.AgentLoopWorkerTQ, config, tok),
        [_output(v1, [1, 5], [6, 2], [1, 1], 1.0)],
        uid="u",
        session_id=0,
        columns={},
    )
    with pytest.raises(ValueError, match="trainer_mode=sync"):
        trainer._compute_advantage(store.batch(), {})


def test_supported_v1_range(v1):
    v1.mc.check_verl_v1_version()  # the installed one
    for bad in ("0.8.2", "0.10.0"):
        with pytest.raises(ImportError, match="supports verl"):
            v1.mc.check_verl_v1_version(bad)


def test_estimator_from_config_errors(v1):
    with pytest.raises(ValueError, match="advantage_estimator"):
        v1.mc.estimator_from_config(None)
    est, whiten = v1.mc.estimator_from_config(
        OmegaConf.create({"advantage_estimator": "anchor", "whiten": True})
    )
    assert isinstance(est, AnchorEstimator) and whiten is True
    est, whiten = v1.mc.estimator_from_config(
        OmegaConf.create({"advantage_estimator": "vineppo", "estimator_kwargs": {"num_rollouts": 3}})
    )
    assert est.num_rollouts == 3 and whiten is None


# -- the recipe ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recipe(v1):
    """examples/verl/mc_trainer_v1.py as a module (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "mc_trainer_v1", os.path.join(ROOT, "examples/verl/mc_trainer_v1.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_task_runner_registers_the_trainer_in_the_actor(v1, recipe):
    """``mc_task_runner()`` is a Ray actor class derived from verl's ``TaskRunnerV1``; its ``run`` (what the actor
    executes) puts the mixin on the configured mode's trainer before verl's ``run`` looks it up. No Ray cluster is
    started: the second half runs the class behind the actor on a stand-in of verl's runner."""
    import ray
    from ray.actor import ActorClass

    installed = recipe.mc_task_runner()
    assert isinstance(installed, ActorClass)
    main_ppo = importlib.import_module("verl.trainer.main_ppo")
    assert issubclass(installed.__ray_actor_class__, main_ppo.TaskRunnerV1.__ray_actor_class__)
    ray.cloudpickle.dumps(installed.__ray_actor_class__)  # Ray ships the class by value

    class TaskRunnerV1:  # verl's run() looks the trainer up by mode, then builds and fits it
        def run(self, config):
            return v1.base.get_trainer_cls(config.trainer.v1.trainer_mode)

    fake = type("main_ppo", (), {"TaskRunnerV1": ray.remote(TaskRunnerV1)})
    built = (
        recipe.mc_task_runner(fake)
        .__ray_actor_class__()
        .run(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}}))
    )
    assert issubclass(built, v1.mc.MCAdvantageV1Mixin) and built is v1.base.get_trainer_cls("sync")


def test_recipe_config_keys_are_verls():
    """Every key the recipe's config and run script set exists in the installed verl's PPO config (the
    ``mcadvantage`` section is the recipe's own), and the section builds the estimator."""
    import re

    import verl

    ppo = OmegaConf.load(
        os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml")
    )
    recipe_cfg = OmegaConf.load(os.path.join(ROOT, "examples/verl/config/mc_trainer_v1.yaml"))

    def leaves(node, prefix=""):
        for key, value in node.items():
            name = f"{prefix}{key}"
            yield from leaves(value, name + ".") if isinstance(value, dict) else [name]

    keys = [
        k
        for k in leaves(OmegaConf.to_container(recipe_cfg))
        if not k.startswith(("hydra.", "defaults", "mcadvantage."))
    ]
    script = open(os.path.join(ROOT, "examples/verl/run_mc_v1_gsm8k.sh"), encoding="utf-8").read()
    keys += re.findall(r"\s([a-z_]+(?:\.[a-z_0-9]+)+)=", script)
    assert len(set(keys)) > 15

    def has(dotted: str) -> bool:
        node = ppo
        for part in dotted.split("."):
            if not OmegaConf.is_dict(node) or part not in node.keys():  # keys() also lists "???" values
                return False
            node = node._get_node(part)
        return True

    missing = sorted(k for k in set(keys) if not k.startswith("mcadvantage.") and not has(k))
    assert missing == [], missing
    from mcadvantage.integrations.verl_v1 import estimator_from_config

    estimator, whiten = estimator_from_config(recipe_cfg.mcadvantage)
    assert isinstance(estimator, VinePPOEstimator) and whiten is None


def _rows_data(rows):
    """A V1 batch's fields as ``tq.kv_batch_get`` returns them, built with verl's own helper."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    return list_of_dict_to_tensordict(
        [
            {
                "prompts": torch.tensor(p),
                "responses": torch.tensor(r),
                "response_mask": torch.tensor(m),
                "rm_scores": torch.tensor([0.0] * (len(r) - 1) + [s]),
                "extra_fields": extra,
            }
            for p, r, m, s, extra in rows
        ]
    )


def test_sessions_refuse_partial_keys_and_uneven_groups(v1):
    keyed, bare = {"turn_keys": ["a"]}, {}
    data = _rows_data([([1], [5, 2], [1, 1], 1.0, keyed), ([1], [6, 2], [1, 1], 0.0, bare)])
    with pytest.raises(ValueError, match="some do not"):
        v1.mc.read_sessions(["u_0_0", "u_1_0"], data)
    sessions = v1.mc.read_sessions(["u_0_0", "u_1_0", "w_0_0"], _rows_data([([1], [5], [1], 1.0, bare)] * 3))
    with pytest.raises(ValueError, match="different numbers of sessions"):
        v1.mc.advantage_batch_from_sessions(sessions)
    with pytest.raises(ValueError, match="uid"):
        v1.mc.read_sessions(["no-session-index"], _rows_data([([1], [5], [1], 1.0, bare)]))


def test_sessions_read_rows_in_order(v1):
    """Rows of one session come back by index whatever their batch order; the last row's score is the reward."""
    data = _rows_data(
        [
            ([1, 5, 6], [7, 8], [1, 1], 1.0, {"turn_keys": [[1, "b"]]}),  # u_0_1: the second output
            ([1], [5, 6], [1, 0], 0.0, {"turn_keys": [[0, "a"]]}),  # u_0_0: the first
        ]
    )
    (session,) = v1.mc.read_sessions(["u_0_1", "u_0_0"], data)
    assert session.rows == [1, 0] and session.reward == 1.0
    assert session.turn_keys == [(0, "a"), (1, "b")]  # in turn order, lists back to (hashable) tuples
    batch, layout = v1.mc.advantage_batch_from_sessions([session])
    assert batch.completion_ids == [
        [5, 6, 1, 5, 6, 7, 8]
    ]  # first response, then the next row's prompt and response
    assert batch.tool_mask.tolist() == [[1, 0, 0, 0, 0, 1, 1]]
    assert layout.spans == {1: (0, 0, 2), 0: (0, 5, 2)}
