"""mcadvantage's advantages in verl's default trainer, V1 (``trainer.use_v1=true``, verl 0.9's default).

verl's V1 trainers (``verl.trainer.ppo.v1``: ``PPOTrainerSync`` and the asynchronous ones) keep a training batch in
TransferQueue, one row per agent-loop output keyed ``{uid}_{session}_{index}``, and compute advantages in
``PPOTrainer._compute_advantage(batch: KVBatchMeta, metrics)``: it reads the rows, runs
``compute_advantage_for_multi_trajectories`` and puts ``advantages`` / ``returns`` back as nested (one tensor per
row) fields. This module replaces that last value with an mcadvantage estimator's:

- :class:`MCAdvantageV1Mixin`: a trainer mixin whose ``_compute_advantage`` runs verl's own (which also writes the
  KL-penalised ``token_level_rewards`` and the rollout-correction weights where configured) and then overwrites
  ``advantages`` and ``returns`` with the estimator's; :func:`register_mc_trainer` puts it on the trainer verl's
  registry holds for a mode (``trainer.v1.trainer_mode=sync``, verl's default).
- :func:`read_sessions`: the rows of a batch grouped into sessions (an episode of a multi-turn agent loop may be
  several rows, one per output), each session's reward the final row's score as verl's GRPO takes it, and the
  state keys an agent loop gives in ``extra_fields["turn_keys"]`` (one per model turn of the row).
- :func:`advantage_batch_from_sessions` / :func:`compute_v1_advantages`: the sessions as one
  :class:`~mcadvantage.estimators.batch.AdvantageBatch` (each session one episode: its rows' responses in order,
  later rows' prompts as the observations between turns, ``tool_mask`` 0 on them and on tool tokens), any estimator
  on it, and the per-token advantages scattered back to the rows.
- :class:`VerlServerSampler`: the :class:`~mcadvantage.samplers.base.Sampler` protocol over verl's LLM-server client
  (``PPOTrainer.get_llm_client()``, the client V1's agent-loop manager generates with), for ``"vineppo"``'s
  continuations.

``"anchor"`` (turn credit from recurring states, nothing sampled) works with every trainer mode; ``"vineppo"``
wakes the rollout replicas with the current weights for its continuations, which the ``sync`` mode allows (the
asynchronous modes keep the replicas generating the next batch). See ``docs/howto/verl.md``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import torch

try:
    import transfer_queue as tq
    from tensordict import TensorDict
except ImportError as err:  # pragma: no cover - exercised only without verl's V1 requirements
    raise ImportError(
        "mcadvantage.integrations.verl_v1 needs verl's V1 trainer requirements: TransferQueue and tensordict>=0.10 "
        "(pip install 'verl[verl-core]', or next to pinned packages see install_verl_cpu in scripts/_setup_venv.sh)."
    ) from err

import verl
from packaging.version import Version

from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.core.versions import check_version_range
from mcadvantage.estimators.anchor import ROLLOUT_KEYS_FIELD
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.batch import AdvantageBatch, EstimatorContext, finalize_advantages
from mcadvantage.estimators.registry import get_advantage_estimator
from mcadvantage.integrations.verl import continuation_from_ids, verl_reward_function
from mcadvantage.samplers.base import Continuation, RolloutRequest

__all__ = [
    "SUPPORTED_VERL_V1",
    "check_verl_v1_version",
    "CONFIG_SECTION",
    "REWARD_COLUMNS",
    "MCAdvantageV1Mixin",
    "RowLayout",
    "Session",
    "VerlServerSampler",
    "advantage_batch_from_sessions",
    "compute_v1_advantages",
    "estimator_from_config",
    "read_sessions",
    "register_mc_trainer",
    "write_v1_advantages",
]

#: The verl releases with the V1 trainer this module is tested with (0.8 has no V1 trainer).
SUPPORTED_VERL_V1 = ">=0.9,<0.10"


def check_verl_v1_version(version: str | None = None) -> None:
    """Check the installed (or given) verl version against :data:`SUPPORTED_VERL_V1`.

    Raises:
        ImportError: for a verl outside the range, naming the fix.
    """
    check_version_range(
        version if version is not None else verl.__version__,
        Version("0.9"),
        Version("0.10"),
        lambda v: (
            f"mcadvantage.integrations.verl_v1 supports verl {SUPPORTED_VERL_V1} (its V1 trainer) but verl {v} is "
            "installed. Run: pip install 'verl>=0.9,<0.10', or use mcadvantage.integrations.verl with the legacy "
            "RayPPOTrainer."
        ),
    )


check_verl_v1_version()

#: The verl config section the mixin reads (``mcadvantage.advantage_estimator``, ``estimator_kwargs``, ``whiten``).
CONFIG_SECTION = "mcadvantage"
#: Dataset columns handed to the reward functions of a sampling estimator (verl's ``compute_score`` reads them).
REWARD_COLUMNS = ("data_source", "reward_model", "extra_info")
_ROW_FIELDS = ("prompts", "responses", "response_mask", "rm_scores", "extra_fields")


@dataclass
class Session:
    """One episode of a V1 batch: the rows ``{uid}_{session}_{index}`` of one ``(uid, session)``, by ``index``.

    Attributes:
        uid: the prompt's id (its group).
        rows: positions of the session's rows in the batch, in output order.
        prompt_ids: per row, the prompt tokens.
        response_ids: per row, the response tokens (model and tool tokens).
        response_mask: per row, 1 on model tokens, 0 on tool tokens (verl's ``response_mask``).
        reward: the final row's score (the sum of its ``rm_scores``), as verl's GRPO takes a session's reward.
        turn_keys: the state key before each model turn, from the rows' ``extra_fields["turn_keys"]`` (None when an
            agent loop gives none).
        columns: the first row's dataset columns (``REWARD_COLUMNS`` that the rows have).
    """

    uid: str
    rows: list[int] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    response_mask: list[list[int]] = field(default_factory=list)
    reward: float = math.nan
    turn_keys: list[Hashable] | None = None
    columns: dict[str, Any] = field(default_factory=dict)


def _split_key(key: str) -> tuple[str, int, int]:
    """``{uid}_{session}_{index}`` -> ``(uid, session, index)`` (a uid may itself hold underscores)."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        raise ValueError(
            f"verl V1 row key {key!r} is not '{{uid}}_{{session}}_{{index}}': mcadvantage reads batches that V1's "
            "agent-loop workers (AgentLoopWorkerTQ) put into TransferQueue; a custom manager must use their keys."
        )
    return parts[0], int(parts[1]), int(parts[2])


def _hashable(key: Any) -> Any:
    """A state key as stored: lists (what a tuple becomes on its way through TransferQueue) back to tuples."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _rows(values: Any) -> list[Any]:
    """A TransferQueue field as one value per row: a nested (jagged) or dense tensor's rows as lists, a non-tensor
    column's items."""
    if isinstance(values, torch.Tensor):
        return [row.tolist() for row in values.unbind(0)]
    return list(values.tolist() if hasattr(values, "tolist") else values)


def read_sessions(
    keys: Sequence[str], data: TensorDict, columns: Sequence[str] = (), skip: Sequence[bool] | None = None
) -> list[Session]:
    """Group the rows of a V1 batch (``data``: what ``tq.kv_batch_get`` returns for ``keys``) into sessions.

    Sessions come in the order their uid first appears, a uid's sessions by session id. ``columns`` (non-tensor
    dataset columns present in ``data``) go to :attr:`Session.columns`. Rows with ``skip`` True (verl's synthetic
    padding rows, tagged ``is_padding``) belong to no session.

    Raises:
        ValueError: a key not in V1's layout, or state keys for some rows and not others.
    """
    fields = {name: _rows(data[name]) for name in _ROW_FIELDS if name in data.keys()}
    extras = fields.get("extra_fields", [{}] * len(keys))
    cols = {name: _rows(data[name]) for name in columns if name in data.keys()}
    kept = [r for r in range(len(keys)) if not (skip is not None and skip[r])]
    parsed = {r: _split_key(keys[r]) for r in kept}
    rank = {uid: i for i, uid in enumerate(dict.fromkeys(parsed[r][0] for r in kept))}
    order = sorted(kept, key=lambda r: (rank[parsed[r][0]], parsed[r][1], parsed[r][2]))
    sessions: dict[tuple[str, int], Session] = {}
    keyed = [(extras[r] or {}).get(ROLLOUT_KEYS_FIELD) is not None for r in kept]
    if any(keyed) and not all(keyed):
        raise ValueError(
            f"Some rows of the verl batch carry extra_fields[{ROLLOUT_KEYS_FIELD!r}] (state keys) and some do not: "
            "an agent loop that keys its turns must key every output (one key per model turn of the row)."
        )
    for r in order:
        uid, number, _ = parsed[r]
        s = sessions.setdefault((uid, number), Session(uid, columns={n: v[r] for n, v in cols.items()}))
        s.rows.append(r)
        s.prompt_ids.append([int(t) for t in fields["prompts"][r]])
        s.response_ids.append([int(t) for t in fields["responses"][r]])
        s.response_mask.append([int(m) for m in fields["response_mask"][r]])
        s.reward = float(sum(fields["rm_scores"][r]))  # the last row (highest index) wins
        row_keys = (extras[r] or {}).get(ROLLOUT_KEYS_FIELD)
        s.turn_keys = None if row_keys is None else (s.turn_keys or []) + [_hashable(k) for k in row_keys]
    return list(sessions.values())


@dataclass
class RowLayout:
    """Where each batch row's response sits in the :class:`AdvantageBatch` of
    :func:`advantage_batch_from_sessions`: ``spans[row] = (session, offset, length)``, the row's response being
    ``completion_ids[session][offset : offset + length]``."""

    spans: dict[int, tuple[int, int, int]] = field(default_factory=dict)


def advantage_batch_from_sessions(
    sessions: Sequence[Session], *, prompts: Sequence[Any] | None = None
) -> tuple[AdvantageBatch, RowLayout]:
    """The sessions as one :class:`AdvantageBatch` (one episode per session) and where each row landed.

    A session's completion is its first row's response, then for each later row its prompt (the conversation the
    model saw, as tool results: ``tool_mask`` 0) and its response; ``tool_mask`` is the rows' ``response_mask``
    there (0 on tool tokens). A uid's sessions are one group.

    Raises:
        ValueError: uids with different numbers of sessions (a group whose sessions failed: verl drops them).
    """
    sizes = {}
    for s in sessions:
        sizes[s.uid] = sizes.get(s.uid, 0) + 1
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"verl batch: the prompts have different numbers of sessions ({sorted(set(sizes.values()))}); group "
            "credit needs every uid's rollout.n sessions. Keep failed groups out of the batch (verl's replay buffer "
            "drops them) or train with rollout.n sessions per prompt."
        )
    layout, completions, masks = RowLayout(), [], []
    for i, s in enumerate(sessions):
        ids, mask = [], []
        for j, row in enumerate(s.rows):
            if j:
                ids += s.prompt_ids[j]
                mask += [0] * len(s.prompt_ids[j])
            layout.spans[row] = (i, len(ids), len(s.response_ids[j]))
            ids += s.response_ids[j]
            mask += s.response_mask[j]
        completions.append(ids)
        masks.append(mask)
    width = max((len(c) for c in completions), default=0)
    completion_mask = torch.zeros((len(sessions), width), dtype=torch.long)
    tool_mask = torch.zeros((len(sessions), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(zip(completions, masks, strict=True)):
        completion_mask[i, : len(ids)] = 1
        tool_mask[i, : len(ids)] = torch.tensor(mask, dtype=torch.long)
    keyed = all(s.turn_keys is not None for s in sessions) and bool(sessions)
    batch = AdvantageBatch(
        prompt_ids=[s.prompt_ids[0] for s in sessions],
        completion_ids=completions,
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor([[s.reward] for s in sessions], dtype=torch.float32),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(sessions)),
        group_size=next(iter(sizes.values()), 1),
        prompts=list(prompts) if prompts is not None else [],
        rows=[dict(s.columns) for s in sessions],
        tool_mask=None if bool(tool_mask.eq(completion_mask).all()) else tool_mask,
        turn_keys=[list(s.turn_keys) for s in sessions] if keyed else None,
    )
    return batch, layout


def compute_v1_advantages(
    keys: Sequence[str],
    data: TensorDict,
    *,
    estimator: AdvantageEstimator,
    context: EstimatorContext,
    whiten: bool | None = None,
    skip: Sequence[bool] | None = None,
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """Per row of a V1 batch, the estimator's per-token advantages (one 1-D tensor per row, the length of its
    response, 0 on tool tokens), and the estimator's metrics.

    Args:
        keys: the batch's row keys (``KVBatchMeta.keys``), in the order of ``data``'s rows.
        data: the rows' fields (``prompts``, ``responses``, ``response_mask``, ``rm_scores``, ``extra_fields`` and
            any of :data:`REWARD_COLUMNS`), as ``tq.kv_batch_get`` returns them.
        estimator: any mcadvantage estimator (``"anchor"``, ``"vineppo"``, ``"grpo"``, your own).
        context: what the estimator may sample through (:meth:`EstimatorContext.single_process`).
        whiten: token-weighted whitening over the batch (None: the estimator's ``whiten_by_default``), through
            :func:`~mcadvantage.estimators.batch.finalize_advantages`, the step ``VinePPOTrainer`` takes.
        skip: per row, True for rows to leave out (verl's padding rows): they get advantage 0.
    """
    sessions = read_sessions(keys, data, REWARD_COLUMNS, skip)
    if estimator.uses_rollouts and any(
        len(s.rows) > 1 or any(0 in m for m in s.response_mask) for s in sessions
    ):
        raise NotImplementedError(
            f"{type(estimator).__name__} continues responses from their steps, which on verl needs single-turn "
            "sessions (one row, no tool tokens): a tool call inside a session cannot be replayed from verl's rows. "
            "Use advantage_estimator='anchor' for turn credit on multi-turn agent loops."
        )
    batch, layout = advantage_batch_from_sessions(sessions)
    result = estimator.estimate(batch, context)
    advantages = finalize_advantages(
        result,
        loss_token_mask(batch.completion_mask, batch.tool_mask),
        whiten=estimator.whiten_by_default if whiten is None else whiten,
        estimator=type(estimator).__name__,
    )
    per_row = [torch.zeros(len(ids)) for ids in _rows(data["responses"])]
    for row, (i, offset, length) in layout.spans.items():
        per_row[row] = advantages[i, offset : offset + length].to(torch.float32).clone()
    metrics = {k: float(v) for k, v in result.metrics.items() if not math.isnan(v)}
    return per_row, metrics


def write_v1_advantages(keys: Sequence[str], partition_id: str, per_row: Sequence[torch.Tensor]) -> Any:
    """Put ``advantages`` and ``returns`` (equal, as verl's critic-free estimators write them) back to
    TransferQueue as nested fields, where verl's ``_compute_advantage`` puts them; returns TransferQueue's
    ``KVBatchMeta``."""
    nested = torch.nested.as_nested_tensor(list(per_row), layout=torch.jagged)
    fields = TensorDict(
        {"advantages": nested, "returns": torch.nested.as_nested_tensor(list(per_row), layout=torch.jagged)},
        batch_size=len(per_row),
    )
    return tq.kv_batch_put(keys=list(keys), partition_id=partition_id, fields=fields)


def estimator_from_config(section: Any) -> tuple[AdvantageEstimator, bool | None]:
    """The estimator a verl config's ``mcadvantage`` section names, and its ``whiten`` (None: the estimator's).

    ``advantage_estimator`` is a registered name; ``estimator_kwargs`` go to its constructor (e.g. ``vineppo``:
    ``num_rollouts``, ``step_segmenter``; ``anchor``: ``state_source``, ``weight``), whose defaults are the library's.
    """
    if section is None or "advantage_estimator" not in section:
        raise ValueError(
            f"The verl config has no {CONFIG_SECTION}.advantage_estimator: add a '{CONFIG_SECTION}' section "
            "(examples/verl/config/mc_trainer_v1.yaml) naming the estimator, e.g. advantage_estimator: vineppo."
        )
    kwargs = dict(section.get("estimator_kwargs", None) or {})
    estimator = get_advantage_estimator(str(section["advantage_estimator"]))(**kwargs)
    whiten = section.get("whiten", None)
    return estimator, None if whiten is None else bool(whiten)


def _run_sync(coroutine: Any) -> Any:
    """Run a coroutine from synchronous code (the trainer's driver); refuse inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise RuntimeError(
        "VerlServerSampler.sample was called inside a running event loop; call it from the trainer's synchronous "
        "driver code (PPOTrainer._compute_advantage is), or await VerlServerSampler.sample_async."
    )


class VerlServerSampler:
    """The :class:`~mcadvantage.samplers.base.Sampler` protocol over verl's LLM-server client.

    Args:
        client: ``PPOTrainer.get_llm_client()`` (verl's ``LLMServerClient``: ``await generate(request_id,
            prompt_ids=, sampling_params=)`` returning an output with ``token_ids``), or a stand-in.
        eos_token_id: EOS id, or several (a continuation ends at the first one).
        sampling_params: the rollout's sampling parameters (``temperature``, ``top_p``, ``top_k``): the Monte Carlo
            continuations must be sampled as the responses were. ``max_tokens`` is set per request.

    Every continuation of a call is one ``generate`` request, all in flight at once (verl's client balances them
    over the replicas). ``calls`` counts :meth:`sample` calls, ``requests`` the ``generate`` requests.
    """

    def __init__(
        self, client: Any, *, eos_token_id: int | Sequence[int], sampling_params: dict[str, Any]
    ) -> None:
        if not callable(getattr(client, "generate", None)):
            raise TypeError(
                f"{type(client).__name__} has no async generate(request_id, prompt_ids=, sampling_params=)."
            )
        if "max_tokens" in sampling_params:
            raise ValueError(
                "sampling_params['max_tokens'] is set per request from its budget; leave it out."
            )
        self.client = client
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.eos_token_ids = frozenset(int(e) for e in eos)
        self.sampling_params = dict(sampling_params)
        self.calls = 0
        self.requests = 0

    async def _one(self, prefix: Sequence[int], budget: int) -> Continuation:
        params = {**self.sampling_params, "max_tokens": int(budget)}
        output = await self.client.generate(uuid4().hex, prompt_ids=list(prefix), sampling_params=params)
        return continuation_from_ids(list(output.token_ids), budget, self.eos_token_ids)

    async def sample_async(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """:meth:`sample` as a coroutine."""
        jobs = [self._one(r.prefix_ids, r.max_tokens) for r in requests for _ in range(r.n)]
        self.calls += 1
        self.requests += len(jobs)
        done = iter(await asyncio.gather(*jobs))
        return [[next(done) for _ in range(r.n)] for r in requests]

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """Per request, ``request.n`` continuations of at most ``request.max_tokens`` tokens."""
        return _run_sync(self.sample_async(requests))


class MCAdvantageV1Mixin:
    """A V1 trainer mixin: verl's ``_compute_advantage``, then mcadvantage's advantages in its place.

    Put it before a V1 trainer class (``class T(MCAdvantageV1Mixin, PPOTrainerSync)``, which
    :func:`register_mc_trainer` does for a mode). It reads the config's ``mcadvantage`` section (:func:`estimator_from_config`)
    and, for a sampling estimator, wakes the rollout replicas with the current weights
    (``checkpoint_manager.update_weights``), samples through :class:`VerlServerSampler` on ``get_llm_client()``,
    and puts them back to sleep. Metrics go to ``metrics`` under the estimator's prefix (``mc/``, ``anchor/``).
    """

    reward_funcs: Sequence[Callable[..., Any]] | None = None  # None: verl's default_compute_score

    def _mc_context(self, estimator: AdvantageEstimator) -> EstimatorContext:
        """The estimator's context: a sampler on the rollout servers for a sampling estimator, none otherwise."""
        rollout = self.config.actor_rollout_ref.rollout
        sampler = None
        if estimator.uses_rollouts:
            params = {"temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": rollout.top_k}
            sampler = VerlServerSampler(
                self.get_llm_client(), eos_token_id=self.tokenizer.eos_token_id, sampling_params=params
            )
        funcs = list(self.reward_funcs) if self.reward_funcs is not None else [verl_reward_function()]
        return EstimatorContext.single_process(
            sampler, funcs, self.tokenizer, max_completion_length=int(self.config.data.max_response_length)
        )

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        """verl's advantages first (KL penalty, rollout correction), then the estimator's over them."""
        estimator, whiten = estimator_from_config(self.config.get(CONFIG_SECTION, None))
        if estimator.uses_rollouts and self.trainer_mode != "sync":
            raise ValueError(
                f"{type(estimator).__name__} samples continuations on the rollout replicas, which "
                f"trainer.v1.trainer_mode={self.trainer_mode!r} keeps generating the next batch: use "
                "trainer.v1.trainer_mode=sync, or an estimator that samples nothing (advantage_estimator=anchor)."
            )
        batch = super()._compute_advantage(batch, metrics)
        fields = [*_ROW_FIELDS, *REWARD_COLUMNS] if estimator.uses_rollouts else list(_ROW_FIELDS)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        context = self._mc_context(estimator)
        if estimator.uses_rollouts:
            self.checkpoint_manager.update_weights(self.global_steps)  # the weights that generated the batch
        try:
            per_row, mc_metrics = compute_v1_advantages(
                batch.keys,
                data,
                estimator=estimator,
                context=context,
                whiten=whiten,
                skip=[bool(tag.get("is_padding", False)) for tag in batch.tags],
            )
        finally:
            if estimator.uses_rollouts:
                self.checkpoint_manager.sleep_replicas()
        prefix = estimator.metric_prefix
        metrics.update({f"{prefix}/{name}": value for name, value in mc_metrics.items()})
        return write_v1_advantages(batch.keys, batch.partition_id, per_row)


def register_mc_trainer(mode: str = "sync") -> type:
    """Put :class:`MCAdvantageV1Mixin` on the V1 trainer registered for ``trainer.v1.trainer_mode=<mode>``
    (idempotent) and return the new class.

    The mode keeps verl's name because verl reads it beyond the registry (``"sync"`` picks the synchronous replay
    buffer), so the class registered for it is replaced in verl's ``TRAINER_REGISTRY`` (``register_trainer`` refuses
    a second class for a name). Call it in the process that builds the trainer: the recipe's task runner does.

    Args:
        mode: ``"sync"`` (``PPOTrainerSync``, every estimator), ``"colocate_async"`` or ``"separate_async"``
            (estimators that sample nothing, e.g. ``"anchor"``).
    """
    from verl.trainer.ppo.v1 import trainer_base

    base = trainer_base.get_trainer_cls(mode)
    if issubclass(base, MCAdvantageV1Mixin):
        return base
    cls = type(f"MCAdvantage{base.__name__}", (MCAdvantageV1Mixin, base), {"__module__": __name__})
    trainer_base.TRAINER_REGISTRY[mode] = cls
    return cls
