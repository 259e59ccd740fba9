"""VinePPO's Monte Carlo advantages on the estimator seam (arXiv 2410.01679, section 3).

Every local response is cut into reasoning steps aligned to its tokens; :class:`~mcadvantage.mc.estimator.
MCValueEstimator` samples ``num_mc_rollouts`` continuations from the state before each step with the current
policy (the context's sampler) and grades them with the reward functions; every token of step ``i`` gets
``V(S_i) - V(S_{i-1})`` (``V(S_n) = R``). With a vLLM server only the main process can sample: it gathers
every process' responses, estimates them all (identical states dedup across processes) and sends each
process its part.

Multi-turn episodes take the same pipeline. A batch with a ``tool_mask`` puts its states at the first token of every
model turn and at the segmenter's boundaries inside the turns (never in a tool result), and its tool-result tokens
get advantage 0 and no whitening weight. Its continuations come from a sampler that continues episodes: for GRPO's
tool loop (``tools=`` / ``environment_factory=``, ``context.episodes`` set) the policy's sampler wrapped in an
:class:`~mcadvantage.agents.episode_sampler.EpisodeSampler` (each continuation on its own rebuilt environment, through
the tool loop); for a ``rollout_func``, the user's ``continuation_func``. So every Monte Carlo setting, and the dedup
of identical states, applies to agents as to single-turn responses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcadvantage.agents.episode_sampler import EpisodeSampler, dropped_rounds
from mcadvantage.agents.rebuild import warn_dropped_tool_results
from mcadvantage.agents.tool_loop import AgentEpisodes
from mcadvantage.agents.turns import episode_step_boundaries
from mcadvantage.core.prompts import check_prompt_fits
from mcadvantage.core.settings import (
    MCSettings,
    mc_config_names,
    needed_completion_room,
    refuse_setting_assignment,
    setting_attribute,
)
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.batch import AdvantageBatch, AdvantageResult, EstimatorContext
from mcadvantage.estimators.registry import register_advantage_estimator
from mcadvantage.estimators.rules import (
    no_reward_scaling,
    sampled_continuations,
    summed_rewards,
    token_level_loss,
)
from mcadvantage.mc.estimator import MCEstimate, MCValueEstimator, Trajectory
from mcadvantage.mc.planning import estimated_boundaries
from mcadvantage.mc.stats import MCStats
from mcadvantage.tasks.segmentation import get_segmenter, segment_completion

__all__ = ["EpisodeCredit", "VinePPOEstimator", "check_turn_credit_support"]

# Dataset columns that GRPO itself consumes; every other column is passed to the reward functions.
_NON_REWARD_COLUMNS = ("prompt", "completion", "completion_ids")

#: The config fields the Monte Carlo estimators read: every Monte Carlo setting and the segmenter.
MONTE_CARLO_CONFIG_FIELDS = (*mc_config_names().values(), "step_segmenter")


@dataclass
class EpisodeCredit:
    """The latest estimate of one multi-turn episode, read per episode: ``boundaries`` (its estimated states and its
    end, after the step budget), ``values`` ``[V(S_0), ..., V(S_{m-1}), R]``, per-token ``advantages`` (tool
    results 0) and ``rollouts`` (the samples behind its state values)."""

    boundaries: list[int]
    values: list[float]
    advantages: list[float]
    rollouts: int = 0


def check_turn_credit_support(given: Sequence[str], estimator: str) -> None:
    """Refuse what Monte Carlo turn credit cannot do, for an estimator that gives it (``"vineppo"``, ``"hybrid"``):
    ``rollout_func=`` among the trainer arguments ``given`` (``NotImplementedError``: its episodes can be resumed from
    a prefix only by a ``continuation_func``, which the trainer then drops from ``given``). Every Monte Carlo
    setting works on agent episodes. ``estimator`` is the name the messages give (``advantage_estimator=...``)."""
    if "rollout_func" in given:
        raise NotImplementedError(
            f"advantage_estimator={estimator!r} needs continuation_func= next to rollout_func=: a Monte Carlo "
            "continuation resumes your rollout from a prefix of its completion, which only your code can do. Pass "
            "VinePPOTrainer(..., rollout_func=f, continuation_func=g), g(requests, trainer) returning the tokens "
            "after each request's prefix (mcadvantage.trainer.continuation; docs/howto/turn-credit-for-agents.md), "
            "or use advantage_estimator='grpo', 'rloo' or 'gae' (they train rollout_func episodes exactly as "
            "trl.GRPOTrainer does)."
        )


def run_on_main_process(
    context: EstimatorContext,
    work: Any,
    compute: Callable[[list[Any], Any], list[Any]],
    what: str,
) -> Any:
    """With a vLLM server only the main process reaches the engine: gather every process' ``work``, run
    ``compute(per_process_work, sampler)`` (one result per process, in rank order) on the main process, and return
    this process' result. Every process enters the sampler context, which may be collective (a weight sync gathers
    parameters); a failure on the main process reaches every process (``what`` names the work in the error)."""
    per_process = context.gather_object([work])
    payload: Any = None
    with context.policy_sampler() as sampler:
        if context.process_index == 0:
            try:
                payload = ("ok", compute(per_process, sampler))
            except Exception as err:  # the others wait in the broadcast: tell them, then fail everywhere
                context.broadcast_object(("error", f"{type(err).__name__}: {err}"))
                raise
    status, content = context.broadcast_object(payload)
    if status == "error":
        raise RuntimeError(f"{what} failed on the main process: {content}")
    return content[context.process_index]


@register_advantage_estimator("vineppo")
class VinePPOEstimator(AdvantageEstimator):
    """Monte Carlo step advantages (VinePPO).

    Args:
        settings: the Monte Carlo settings, whole (:class:`~mcadvantage.core.settings.MCSettings`: ``K``, the
            rollout budget, the step budget, free samples, allocation, ...); ``from_config`` builds them from the
            config's ``num_mc_rollouts`` and ``mc_*`` fields. Default: their defaults (K = 9, the paper's).
        step_segmenter: how responses are cut into steps (a name or a segmenter); the context's segmenter is
            used when None.
        **setting_values: single settings by name (``num_rollouts=4``, ``reuse_samples=True``, ...: every
            :class:`~mcadvantage.core.settings.MCSettings` field), applied over ``settings``.

    Attributes:
        last_turn_credit: for a batch of agent episodes (``context.episodes``), the :class:`EpisodeCredit` of each
            response in ``last_rows``; empty otherwise.
        settings: the :class:`~mcadvantage.core.settings.MCSettings` every batch is estimated with
            (``estimator.num_rollouts`` and the other setting names read them; replace them whole to change one).
        last_estimate: the local :class:`~mcadvantage.mc.estimator.MCEstimate` of the latest batch (estimated
            responses only, in batch order; see ``last_rows``).
        last_rows: local batch indices of the responses in ``last_estimate``. Responses left out (empty,
            unscorable by every reward function, or masked out) get advantage 0 and are left out of whitening.
    """

    whiten_by_default = True
    metric_prefix = "mc"
    uses_rollouts = True
    config_fields = MONTE_CARLO_CONFIG_FIELDS
    config_rules = (sampled_continuations, no_reward_scaling, summed_rewards, token_level_loss)

    def __init__(
        self, *, settings: MCSettings | None = None, step_segmenter: Any = None, **setting_values: Any
    ) -> None:
        self.settings = (settings if settings is not None else MCSettings()).replace(**setting_values)
        self.segmenter = None if step_segmenter is None else get_segmenter(step_segmenter)
        self.last_estimate: MCEstimate | None = None
        self.last_rows: list[int] = []
        self.last_turn_credit: list[EpisodeCredit] = []

    def __getattr__(self, name: str) -> Any:
        return setting_attribute(self, name)  # estimator.num_rollouts etc.: the settings' values

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_setting_assignment(self, name)  # a setting set on the estimator would be silently ignored
        object.__setattr__(self, name, value)

    @classmethod
    def from_config(cls, config: Any) -> VinePPOEstimator:
        """Build the estimator from a ``VinePPOConfig`` (or any object with the same fields)."""
        return cls(settings=MCSettings.from_config(config), step_segmenter=config.step_segmenter)

    @staticmethod
    def validate_config(config: Any) -> None:
        """Refuse invalid or contradictory Monte Carlo settings (with the config's field names)."""
        MCSettings.from_config(config)

    def check_agent_support(self, given: Sequence[str]) -> None:
        """Turn credit continues episodes of ``tools=`` and ``environment_factory=``; refuse ``rollout_func=`` alone
        (its episodes can be resumed from a prefix only by the user's ``continuation_func``: the trainer drops
        ``rollout_func`` from ``given`` when one is passed; :func:`check_turn_credit_support`)."""
        check_turn_credit_support(given, self.name or type(self).__name__)

    # -- the seam ---------------------------------------------------------------------------------------------

    def estimate(
        self,
        batch: AdvantageBatch,
        context: EstimatorContext,
        first_states: Sequence[int] | None = None,
    ) -> AdvantageResult:
        """Per-token advantages of the local responses (see :class:`~mcadvantage.estimators.base.AdvantageEstimator`).

        ``first_states`` (per local row, optional): estimate each response's states from this one on
        (:attr:`~mcadvantage.mc.estimator.Trajectory.first_state`: the earlier steps get advantage 0); a caller with a
        token budget (``"hybrid"``) passes it. None: every state."""
        agent = self._agent_episodes(batch, context)
        # A tool mask: multi-turn episodes, continued by an EpisodeSampler (agent) or by the user's continuation_func
        # (the sampler must say it continues episodes, checked in _run). States sit only at the model's tokens, and
        # the other tokens get no credit.
        env_mask = None if batch.tool_mask is None else batch.tool_mask.detach().cpu().bool()
        if env_mask is not None and agent is None and context.sample_on_main_only:
            raise NotImplementedError(
                "VinePPOEstimator: a batch with a tool_mask but no context.episodes (a rollout_func's env_mask) is "
                "continued on every process by its continuation_func; sample_on_main_only=True (a vLLM server "
                "sampler) cannot do that. Pass the continuation_func's sampler on every process."
            )
        trajectories, extras, rows = self._trajectories(batch, context, agent)
        if first_states is not None:
            for traj, i in zip(trajectories, rows, strict=True):
                traj.first_state = int(first_states[i])
        estimate = self._run(
            trajectories, extras, context, agent=agent, continues_episodes=env_mask is not None
        )
        self.last_estimate, self.last_rows = estimate, rows
        self.last_turn_credit = [] if agent is None else self._episode_credits(trajectories, estimate)

        mask = batch.completion_mask.detach().cpu()
        advantages = torch.zeros(mask.shape, dtype=torch.float32)
        token_mask = torch.zeros(mask.shape, dtype=torch.bool)
        for j, i in enumerate(rows):
            token_advs = estimate.token_advantages[j]
            advantages[i, : len(token_advs)] = token_advs
            token_mask[i] = mask[i].bool() if env_mask is None else mask[i].bool() & env_mask[i]
        advantages = advantages * token_mask  # padding and environment tokens: exactly 0
        metrics = self._summarize(estimate, advantages, token_mask)
        if agent is not None:  # the episodes' own dropped tool rounds, besides their continuations'
            own = dropped_rounds(agent.episodes)
            warn_dropped_tool_results(own)
            metrics["dropped_tool_results"] = metrics.get("dropped_tool_results", 0.0) + own
        device = batch.completion_mask.device
        return AdvantageResult(
            advantages=advantages.to(device),
            token_mask=token_mask.to(device),
            values=estimate.values,
            metrics=metrics,
            metric_reductions=MCStats.metric_reductions(),
        )

    @staticmethod
    def _agent_episodes(batch: AdvantageBatch, context: EstimatorContext) -> AgentEpisodes | None:
        """``context.episodes`` for a batch of GRPO's tool loop (checked against the batch), else None."""
        agent = context.episodes
        if agent is None or batch.tool_mask is None:
            return None
        if len(agent.episodes) != len(batch.completion_ids):
            raise ValueError(
                f"VinePPOEstimator: context.episodes holds {len(agent.episodes)} episodes for a batch of "
                f"{len(batch.completion_ids)} responses; build one episode per local batch row, in batch order."
            )
        if context.max_completion_length is None:
            raise ValueError(
                "VinePPOEstimator: context.max_completion_length is None; turn credit continues each episode within "
                "the episode's token budget. Pass max_completion_length to the EstimatorContext."
            )
        return agent

    def _trajectories(
        self, batch: AdvantageBatch, context: EstimatorContext, agent: AgentEpisodes | None
    ) -> tuple[list[Trajectory], list[Trajectory], list[int]]:
        """The responses to estimate (as :class:`Trajectory`, with their batch rows) and those that only lend their
        outcome to the pool of free samples."""
        segmenter = self.segmenter if self.segmenter is not None else get_segmenter(context.segmenter)
        rewards = batch.rewards.cpu()
        mask = batch.completion_mask.detach().cpu()
        room, room_name = needed_completion_room(
            context.max_completion_length, self.settings.rollout_budget, self.settings.fixed_rollout_budget
        )
        trajectories: list[Trajectory] = []
        extras: list[Trajectory] = []
        rows: list[int] = []
        for i, ids in enumerate(batch.completion_ids):
            reward = float(rewards[i])
            episode = None if agent is None else agent.episodes[i]
            if not ids or not math.isfinite(reward) or int(mask[i].sum()) == 0:
                # Nothing to credit: advantage 0, excluded from the whitening statistics. Its outcome is still a
                # free sample for the states it passes through (leaving masked or unscorable responses out would
                # select the pool by outcome); unscorable counts 0, as an unscorable rollout does. Variance allocation
                # pools the responses too, so it needs them as well.
                if ids and self.settings.pools_free_samples:
                    kept = reward if math.isfinite(reward) else 0.0
                    extras.append(self.response_trajectory(batch, i, None, context, kept, episode))
                continue
            # Iterable datasets are not checked before training. An agent episode is not: its continuations never
            # pass its budget, which the engine already took for the episode itself.
            if context.context_length is not None and agent is None:
                check_prompt_fits(
                    len(batch.prompt_ids[i]),
                    context.context_length,
                    room,
                    where=f"local batch row {i}",
                    room_name=room_name,
                )
            trajectories.append(self.response_trajectory(batch, i, segmenter, context, reward, episode))
            rows.append(i)
        return trajectories, extras, rows

    def _episode_credits(self, trajectories: list[Trajectory], estimate: MCEstimate) -> list[EpisodeCredit]:
        """The latest estimate per episode (:attr:`last_turn_credit`)."""
        return [
            EpisodeCredit(
                boundaries=estimated_boundaries(traj.step_boundaries, self.settings),
                values=list(values),
                advantages=[
                    float(a) if traj.tool_mask is None or traj.tool_mask[t] else 0.0
                    for t, a in enumerate(token_advs.tolist())
                ],
                rollouts=int(sum(counts)),
            )
            for traj, values, token_advs, counts in zip(
                trajectories,
                estimate.values,
                estimate.token_advantages,
                estimate.sample_counts,
                strict=True,
            )
        ]

    @staticmethod
    def response_trajectory(
        batch: AdvantageBatch,
        i: int,
        segmenter: Any,
        context: EstimatorContext,
        reward: float,
        episode: Any = None,
    ) -> Trajectory:
        """Row ``i`` as a :class:`Trajectory`; ``segmenter=None`` for a response that only lends its outcome to the
        pool (its steps are never estimated, so it is not segmented: one step)."""
        ids = list(batch.completion_ids[i])
        row = batch.rows[i] if batch.rows else {}
        mask = None if batch.tool_mask is None else [int(m) for m in batch.tool_mask[i, : len(ids)].tolist()]
        if segmenter is None:
            bounds = [0, len(ids)]
        elif mask is None:
            bounds = segment_completion(segmenter, context.tokenizer, ids)
        else:
            # Environment tokens (env_mask 0) never start a step: states sit at the first token of every model turn
            # and at the segmenter's boundaries inside the turns, as for GRPO's tool loop.
            def inside_turn(start: int, end: int) -> list[int]:
                turn = segment_completion(segmenter, context.tokenizer, ids[start:end])
                return [start + b for b in turn[1:-1]]

            # A completion may open with environment tokens (an observation before the model's first turn): the
            # prompt state stays b_0 = 0 and the first model token is the next state.
            lead = next((t for t, m in enumerate(mask) if m), len(mask))
            later = episode_step_boundaries(
                mask[lead:], lambda a, b: [x - lead for x in inside_turn(a + lead, b + lead)]
            )
            bounds = sorted({0, *(lead + b for b in later)})
        return Trajectory(
            prompt_ids=list(batch.prompt_ids[i]),
            completion_ids=ids,
            step_boundaries=bounds,
            reward=reward,
            prompt=batch.prompts[i] if batch.prompts else None,
            fields={k: v for k, v in row.items() if k not in _NON_REWARD_COLUMNS},
            tool_mask=mask,
            episode=episode,
        )

    # -- I/O around the pure estimator ------------------------------------------------------------------------

    def make_estimator(self, sampler: Any, context: EstimatorContext) -> MCValueEstimator:
        """The :class:`~mcadvantage.mc.estimator.MCValueEstimator` for one batch, around ``sampler``."""
        return MCValueEstimator(
            sampler,
            list(context.reward_funcs),
            context.tokenizer,
            settings=self.settings,
            reward_weights=list(context.reward_weights),
            max_completion_length=context.max_completion_length
            if self.settings.rollout_budget == "remaining"
            else None,
            context_length=context.context_length,
        )

    def _run(
        self,
        trajectories: list[Trajectory],
        extras: list[Trajectory],
        context: EstimatorContext,
        *,
        agent: AgentEpisodes | None = None,
        continues_episodes: bool = False,
    ) -> MCEstimate:
        """Estimate ``trajectories`` with the context's sampler (wrapped in an :class:`EpisodeSampler` for agent
        episodes), here or, with a vLLM server, on the main process for every process."""

        def episodes(sampler: Any) -> Any:
            return sampler if agent is None else EpisodeSampler(sampler, agent)

        if not context.sample_on_main_only:
            with context.policy_sampler() as engine:
                sampler = episodes(engine)
                if continues_episodes and not getattr(sampler, "continues_episodes", False):
                    raise ValueError(
                        "VinePPOEstimator: the batch has a tool_mask (multi-turn episodes) but context.episodes is "
                        "None, and the sampler continues plain text, so a continuation would resume an episode without "
                        "its tool calls and environment steps. VinePPOTrainer builds the episodes for tools= and "
                        "environment_factory=, and continues rollout_func= episodes with your continuation_func=; "
                        "elsewhere pass EstimatorContext(episodes=mcadvantage.agents.tool_loop.AgentEpisodes(...)) or a "
                        "sampler that continues episodes (mcadvantage.trainer.continuation.ContinuationSampler), or "
                        "use advantage_estimator='grpo'."
                    )
                return self.make_estimator(sampler, context).estimate(
                    trajectories, reward_kwargs=context.reward_kwargs, extra_responses=extras
                )
        # Only the main process reaches the engine (vLLM server): it estimates every process' trajectories.

        def estimate_all(per_process: list[Any], engine: Any) -> list[MCEstimate]:
            flat = [t for part, _ in per_process for t in part]
            full = self.make_estimator(episodes(engine), context).estimate(
                flat,
                reward_kwargs=context.reward_kwargs,
                extra_responses=[t for _, part in per_process for t in part],
            )
            parts, start = [], 0
            for rank, (part, _) in enumerate(per_process):
                stop = start + len(part)
                # The main process did all the work: its part carries the statistics, so sums over processes
                # count every rollout once.
                parts.append(
                    MCEstimate(
                        values=full.values[start:stop],
                        step_advantages=full.step_advantages[start:stop],
                        token_advantages=full.token_advantages[start:stop],
                        stats=full.stats if rank == 0 else None,
                        sample_counts=full.sample_counts[start:stop],
                    )
                )
                start = stop
            return parts

        return run_on_main_process(context, (trajectories, extras), estimate_all, "Monte Carlo estimation")

    @staticmethod
    def _summarize(
        estimate: MCEstimate, advantages: torch.Tensor, token_mask: torch.Tensor
    ) -> dict[str, float]:
        state_values = [v for values in estimate.values for v in values[:-1] if not math.isnan(v)]
        steps = sum(len(values) - 1 for values in estimate.values)
        tokens = float(token_mask.sum())
        metrics = {
            "mean_value": math.fsum(state_values) / len(state_values) if state_values else math.nan,
            "mean_abs_advantage": float((advantages.abs() * token_mask).sum()) / tokens
            if tokens
            else math.nan,
            "steps_per_response": steps / len(estimate.values) if estimate.values else math.nan,
        }
        # The typed record becomes metrics here, at the edge; None on the non-main processes in server mode (the
        # main process holds the counts).
        if estimate.stats is not None:
            metrics.update(estimate.stats.metrics())
        return metrics
