"""mcadvantage.integrations.verl on verl's real DataProto and padding code, on CPU (no Ray cluster, no GPU).

The Ray training loop itself (examples/verl/) needs GPUs and is not run here; see docs/howto/verl.md.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.util
import inspect
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl", reason="verl is installed by scripts/_setup_venv.sh (install_verl_cpu)")

from _verl_standins import HFRolloutWorkerGroup, ScriptedEngine, hydra_standin, verl_training_batch  # noqa: E402
from verl import DataProto  # noqa: E402

from mcadvantage import MCValueEstimator, Trajectory, VinePPOEstimator, masked_whiten, segment_completion  # noqa: E402
from mcadvantage.integrations import verl as mcverl  # noqa: E402
from mcadvantage.samplers.base import RolloutRequest, Sampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Start at 2. Add 3, then multiply by 1.\n", "Start at 4. Add 1.\n", "Start at 2. Add 3.\n"]
RESPONSES = ["2+3=5\n5*1=5\n#### 5", "4+1=6\n#### 6", "2+3=5\n#### 5"]
GOLDS = ["5", "5", "5"]
SCORES = [1.0, 0.0, 1.0]


@pytest.fixture(scope="module")
def recipe():
    """examples/verl/vineppo_trainer.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("vineppo_recipe", ROOT / "examples/verl/vineppo_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the interfaces we rely on ------------------------------------------------------------------------------------


def test_supported_range_matches_pyproject_and_installed_verl():
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["verl"]
    assert extra == [f"verl{mcverl.SUPPORTED_VERL}"]
    mcverl.check_verl_version()  # the installed one
    for bad in ("0.7.1", "0.10.0"):
        with pytest.raises(ImportError, match="supports verl"):
            mcverl.check_verl_version(bad)
    mcverl.check_verl_version("0.8.0")


def test_verl_interfaces_we_rely_on():
    """Fails when verl renames or reshapes what the adapter and the recipe use."""
    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
    from verl.trainer.ppo import core_algos, ray_trainer

    assert set(inspect.signature(DataProto.from_dict).parameters) >= {"tensors", "non_tensors", "meta_info"}
    assert list(inspect.signature(pad_dataproto_to_divisor).parameters) == ["data", "size_divisor"]
    assert list(inspect.signature(unpad_dataproto).parameters) == ["data", "pad_size"]
    assert callable(core_algos.register_adv_est) and callable(core_algos.get_adv_estimator_fn)
    # compute_advantage writes these two keys; the recipe overwrites them before the actor update.
    src = inspect.getsource(ray_trainer.compute_advantage)
    assert 'data.batch["advantages"]' in src and 'data.batch["returns"]' in src
    trainer = ray_trainer.RayPPOTrainer
    assert list(inspect.signature(trainer._update_actor).parameters) == ["self", "batch"]
    fit = inspect.getsource(trainer.fit)
    assert fit.index("compute_advantage(") < fit.index("self._update_actor(batch)")
    assert "self.async_rollout_manager.generate_sequences(" in fit and "sleep_replicas()" in fit
    from verl.checkpoint_engine.base import CheckpointEngineManager

    assert callable(CheckpointEngineManager.wake_up_replicas) and callable(
        CheckpointEngineManager.sleep_replicas
    )
    # The recipe calls them without await: verl wraps these coroutines to run synchronously (auto_await).
    assert not inspect.iscoroutinefunction(CheckpointEngineManager.wake_up_replicas)
    assert not inspect.iscoroutinefunction(CheckpointEngineManager.sleep_replicas)
    init = inspect.getsource(trainer.init_workers)
    assert "self.async_rollout_manager =" in init and "self.checkpoint_manager =" in init
    from verl.utils.reward_score import default_compute_score

    assert default_compute_score("openai/gsm8k", "#### 5", "5") == 1.0


def _function(module: str, name: str) -> ast.FunctionDef:
    """A function of an installed verl module, read from its source (``verl.trainer.main_ppo`` imports hydra at
    module level, which our CI venv cannot import: see ``_verl_standins.hydra_standin``)."""
    origin = importlib.util.find_spec(module).origin
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_verl_task_runner_interfaces_the_recipe_relies_on(recipe):
    """``main()`` hands ``run_ppo`` a task-runner class; ``run_ppo`` calls ``.remote()`` on it, and the task runner's
    ``run`` builds the trainer from its module's global ``RayPPOTrainer`` (which the recipe swaps)."""
    import ray
    from verl.trainer.ppo import ray_trainer

    run_ppo = _function("verl.trainer.main_ppo", "run_ppo")
    assert [a.arg for a in run_ppo.args.args][:2] == ["config", "task_runner_class"]
    assert "task_runner_class.remote()" in ast.unparse(run_ppo)
    module = recipe._task_runner_module()
    runner = module.TaskRunner
    # verl 0.9: a Ray actor class (@ray.remote); verl 0.8: a plain class. vineppo_task_runner handles both.
    assert isinstance(runner, ray.actor.ActorClass) or (
        inspect.isclass(runner) and not hasattr(runner, "remote")
    )
    plain = getattr(runner, "__ray_actor_class__", runner)
    # Ray's tracing may add a _ray_trace_ctx keyword to an actor class' methods.
    assert list(inspect.signature(plain.run).parameters)[:2] == ["self", "config"]
    assert "RayPPOTrainer(" in inspect.getsource(plain.run)
    assert module.RayPPOTrainer is ray_trainer.RayPPOTrainer


def test_import_mcadvantage_does_not_import_the_integration():
    code = (
        "import sys, mcadvantage; mcadvantage.MCValueEstimator; print('verl' in sys.modules, "
        "'mcadvantage.integrations.verl' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_recipe_subclasses_ray_ppo_trainer(recipe):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    assert issubclass(recipe.VinePPORayTrainer, RayPPOTrainer)
    assert "_update_actor" in vars(recipe.VinePPORayTrainer) and "fit" not in vars(recipe.VinePPORayTrainer)
    from verl.trainer.ppo import core_algos

    recipe.register_vineppo_estimator()
    assert core_algos.get_adv_estimator_fn("vineppo") is not None


def test_recipe_task_runner_is_a_ray_actor_class_on_verl_08_and_09(recipe):
    """``main()`` builds its task runner with ``vineppo_task_runner``: a Ray actor class (``run_ppo`` calls
    ``.remote()`` on it) whose ``run`` makes the task runner build ``VinePPORayTrainer``. Subclassing verl 0.9's
    ``@ray.remote`` ``TaskRunner`` directly raised ``ActorClassInheritanceException``; no Ray cluster is started."""
    import ray
    from ray.actor import ActorClass

    installed = recipe.vineppo_task_runner()  # the installed verl's task runner, as main() builds it
    module = recipe._task_runner_module()
    assert isinstance(installed, ActorClass)
    assert issubclass(
        installed.__ray_actor_class__, getattr(module.TaskRunner, "__ray_actor_class__", module.TaskRunner)
    )
    assert "run" in vars(installed.__ray_actor_class__)
    # Ray ships the class by value to the process that runs the actor: it must pickle.
    ray.cloudpickle.dumps(installed.__ray_actor_class__)

    # Both layouts, with stand-in modules: run() (what the actor executes) swaps the trainer class in first.
    def layout(actor: bool) -> types.SimpleNamespace:
        module = types.SimpleNamespace(RayPPOTrainer=None, built=[])

        class TaskRunner:
            def run(self, config):
                module.built.append(module.RayPPOTrainer)
                return config

        module.TaskRunner = ray.remote(TaskRunner) if actor else TaskRunner
        return module

    for actor in (False, True):  # verl 0.8: a plain TaskRunner; verl 0.9: @ray.remote
        fake = layout(actor)
        runner = recipe.vineppo_task_runner(fake)
        assert isinstance(runner, ActorClass) and callable(runner.options)
        assert runner.__ray_actor_class__().run("config") == "config"
        assert fake.built == [recipe.VinePPORayTrainer]


# -- the sampler ----------------------------------------------------------------------------------------------------


def test_sampler_packs_verl_layout_and_unpacks(char_tokenizer):
    tok = char_tokenizer
    engine = ScriptedEngine(lambda prefix, rng: tok.encode("#### " + rng.choice("57")) + [tok.eos_token_id])
    sampler = mcverl.VerlRolloutSampler(
        engine, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, temperature=0.6, size_divisor=4
    )
    assert isinstance(sampler, Sampler)
    requests = [
        RolloutRequest(tuple(tok.encode("Q: 1+4?\n")), n=3, max_tokens=16),
        RolloutRequest(tuple(tok.encode("Q:\n")), n=2, max_tokens=4),  # cut: "####" without the answer
    ]
    data = sampler.pack([r.prefix_ids for r in requests], [16, 4])
    assert (
        data.batch["input_ids"].shape == (2, 8) and data.batch["input_ids"][1, :5].eq(tok.pad_token_id).all()
    )
    assert data.batch["position_ids"][1].tolist() == [0, 0, 0, 0, 0, 0, 1, 2]
    assert data.meta_info["response_length"] == 16 and data.meta_info["temperature"] == 0.6
    assert data.non_tensor_batch["raw_prompt_ids"][0] == list(requests[0].prefix_ids)

    out = sampler.sample(requests)
    assert engine.calls == 1 and [len(c) for c in out] == [3, 2]
    for c in out[0]:
        assert tok.decode(c.token_ids[:-1]) in ("#### 5", "#### 7") and c.token_ids[-1] == tok.eos_token_id
        assert not c.truncated
    for c in out[1]:
        assert tok.decode(c.token_ids) == "####" and c.truncated


def test_sampler_with_transformers_worker_group(tiny_model_dir):
    """The stand-in worker group generates with transformers, verl's padding code builds its output."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    group = HFRolloutWorkerGroup(model)
    sampler = mcverl.VerlRolloutSampler(
        group,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        temperature=1.0,
        max_batch_size=4,
        size_divisor=2,
    )
    requests = [
        RolloutRequest(tuple(tok.encode("Q: 12+3?\nA: ")), n=3, max_tokens=12),
        RolloutRequest(tuple(tok.encode("Q: 7?\n")), n=2, max_tokens=5),
    ]
    out = sampler.sample(requests)
    assert len(group.batches) == 2 == sampler.calls  # 5 sequences in chunks of 4
    assert [len(group.batches[0]), len(group.batches[1])] == [4, 2]  # 1 row padded to the divisor 2
    assert [len(c) for c in out] == [3, 2]
    for request, conts in zip(requests, out, strict=True):
        for c in conts:
            assert 1 <= len(c.token_ids) <= request.max_tokens
            assert tok.pad_token_id not in c.token_ids[:-1]
            ends = c.token_ids[-1] == tok.eos_token_id
            assert c.truncated == (not ends and len(c.token_ids) == request.max_tokens)
            assert tok.eos_token_id not in c.token_ids[:-1]
    # Left-padded rows with verl's position ids reach generate; a row's samples are sampled independently.
    first = group.batches[0]
    assert first.batch["attention_mask"][2, : first.batch["input_ids"].shape[1] - 11].eq(1).all()
    assert len({c.token_ids for c in out[0]}) > 1


# -- the sampler inside verl's agent loop ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_loop():
    """verl's real ``verl.experimental.agent_loop.agent_loop`` module, with the recipe's prefix loop registered.
    Where hydra cannot be imported, it is imported with :func:`_verl_standins.hydra_standin` as ``hydra``; the module is dropped
    from ``sys.modules`` afterwards, so nothing else sees it bound to the stand-in."""
    names = ("hydra", "hydra.utils")
    saved = {name: sys.modules.get(name) for name in names}
    if importlib.util.find_spec("hydra") is None:
        standin = hydra_standin()
        sys.modules.update({"hydra": standin, "hydra.utils": standin.utils})
    sys.path.insert(0, str(ROOT / "examples/verl"))
    before = set(sys.modules)
    try:
        module = importlib.import_module("verl.experimental.agent_loop.agent_loop")
        importlib.import_module("prefix_agent_loop")
        yield module
    finally:
        sys.path.remove(str(ROOT / "examples/verl"))
        for name in set(sys.modules) - before:
            if name.startswith(("verl.experimental.agent_loop", "prefix_agent_loop")):
                del sys.modules[name]
        for name, saved_module in saved.items():
            if saved_module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = saved_module


class _ScriptedServer:
    """verl's LLM-server client as the agent loop calls it (``await generate(request_id=, prompt_ids=,
    sampling_params=)`` -> an output with ``token_ids``), answering as :func:`_engine` and honouring
    ``max_tokens`` as vLLM does."""

    def __init__(self, tok) -> None:
        self.engine = _engine(tok)
        self.sampling_params: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.sampling_params.append(dict(sampling_params))
        ids = self.engine.continuation(prompt_ids, int(sampling_params.get("max_tokens", 10**6)))
        return SimpleNamespace(token_ids=ids, log_probs=None, routed_experts=None, num_preempted=None)


class _RewardLoopHandle:
    """A reward-loop worker handle (``await handle.compute_score.remote(data)``) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.compute_score = SimpleNamespace(remote=self._score)

    async def _score(self, data):
        self.calls += 1
        return {"reward_score": 1.0, "reward_extra_info": {}}


def _agent_loop_worker(agent_loop, config, tok, server, reward_handles):
    """verl's ``AgentLoopWorker`` with the attributes its ``__init__`` would set from a model directory and hydra
    configs (which need hydra proper): the rollout config, the server client, the tokenizer, no processor, no
    tools, no distillation."""
    worker = object.__new__(agent_loop.AgentLoopWorker)
    worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
    worker.llm_client, worker.teacher_client, worker.reward_loop_worker_handles = server, None, reward_handles
    worker.tokenizer, worker.processor, worker.hf_model_type = tok, None, None
    worker.dataset_cls, worker.tools, worker.mm_processor_kwargs = None, [], {}
    worker.distillation_enabled = False
    return worker


def test_sampler_through_verl_agent_loop_manager(agent_loop, char_tokenizer, monkeypatch):
    """The recipe's rollout path on CPU: ``VerlRolloutSampler`` -> verl's ``AgentLoopManager.generate_sequences``
    (split over 2 agent-loop workers) -> verl's ``AgentLoopWorker`` (real code) -> the recipe's prefix loop,
    registered from config/agent_loops.yaml -> a scripted LLM server. Before the sampler packed ``raw_prompt``,
    verl's ``_agent_loop_postprocess`` raised ``KeyError: 'raw_prompt'``; verl's reward loop is never asked to
    grade a Monte Carlo continuation."""
    from omegaconf import OmegaConf

    tok = char_tokenizer
    for entry in OmegaConf.load(
        ROOT / "examples/verl/config/agent_loops.yaml"
    ):  # as AgentLoopWorker.__init__
        monkeypatch.setitem(agent_loop._agent_loop_registry, entry.name, entry)
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 48,
                    "response_length": 16,
                    "temperature": 0.6,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": False,
                    "agent": {"num_workers": 2, "default_agent_loop": "single_turn_agent"},
                }
            },
            "data": {},
        }
    )
    server, reward_loop = _ScriptedServer(tok), _RewardLoopHandle()
    manager = object.__new__(agent_loop.AgentLoopManager)
    manager.agent_loop_workers = [  # Ray actor handles: worker.generate_sequences.remote(chunk) is awaited
        SimpleNamespace(
            generate_sequences=SimpleNamespace(
                remote=_agent_loop_worker(agent_loop, config, tok, server, [reward_loop]).generate_sequences
            )
        )
        for _ in range(config.actor_rollout_ref.rollout.agent.num_workers)
    ]
    sampler = mcverl.VerlRolloutSampler(
        manager,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        temperature=0.6,
        size_divisor=config.actor_rollout_ref.rollout.agent.num_workers,  # as the recipe sets it
        agent_name="mcadvantage_prefix",
    )
    requests = [
        RolloutRequest(tuple(tok.encode("Start at 2. Add 3.\n2+3=5\n")), n=2, max_tokens=16),
        RolloutRequest(tuple(tok.encode("Start at 4. Add 1.\n")), n=1, max_tokens=4),  # cut: "####"
    ]
    out = sampler.sample(requests)
    assert [len(c) for c in out] == [2, 1] and sampler.calls == 1
    for c in out[0]:
        assert tok.decode(c.token_ids[:-1]) in ("#### 5", "#### 7") and c.token_ids[-1] == tok.eos_token_id
        assert not c.truncated
    assert tok.decode(out[1][0].token_ids) == "####" and out[1][0].truncated
    # 3 rows padded to 4 (the divisor), each generated with its own budget and the rollout's temperature.
    assert sorted(p["max_tokens"] for p in server.sampling_params) == [4, 16, 16, 16]
    assert {p["temperature"] for p in server.sampling_params} == {0.6}
    assert reward_loop.calls == 0  # the prefix loop's outputs carry a score, so verl's reward loop is skipped

    # What that relies on: verl sends an output without a score to its reward loop.
    output = agent_loop.AgentLoopOutput(
        prompt_ids=[5, 6], response_ids=[7], response_mask=[1], num_turns=2, metrics={}
    )
    worker = _agent_loop_worker(agent_loop, config, tok, server, [reward_loop])
    asyncio.run(worker._compute_score([output], kwargs={"raw_prompt": []}))
    assert reward_loop.calls == 1 and output.reward_score == 1.0


def test_verl_agent_loop_interfaces_we_rely_on(agent_loop):
    """What the prefix loop and the sampler use of verl's agent loop."""
    from verl.workers.config import AgentLoopConfig

    assert agent_loop._agent_loop_registry["mcadvantage_prefix"] == {
        "_target_": "prefix_agent_loop.PrefixAgentLoop"
    }
    assert set(agent_loop.AgentLoopOutput.model_fields) >= {
        "prompt_ids",
        "response_ids",
        "response_mask",
        "reward_score",
        "num_turns",
        "metrics",
        "extra_fields",
    }
    assert list(inspect.signature(agent_loop.AgentLoopBase.run).parameters)[:2] == ["self", "sampling_params"]
    base_init = inspect.getsource(agent_loop.AgentLoopBase.__init__)
    assert "self.server_manager = server_manager" in base_init and "self.rollout_config =" in base_init
    worker = agent_loop.AgentLoopWorker
    assert 'kwargs["raw_prompt"]' in inspect.getsource(worker._agent_loop_postprocess)
    assert "reward_score is None" in inspect.getsource(worker._compute_score)
    assert "agent_loop_config_path" in inspect.getsource(worker.__init__)
    assert ".chunk(len(self.agent_loop_workers))" in inspect.getsource(
        agent_loop.AgentLoopManager.generate_sequences
    )
    assert {"num_workers", "agent_loop_config_path"} <= set(AgentLoopConfig.__dataclass_fields__)


# -- the advantages -------------------------------------------------------------------------------------------------


def _engine(tok):
    """Answers right with probability 0.9 after a correct first line "2+3=5\n", else 0.2."""

    def answer(prefix, rng):
        p = 0.9 if tok.decode(list(prefix)).endswith("2+3=5\n") else 0.2
        return tok.encode("#### 5" if rng.random() < p else "#### 7") + [tok.eos_token_id]

    return ScriptedEngine(answer)


@pytest.mark.parametrize("whiten", [True, False])
def test_advantages_equal_mc_value_estimator_token_for_token(char_tokenizer, whiten):
    tok = char_tokenizer
    width = 24
    data = verl_training_batch(tok, PROMPTS, RESPONSES, SCORES, golds=GOLDS, response_length=width)
    score = mcverl.verl_reward_function()  # verl's default_compute_score (openai/gsm8k)

    engine = _engine(tok)
    sampler = mcverl.VerlRolloutSampler(engine, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    metrics = mcverl.compute_vineppo_advantage(
        data,
        sampler=sampler,
        reward_funcs=score,
        tokenizer=tok,
        estimator=VinePPOEstimator(num_rollouts=6),
        segmenter="gsm8k",
        whiten=whiten,
    )
    assert engine.calls == 1  # every state of the batch in one generate_sequences call
    assert metrics["mc/rollouts"] > 0 and metrics["mc/rollouts"] % 6 == 0
    assert set(metrics) >= {"mc/mean_value", "mc/states", "mc/dedup_ratio", "mc/seconds"}

    # The reference: MCValueEstimator on trajectories built by hand, through a plain Sampler on the same engine.
    reference_engine = _engine(tok)
    estimator = MCValueEstimator(reference_engine, score, tok, num_rollouts=6, max_completion_length=width)
    trajectories = []
    for prompt, response, reward, gold in zip(PROMPTS, RESPONSES, SCORES, GOLDS, strict=True):
        ids = tok.encode(response) + [tok.eos_token_id]
        trajectories.append(
            Trajectory(
                prompt_ids=tok.encode(prompt),
                completion_ids=ids,
                step_boundaries=segment_completion("gsm8k", tok, ids),
                reward=reward,
                prompt=prompt,
                fields={"data_source": "openai/gsm8k", "reward_model": {"ground_truth": gold}},
            )
        )
    estimate = estimator.estimate(trajectories)
    mask = data.batch["response_mask"].bool()
    expected = torch.zeros(mask.shape)
    for i, token_advs in enumerate(estimate.token_advantages):
        expected[i, : len(token_advs)] = token_advs
    if whiten:
        expected = masked_whiten(expected, mask)
    assert torch.equal(data.batch["advantages"], expected)  # token for token
    assert torch.equal(data.batch["returns"], expected)
    assert data.batch["advantages"].dtype == torch.float32 and data.batch["advantages"][~mask].eq(0).all()
    v0, v1, reward = estimate.values[0]
    assert v1 > v0 and reward == 1.0  # the correct first line raised the value


def test_verl_path_equals_vineppo_trainer_path(tiny_model_dir, tmp_path):
    """``VinePPOTrainer.compute_advantages``, the trainer's own method on a tiny trainer, gives the verl path's
    advantages on the same responses, token for token (both end in ``finalize_advantages``)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from mcadvantage import AdvantageBatch, VinePPOConfig, VinePPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    width = 24
    score = mcverl.verl_reward_function()
    rows = [{"data_source": "openai/gsm8k", "reward_model": {"ground_truth": g}} for g in GOLDS]
    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=score,
        args=VinePPOConfig(
            output_dir=str(tmp_path),
            report_to="none",
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=width,
            num_mc_rollouts=5,
            step_segmenter="gsm8k",
            save_strategy="no",
        ),
        train_dataset=Dataset.from_list([{"prompt": p, **row} for p, row in zip(PROMPTS, rows, strict=True)]),
        processing_class=tok,
        mc_sampler=_engine(tok),  # the Monte Carlo rollouts come from the scripted policy on both paths
    )
    assert trainer.args.whiten_advantages  # VinePPO's default, as verl's whiten=True

    data = verl_training_batch(tok, PROMPTS, RESPONSES, SCORES, golds=GOLDS, response_length=width)
    sampler = mcverl.VerlRolloutSampler(
        _engine(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    mcverl.compute_vineppo_advantage(
        data,
        sampler=sampler,
        reward_funcs=[score],
        tokenizer=tok,
        estimator=VinePPOEstimator.from_config(trainer.args),  # the trainer's settings
        segmenter="gsm8k",
    )

    # The same responses as trl_compat hands them to the trainer: unpadded ids (EOS kept), a right-padded mask.
    completions = [tok.encode(r) + [tok.eos_token_id] for r in RESPONSES]
    mask = torch.zeros((len(RESPONSES), width), dtype=torch.long)
    for i, ids in enumerate(completions):
        mask[i, : len(ids)] = 1
    batch = AdvantageBatch(
        prompt_ids=[tok.encode(p) for p in PROMPTS],
        completion_ids=completions,
        completion_mask=mask,
        rewards_per_func=torch.tensor(SCORES).unsqueeze(1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, 3),
        group_size=1,
        prompts=PROMPTS,
        rows=rows,
    )
    trl_path = trainer.compute_advantages(batch)
    assert trl_path.abs().sum() > 0 and trainer.last_advantage_result.values is not None
    assert torch.equal(data.batch["advantages"], trl_path)


def test_multi_turn_batches_are_refused(char_tokenizer):
    tok = char_tokenizer
    data = verl_training_batch(
        tok, PROMPTS[:1], RESPONSES[:1], SCORES[:1], golds=GOLDS[:1], response_length=24
    )
    data.batch["response_mask"][0, 2] = 0  # a tool-output token inside the response
    with pytest.raises(NotImplementedError, match="multi-turn"):
        mcverl.advantage_batch_from_verl(data, tok)


def test_reward_function_adapter_reads_verl_columns():
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return {"score": float(solution_str.endswith(ground_truth)), "acc": 1}

    reward = mcverl.verl_reward_function(compute_score)
    out = reward(
        prompts=["p", "p"],
        completions=["#### 5", "#### 7"],
        data_source=["d", "d"],
        reward_model=[{"ground_truth": "5"}, {"ground_truth": "5"}],
        extra_info=[{"i": 0}, {"i": 1}],
        uid=["a", "b"],
    )
    assert out == [1.0, 0.0] and calls[1] == ("d", "#### 7", "5", {"i": 1})
