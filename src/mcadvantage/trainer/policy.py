"""A sampler holding a trainer's current policy: the one way the trainer's Monte Carlo rollouts, the
evaluation and the examples sample from the policy being trained.

:func:`policy_sampler` picks the engine the trainer generates with (its colocated vLLM engine, its vLLM server,
or transformers ``generate`` on the policy itself), makes sure that engine holds the current weights, and yields
a :class:`~mcadvantage.samplers.Sampler` with the trainer's sampling settings (or the ones given).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mcadvantage.samplers.base import Sampler

__all__ = ["ENGINES", "draw_group_trees", "policy_sampler", "sampling_settings"]

#: Engines :func:`policy_sampler` accepts: the trainer's own ("auto"), or transformers even with vLLM.
ENGINES = ("auto", "vllm", "transformers")


def sampling_settings(trainer: Any) -> dict[str, Any]:
    """The training responses' sampling settings as sampler keyword arguments (reused for every rollout)."""
    return {
        "temperature": trainer.temperature,
        "top_p": trainer.top_p,
        "top_k": trainer.top_k if trainer.top_k else None,  # TRL encodes "no top-k" as 0; samplers use None
        "min_p": trainer.min_p,
        "repetition_penalty": trainer.repetition_penalty,
    }


@contextlib.contextmanager
def policy_sampler(
    trainer: Any,
    *,
    engine: str = "auto",
    seed: int | None = None,
    max_batch_sequences: int | None = None,
    **overrides: Any,
) -> Iterator[Sampler | None]:
    """Yield a sampler that draws from ``trainer``'s current policy.

    Collective: every process must enter it (weights may be gathered or pushed). With a vLLM server only the
    main process gets a sampler; the others get None.

    Args:
        trainer: a :class:`~mcadvantage.VinePPOTrainer`.
        engine: ``"auto"`` (the trainer's generation engine), ``"vllm"`` (requires ``use_vllm``) or
            ``"transformers"`` (``generate`` on the policy even when the trainer uses vLLM).
        seed: vLLM samplers: base seed of the per-request seeds (ignored by transformers: seed torch).
        max_batch_sequences: transformers: most sequences per ``generate`` call (default: the config's
            ``mc_max_batch_sequences``).
        **overrides: sampling settings replacing the trainer's (``temperature``, ``top_p``, ``top_k``,
            ``min_p``, ``repetition_penalty``), e.g. an evaluation temperature.
    """
    from mcadvantage.trainer.trl_compat import sync_weights_if_stale, vllm_awake

    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is invalid. Use one of {list(ENGINES)}.")
    if engine == "vllm" and not trainer.use_vllm:
        raise ValueError(
            "engine='vllm' needs a trainer with use_vllm=True. Use engine='auto' or 'transformers'."
        )
    unknown = set(overrides) - {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}
    if unknown:
        raise TypeError(f"policy_sampler() got unknown sampling settings {sorted(unknown)}.")
    settings = {**sampling_settings(trainer), **overrides}
    # TRL forwards generation_kwargs to the engine for the responses; the rollouts get them too.
    extra = dict(trainer.args.generation_kwargs or {})

    if trainer.use_vllm and engine != "transformers":
        from mcadvantage.samplers.vllm import VLLMSampler, VLLMServerSampler

        if trainer.vllm_mode == "colocate":
            with vllm_awake(trainer):  # sleep mode: re-push the weights and wake the KV cache
                sync_weights_if_stale(trainer)  # GRPO pushes weights only before it generates
                yield VLLMSampler(trainer.vllm_engine, generation_kwargs=extra, seed=seed, **settings)
            return
        sync_weights_if_stale(trainer)
        client = trainer.vllm_server_client if trainer.accelerator.is_main_process else None
        yield (
            None
            if client is None
            else VLLMServerSampler(client=client, generation_kwargs=extra, seed=seed, **settings)
        )
        return

    from mcadvantage.samplers.hf import TransformersSampler

    if trainer.args.cache_implementation is not None:
        extra.setdefault("cache_implementation", trainer.args.cache_implementation)
    batch = max_batch_sequences or getattr(trainer.args, "mc_max_batch_sequences", 256)
    was_training = trainer.model.training
    try:
        with trainer.generation_model() as model:
            sampler = TransformersSampler(
                model,
                trainer.processing_class,
                max_batch_sequences=batch,
                generation_kwargs=extra,
                **settings,
            )
            # Every EOS id the model declares ends a rollout, exactly as it ends a GRPO response.
            sampler.eos_token_ids = {int(e) for e in trainer.eos_token_ids}
            yield sampler
    finally:
        trainer.model.train(was_training)


def draw_group_trees(
    trainer: Any,
    prompt_ids: list[list[int]],
    num_generations: int,
    sampler_context: Any = None,
    *,
    main_only: bool = False,
) -> tuple[list[list[int]], list[Any]] | None:
    """Draw every group of a training batch as a tree when the trainer's estimator asks for it
    (``tree_schedule``; :mod:`mcadvantage.mc.tree`), on the trainer's engine.

    ``prompt_ids`` is the process' generation batch, each prompt repeated ``num_generations`` times in a row (TRL's
    layout). Returns the completions in the same layout and their tree paths (the tokens sampled and trained are
    logged as ``tree/generated_tokens`` and ``tree/leaf_tokens``), or None when the estimator draws no trees. Collective: every process calls it. ``sampler_context``
    (default :func:`policy_sampler`) yields the sampler; with ``main_only`` (a vLLM server, where only the main
    process holds one) the main process draws every process' trees and sends each its part.
    """
    from mcadvantage.estimators.base import DrawsTrees

    estimator = trainer.advantage_estimator
    if not isinstance(estimator, DrawsTrees):
        return None
    schedule = estimator.tree_schedule(trainer.max_completion_length)
    # Imported here: evaluation imports this module and must not pull in torch (tests/evaluation/test_pass_at_1.py).
    from accelerate.utils import broadcast_object_list, gather_object

    from mcadvantage.estimators.batch import reduce_metrics
    from mcadvantage.mc.tree import draw_trees

    if len(prompt_ids) % num_generations:
        raise ValueError(
            f"advantage_estimator='tree': this process generates {len(prompt_ids)} responses, not a multiple of "
            f"num_generations={num_generations}; a tree is drawn by one process."
        )
    groups = [list(prompt_ids[i]) for i in range(0, len(prompt_ids), num_generations)]
    for g, first in enumerate(groups):
        if any(list(ids) != first for ids in prompt_ids[g * num_generations : (g + 1) * num_generations]):
            raise ValueError(
                f"advantage_estimator='tree': rows {g * num_generations}-{(g + 1) * num_generations - 1} of the "
                "generation batch are not one prompt repeated; a tree needs each group on one process, and with "
                "environment_factory= an environment's reset must give the rows of one dataset row the same "
                "observation (make reset a function of the row)."
            )
    context = sampler_context if sampler_context is not None else policy_sampler(trainer)
    with context as sampler:
        if not main_only:
            trees = draw_trees(sampler, groups, schedule, trainer.max_completion_length)
        else:
            every = gather_object([groups])
            payload: list[Any] = [None]
            if trainer.accelerator.is_main_process:
                drawn = draw_trees(
                    sampler, [g for part in every for g in part], schedule, trainer.max_completion_length
                )
                parts, start = [], 0
                for part in every:
                    parts.append(drawn[start : start + len(part)])
                    start += len(part)
                payload = [parts]
            broadcast_object_list(payload, from_process=0)
            trees = payload[0][trainer.accelerator.process_index]
    completions = [c for tree in trees for c in tree.completions]
    stats = {
        "generated_tokens": float(sum(tree.generated_tokens for tree in trees)),
        "leaf_tokens": float(sum(len(c) for c in completions)),
    }
    totals = reduce_metrics(gather_object([stats]), {"generated_tokens": "sum", "leaf_tokens": "sum"})
    trainer.log_metric_values("train", {f"tree/{k}": v for k, v in totals.items()})
    return completions, [path for tree in trees for path in tree.paths]
