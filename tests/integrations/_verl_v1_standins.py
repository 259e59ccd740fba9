"""CPU stand-ins for the parts of verl's V1 trainer that need a Ray cluster or GPUs, for
tests/integrations/test_integration_verl_v1.py. Importing this module needs verl's V1 requirements (TransferQueue,
tensordict >= 0.10).

What is stood in, and why:

- TransferQueue's storage (:class:`InProcessTransferQueue`): real TransferQueue keeps the rows in Ray actors behind
  ZMQ sockets. The stand-in keeps them in a dict and answers ``kv_batch_get`` with verl's own
  ``list_of_dict_to_tensordict``, every per-token field nested (jagged) as verl's trainer expects it even when the
  rows happen to have one length; ``select_fields``
  that a row lacks are left out, as TransferQueue's ``BatchMeta.select_fields`` does.
- the replay buffer (:class:`ReplayBufferStandIn`): hands the trainer every row of the ``train`` partition, in the
  order they were put (verl's buffer waits for Ray agent-loop workers to report them finished).
- the actor worker group (:class:`ActorWorkerGroupStandIn`): the FSDP/Megatron workers on GPUs. ``update_actor``
  reads what a worker would read from TransferQueue (``advantages``, ``old_log_probs``, ``response_mask``) and
  records it.
- the checkpoint manager and the LLM-server client (:class:`CheckpointManagerStandIn`, :class:`ScriptedLLMClient`):
  the rollout replicas (vLLM/SGLang on GPUs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
import transfer_queue as tq
from tensordict import NonTensorData, TensorDict
from transfer_queue import KVBatchMeta
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

TQ_FUNCTIONS = ("kv_batch_put", "kv_batch_get", "async_kv_batch_put", "kv_clear")


def _plain(value: Any) -> Any:
    """One row's value as stored: a tensor, or the Python object inside ``NonTensorData``."""
    return value.data if isinstance(value, NonTensorData) else value


class InProcessTransferQueue:
    """TransferQueue's key-value interface on an in-process dict (see the module docstring)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.tags: dict[tuple[str, str], dict[str, Any]] = {}
        self.order: list[tuple[str, str]] = []

    def install(self, monkeypatch: Any) -> InProcessTransferQueue:
        """Replace ``transfer_queue``'s module functions (what ``import transfer_queue as tq`` callers use)."""
        for name in TQ_FUNCTIONS:
            monkeypatch.setattr(tq, name, getattr(self, name))
        return self

    def kv_batch_put(
        self,
        keys: Sequence[str],
        partition_id: str,
        fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
        **_: Any,
    ) -> KVBatchMeta:
        for i, key in enumerate(keys):
            slot = (partition_id, key)
            if slot not in self.rows:
                self.order.append(slot)
            row = self.rows.setdefault(slot, {})
            if fields is not None:
                item = fields[i]
                row.update({name: _plain(item.get(name)) for name in fields.keys()})
            if tags is not None:
                self.tags[slot] = {**self.tags.get(slot, {}), **tags[i]}
        names = sorted(set().union(*(self.rows[(partition_id, k)] for k in keys)))
        return KVBatchMeta(
            keys=list(keys),
            tags=[self.tags.get((partition_id, k), {}) for k in keys],
            partition_id=partition_id,
            fields=names,
        )

    async def async_kv_batch_put(self, keys, partition_id, fields=None, tags=None, **kwargs) -> KVBatchMeta:
        return self.kv_batch_put(keys, partition_id, fields=fields, tags=tags, **kwargs)

    def kv_batch_get(
        self, keys: Sequence[str] | str, partition_id: str, select_fields: Sequence[str] | str | None = None
    ) -> TensorDict:
        keys = [keys] if isinstance(keys, str) else list(keys)
        rows = [self.rows[(partition_id, k)] for k in keys]
        names = [select_fields] if isinstance(select_fields, str) else select_fields
        names = list(rows[0]) if names is None else [n for n in names if all(n in r for r in rows)]
        data = list_of_dict_to_tensordict([{n: r[n] for n in names} for r in rows])
        for (
            name
        ) in names:  # TransferQueue keeps every sample's tensor and returns a per-sample (jagged) field
            if (
                isinstance(rows[0][name], torch.Tensor)
                and rows[0][name].dim() == 1
                and not data[name].is_nested
            ):
                data[name] = torch.nested.as_nested_tensor([r[name] for r in rows], layout=torch.jagged)
        return data

    def kv_clear(self, keys: Sequence[str], partition_id: str) -> None:
        for key in keys:
            self.rows.pop((partition_id, key), None)

    def batch(self, partition_id: str = "train") -> KVBatchMeta:
        """Every row of a partition, in the order they were put."""
        keys = [k for p, k in self.order if p == partition_id and (p, k) in self.rows]
        return KVBatchMeta(
            keys=keys, tags=[self.tags.get((partition_id, k), {}) for k in keys], partition_id=partition_id
        )


class ReplayBufferStandIn:
    """``replay_buffer.sample(global_steps=, partition_id=, batch_size=)`` -> every row of the partition."""

    def __init__(self, store: InProcessTransferQueue) -> None:
        self.store = store

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        return self.store.batch(partition_id), {}


class ActorWorkerGroupStandIn:
    """The actor worker group's dispatch table (one data-parallel rank) and ``update_actor``, which records the
    fields a worker reads from TransferQueue."""

    def __init__(self, store: InProcessTransferQueue) -> None:
        self.store = store
        self._dispatch_info = {"actor": [0]}
        self.updates: list[dict[str, Any]] = []

    def update_actor(self, batch: KVBatchMeta) -> dict:
        data = self.store.kv_batch_get(
            batch.keys, batch.partition_id, ["advantages", "returns", "old_log_probs", "response_mask"]
        )
        self.updates.append(
            {
                "keys": list(batch.keys),
                "tags": list(batch.tags),
                **{name: [row.clone() for row in data[name].unbind(0)] for name in data.keys()},
            }
        )
        return {"metrics": {"mfu": [0.0], "pg_loss": [0.0]}}


class CheckpointManagerStandIn:
    """Records the weight syncs and sleeps the trainer asks of the rollout replicas."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def update_weights(self, global_steps: int | None = None) -> dict:
        self.calls.append(("update_weights", global_steps))
        return {}

    def sleep_replicas(self) -> None:
        self.calls.append(("sleep_replicas", None))


class ScriptedLLMClient:
    """verl's ``LLMServerClient.generate`` on a :class:`_verl_standins.ScriptedEngine`: the ``j``-th continuation
    of a prefix depends only on ``(prefix, j)``, honouring ``max_tokens`` as vLLM does."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.sampling_params: list[dict] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any):
        self.sampling_params.append(dict(sampling_params))
        await asyncio.sleep(0)
        ids = self.engine.continuation(prompt_ids, int(sampling_params["max_tokens"]))
        return SimpleNamespace(token_ids=ids, log_probs=None)


def agent_loop_worker(worker_cls: type, config: Any, tokenizer: Any) -> Any:
    """verl's ``AgentLoopWorkerTQ`` (the plain class behind the Ray actor) with the attributes its
    ``__init__`` sets from a model directory and Ray: no processor, no distillation, no reward workers (every
    output here carries its score)."""
    worker = object.__new__(getattr(worker_cls, "__ray_actor_class__", worker_cls))
    worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
    worker.tokenizer, worker.processor, worker.hf_model_type = tokenizer, None, None
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    worker.teacher_client, worker.mm_processor_kwargs = None, {}
    return worker


def v1_trainer(
    trainer_cls: type, config: Any, tokenizer: Any, store: InProcessTransferQueue, client: Any
) -> Any:
    """A V1 trainer (``trainer_cls``) with its GPU and Ray parts stood in: what ``PPOTrainer._setup`` would build
    from Ray worker groups and rollout replicas."""
    trainer = object.__new__(trainer_cls)
    trainer.config, trainer.tokenizer = config, tokenizer
    trainer.global_steps, trainer.local_trigger_step, trainer.curr_step_profile = 1, 0, False
    trainer.trainer_mode = config.trainer.v1.trainer_mode
    trainer.use_critic = trainer.use_reference_policy = trainer.ref_in_actor = False
    trainer.distillation_config = None
    trainer.replay_buffer = ReplayBufferStandIn(store)
    trainer.actor_rollout_wg = ActorWorkerGroupStandIn(store)
    trainer.checkpoint_manager = CheckpointManagerStandIn()
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[object()])  # scored in the loop
    trainer.llm_server_manager = SimpleNamespace(get_client=lambda client_cls=None, **_: client)
    return trainer


def put_session(worker: Any, outputs: Sequence[Any], *, uid: str, session_id: int, columns: dict) -> None:
    """One session's agent-loop outputs into TransferQueue through verl's own ``_agent_loop_postprocess``."""
    asyncio.run(
        worker._agent_loop_postprocess(
            list(outputs), False, uid=uid, session_id=session_id, global_steps=1, **columns
        )
    )


def response_tensor(ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.int64)
