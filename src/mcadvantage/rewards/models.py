"""Reward models and async reward functions as synchronous TRL-style reward functions, so they can grade Monte
Carlo rollouts too.

``GRPOTrainer`` scores its responses with a reward model (a model id or an ``nn.Module`` in ``reward_funcs``) by
tokenising ``prompt + completion`` with the reward model's own tokenizer and reading the first logit. VinePPO
must score every rollout the same way, in batches and on the reward model's device: :class:`RewardModelScorer`
does exactly that, behind the reward-function signature the estimator calls. :func:`as_rollout_reward_func`
picks the wrapper a reward function needs (none for a plain function).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from mcadvantage.core.text import is_conversational

__all__ = ["RewardModelScorer", "as_rollout_reward_func", "synchronous_reward_funcs"]


class RewardModelScorer:
    """A sequence-classification reward model as a reward function ``f(prompts=, completions=, **kw)``.

    Texts are built as ``GRPOTrainer`` builds them: ``prompt + completion`` for plain text, or the reward
    tokenizer's chat template over ``prompt messages + completion messages`` for conversational data; they are
    tokenised with the reward model's tokenizer (right padding, no added special tokens) and scored in batches of
    ``batch_size`` on the model's device; the reward is ``logits[:, 0]``.

    Args:
        model: the reward model (``AutoModelForSequenceClassification`` with one label, or any module whose
            output has ``logits``).
        tokenizer: the reward model's tokenizer (``reward_processing_classes`` in TRL).
        batch_size: texts per forward pass (memory bound).
        chat_template_kwargs: extra arguments for the chat template (TRL's ``chat_template_kwargs``).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 64,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"RewardModelScorer: batch_size={batch_size!r} must be >= 1.")
        if tokenizer is None:
            raise ValueError(
                "RewardModelScorer: tokenizer is None; pass the reward model's tokenizer (it may differ from the "
                "policy's)."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        config = getattr(model, "config", None)
        name = getattr(config, "_name_or_path", "") or type(model).__name__
        self.__name__ = str(name).rstrip("/").split("/")[-1] or "reward_model"

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """The texts the reward model scores, exactly as ``GRPOTrainer`` builds them."""
        if prompts and is_conversational(prompts[0]):
            from trl.data_utils import apply_chat_template

            return [
                apply_chat_template(
                    {"messages": list(p) + list(c)}, self.tokenizer, **self.chat_template_kwargs
                )["text"]
                for p, c in zip(prompts, completions, strict=True)
            ]
        return [p + c for p, c in zip(prompts, completions, strict=True)]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        import torch

        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        rewards: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            inputs = self.tokenizer(
                text=texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            ).to(device)
            with torch.inference_mode():
                rewards.extend(self.model(**inputs).logits[:, 0].float().tolist())
        return rewards


def _run_coroutine(coroutine: Any) -> Any:
    """Run a coroutine to completion from synchronous code, also when an event loop is already running in this
    thread (e.g. a notebook): then it runs on a private loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class _SyncRewardFunc:
    """An async reward function called synchronously (the estimator grades all rollouts in one call)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.__name__ = getattr(func, "__name__", None) or type(func).__name__

    def __call__(self, **kwargs: Any) -> Any:
        return _run_coroutine(self.func(**kwargs))


def as_rollout_reward_func(
    func: Any, processing_class: Any = None, *, chat_template_kwargs: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """The synchronous TRL-style reward function that grades rollouts as ``func`` grades responses.

    Args:
        func: a reward function, an async reward function, or a reward model (``nn.Module``).
        processing_class: the reward model's tokenizer (required for a reward model).
        chat_template_kwargs: chat-template arguments for conversational data (reward models only).
    """
    from torch import nn

    if isinstance(func, nn.Module):
        return RewardModelScorer(func, processing_class, chat_template_kwargs=chat_template_kwargs)
    call = type(func).__call__ if not inspect.isfunction(func) else None  # a callable object's method
    if inspect.iscoroutinefunction(func) or (call is not None and inspect.iscoroutinefunction(call)):
        return _SyncRewardFunc(func)
    return func


def synchronous_reward_funcs(funcs: Sequence[Any], names: Sequence[str]) -> list[tuple[Any, str]]:
    """``(function, name)`` of the reward functions ``GRPOTrainer`` calls synchronously in this process (not reward
    models, not async functions): those that can be called again to find which one fails on which row."""
    from torch import nn
    from trl.trainer.utils import is_async_callable

    return [
        (func, name)
        for func, name in zip(funcs, names, strict=True)
        if not isinstance(func, nn.Module) and not is_async_callable(func)
    ]
