"""CPU stand-ins for verl's rollout handle, and a verl training batch built with verl's own padding code.

Used by tests/integrations/test_integration_verl.py and docs/howto/verl.md; importing this module needs verl.
"""

from __future__ import annotations

import importlib
import random
import types
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.utils.torch_functional import get_response_mask, pad_2d_list_to_length


def _output(
    prompts: torch.Tensor, prompt_mask: torch.Tensor, rows: list[list[int]], data: DataProto
) -> DataProto:
    """verl's generation output layout: ``prompts`` (left-padded), ``responses`` right-padded to
    ``meta_info["response_length"]``, ``attention_mask`` over both (1 up to and including EOS)."""
    width = int(data.meta_info["response_length"])
    pad, eos = data.meta_info["pad_token_id"], data.meta_info["eos_token_id"]
    responses = pad_2d_list_to_length(rows, pad, max_length=width) if rows else torch.zeros((0, width))
    responses = responses[:, :width].long()
    response_mask = get_response_mask(responses, eos_token=eos, dtype=prompt_mask.dtype)
    # Padding after a short, EOS-less response is not part of it either.
    lengths = torch.tensor([min(len(r), width) for r in rows])
    response_mask = response_mask * (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(
        response_mask.dtype
    )
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        },
        meta_info={"timing": {}},
    )


class HFRolloutWorkerGroup:
    """``generate_sequences`` with transformers' ``generate`` on CPU: samples (temperature from ``meta_info``)
    ``meta_info["response_length"]`` tokens per row of left-padded ``input_ids``."""

    def __init__(self, model: Any, seed: int = 0) -> None:
        self.model = model
        self.seed = seed
        self.batches: list[DataProto] = []

    def generate_sequences(self, data: DataProto) -> DataProto:
        self.batches.append(data)
        input_ids, attention_mask = data.batch["input_ids"], data.batch["attention_mask"]
        torch.manual_seed(self.seed + len(self.batches))
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=True,
                temperature=float(data.meta_info.get("temperature", 1.0)),
                top_k=0,
                max_new_tokens=int(data.meta_info["response_length"]),
                pad_token_id=data.meta_info["pad_token_id"],
                eos_token_id=data.meta_info["eos_token_id"],
            )
        eos = data.meta_info["eos_token_id"]
        rows = []
        for generated in out[:, input_ids.shape[1] :].tolist():
            end = generated.index(eos) + 1 if eos in generated else len(generated)
            rows.append(generated[:end])
        return _output(input_ids, attention_mask, rows, data)


class ScriptedEngine:
    """A deterministic toy policy: the ``j``-th sample of a prefix depends only on ``(prefix, j)``, so the same
    rollouts come out whether they are asked for through verl's ``DataProto`` or as a plain ``Sampler``.

    ``answer(prefix_ids, rng) -> token ids`` writes one continuation.
    """

    def __init__(self, answer: Callable[[tuple[int, ...], random.Random], list[int]]) -> None:
        self.answer = answer
        self.seen: Counter[tuple[int, ...]] = Counter()
        self.calls = 0

    def continuation(self, prefix: Sequence[int], max_tokens: int) -> list[int]:
        key = tuple(prefix)
        rng = random.Random(hash((key, self.seen[key])))
        self.seen[key] += 1
        return self.answer(key, rng)[:max_tokens]

    # -- as verl's rollout handle -----------------------------------------------------------------------------
    def generate_sequences(self, data: DataProto) -> DataProto:
        self.calls += 1
        width = int(data.meta_info["response_length"])
        prefixes = data.non_tensor_batch["raw_prompt_ids"]
        budgets = data.non_tensor_batch.get("mc_max_tokens", np.full(len(prefixes), width))
        rows = [self.continuation(p, int(b)) for p, b in zip(prefixes, budgets, strict=True)]
        return _output(data.batch["input_ids"], data.batch["attention_mask"], rows, data)

    # -- as a plain Sampler ------------------------------------------------------------------------------------
    def sample(self, requests: Sequence[Any]) -> list[list[Any]]:
        from mcadvantage.samplers.base import Continuation

        self.calls += 1
        eos = self.eos_token_id
        out = []
        for r in requests:
            conts = []
            for _ in range(r.n):
                ids = self.continuation(r.prefix_ids, r.max_tokens)
                finished = bool(ids) and ids[-1] == eos
                conts.append(Continuation(tuple(ids), truncated=not finished and len(ids) >= r.max_tokens))
            out.append(conts)
        return out

    eos_token_id: int = 2


def verl_training_batch(
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    scores: Sequence[float],
    *,
    golds: Sequence[str],
    response_length: int,
    data_source: str = "openai/gsm8k",
) -> DataProto:
    """A batch as ``RayPPOTrainer.fit`` holds it after generation and rewards: left-padded ``prompts``,
    ``responses`` right-padded with verl's ``pad_2d_list_to_length``, ``response_mask`` from verl's
    ``get_response_mask``, the score on the last response token of ``token_level_scores``, and the reward
    columns (``data_source``, ``reward_model``, ``uid``)."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompt_rows = [tokenizer.encode(p) for p in prompts]
    width = max(map(len, prompt_rows))
    prompt_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, row in enumerate(prompt_rows):
        prompt_ids[i, width - len(row) :], prompt_mask[i, width - len(row) :] = torch.tensor(row), 1
    data = DataProto.from_dict(
        tensors={}, meta_info={"response_length": response_length, "pad_token_id": pad, "eos_token_id": eos}
    )
    out = _output(prompt_ids, prompt_mask, [tokenizer.encode(r) + [eos] for r in responses], data)
    lengths = out.batch["response_mask"].sum(-1)
    token_level_scores = torch.zeros(out.batch["responses"].shape, dtype=torch.float32)
    token_level_scores[torch.arange(len(prompts)), lengths - 1] = torch.tensor(
        list(scores), dtype=torch.float32
    )
    out.batch["token_level_scores"] = token_level_scores
    out.batch["token_level_rewards"] = token_level_scores.clone()
    out.non_tensor_batch.update(
        {
            "data_source": np.array([data_source] * len(prompts), dtype=object),
            "reward_model": np.array([{"ground_truth": g, "style": "rule"} for g in golds], dtype=object),
            "uid": np.array([f"u{i}" for i in range(len(prompts))], dtype=object),
        }
    )
    out.meta_info = {}
    return out


def hydra_standin() -> types.ModuleType:
    """The hydra functions verl's modules call on import and in its agent loop: ``hydra.utils.instantiate`` of an
    agent loop's ``_target_`` (the other keys and the call's keyword arguments go to the class), and ``hydra.main``
    as a decorator (``verl.trainer.main_ppo`` applies it at import; never called here). Our CI venv cannot import
    hydra: hydra-core needs the ANTLR 4.9 runtime and math-verify's LaTeX parser 4.13 (docs/howto/verl.md)."""

    def instantiate(config, **kwargs):
        spec = dict(config)
        module, _, name = str(spec.pop("_target_")).rpartition(".")
        return getattr(importlib.import_module(module), name)(**spec, **kwargs)

    hydra = types.ModuleType("hydra")
    hydra.utils = types.ModuleType("hydra.utils")
    hydra.utils.instantiate = instantiate
    hydra.main = lambda **_: lambda entry: entry  # verl.trainer.main_ppo decorates its main() at import
    return hydra
