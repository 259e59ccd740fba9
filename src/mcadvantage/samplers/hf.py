"""A sampler on transformers ``generate``: no extra engine, works with any causal LM (CPU, GPU, PEFT).

transformers samples one batch of equal-budget rows at a time; what it does not do, and this module
adds: packing many rollout requests (different prefixes, ``n`` and budgets) into memory-bounded
left-padded batches, cutting every continuation at its own budget and at EOS, and reporting
truncation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from mcadvantage.core.settings import validate_sampling_settings
from mcadvantage.samplers.base import Continuation, RolloutRequest

__all__ = ["TransformersSampler"]


class TransformersSampler:
    """Draw Monte Carlo continuations with ``model.generate``.

    Requests are sorted by prefix length (less padding), every request is expanded into ``n`` rows
    (each row an independent sample from torch's global generator: seed it with
    ``torch.manual_seed`` for reproducible rollouts), rows are packed into batches of at most
    ``max_batch_sequences`` rows, left-padded, and generated up to the largest budget in the batch;
    each continuation is then cut at its own request's ``max_tokens`` and after its first EOS token.

    Args:
        model: a causal LM (``PreTrainedModel`` or a PEFT model wrapping one). Pass the unwrapped
            module (e.g. via TRL's ``unwrap_model_for_generation`` under DeepSpeed ZeRO-3).
        tokenizer: used for its pad and EOS token ids; when None, ``model.generation_config``'s.
        temperature: sampling temperature (>= 0; 0 is greedy decoding, drawn as top-k 1). Use the training rollouts' sampling settings for
            this and the four below: VinePPO samples values with the current policy as it is trained.
        top_p: nucleus sampling threshold in (0, 1] (1.0 = off).
        top_k: keep the ``top_k`` most likely tokens; ``None`` disables top-k filtering
            (transformers' default of 50 is not applied).
        min_p: minimum probability relative to the most likely token (None = off).
        repetition_penalty: transformers' repetition penalty (1.0 = off).
        max_batch_sequences: rows per ``generate`` call (memory bound).
        generation_kwargs: extra ``GenerationConfig`` fields, applied last.

    The model is put in eval mode (no dropout) and run under ``torch.no_grad`` while sampling; its
    training mode is restored afterwards. Every sampling field (``do_sample=True``, temperature,
    top-p/k, min-p, typical-p, epsilon/eta cutoffs, repetition penalty, EOS/pad ids) is set
    explicitly, because transformers fills unset fields from the model's ``generation_config``: a
    checkpoint whose defaults are greedy decoding, another temperature or a ``min_p`` cannot change
    the rollouts. Model-specific constraints that are not sampling settings (e.g. ``suppress_tokens``,
    ``bad_words_ids``) still apply, as they do to the training rollouts.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
        max_batch_sequences: int = 256,
        generation_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        validate_sampling_settings(
            "TransformersSampler",
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
        )
        if max_batch_sequences < 1:
            raise ValueError(f"max_batch_sequences={max_batch_sequences!r} must be >= 1.")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = float(repetition_penalty)
        self.max_batch_sequences = int(max_batch_sequences)
        self.generation_kwargs = dict(generation_kwargs or {})
        self.eos_token_ids, self.pad_token_id = self._special_ids()

    def _special_ids(self) -> tuple[set[int], int]:
        gen_cfg = getattr(self.model, "generation_config", None)
        eos: Any = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        if eos is None and gen_cfg is not None:
            eos = gen_cfg.eos_token_id
        if eos is None:
            raise ValueError(
                "TransformersSampler: no EOS token id (tokenizer.eos_token_id and "
                "model.generation_config.eos_token_id are both None); pass a tokenizer with an EOS token."
            )
        eos_ids = {int(e) for e in eos} if isinstance(eos, (list, tuple, set)) else {int(eos)}
        pad = getattr(self.tokenizer, "pad_token_id", None) if self.tokenizer is not None else None
        if pad is None and gen_cfg is not None:
            pad = gen_cfg.pad_token_id
        if pad is None:
            # Padding positions are masked out, so any id works; EOS is the usual choice.
            pad = min(eos_ids)
        return eos_ids, int(pad)

    def generation_config(self, max_new_tokens: int) -> Any:
        """The ``GenerationConfig`` used for a batch generated up to ``max_new_tokens``."""
        from transformers import GenerationConfig

        greedy = self.temperature == 0
        cfg = dict(
            # Greedy (temperature 0) is sampling from the top-1 token: the same code path, no special case.
            do_sample=True,
            num_beams=1,
            num_return_sequences=1,
            max_new_tokens=int(max_new_tokens),
            temperature=1.0 if greedy else self.temperature,
            top_p=self.top_p,
            # 0 disables top-k in transformers; None would let a default (50) creep in.
            top_k=1 if greedy else (0 if self.top_k is None else int(self.top_k)),
            # transformers fills every None field from the model's generation_config, so "off" must be
            # spelled out (0 / 1.0) or a checkpoint's min_p/typical_p would filter the rollouts.
            min_p=0.0 if self.min_p is None else float(self.min_p),
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=self.repetition_penalty,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
        )
        cfg.update(self.generation_kwargs)
        return GenerationConfig(**cfg)

    def _batches(self, requests: Sequence[RolloutRequest]) -> Iterator[list[tuple[int, RolloutRequest, int]]]:
        """Rows ``(request index, request, copies)`` packed into batches of <= max_batch_sequences rows,
        requests in order of prefix length; a request with many samples may span batches."""
        order = sorted(
            range(len(requests)), key=lambda i: (len(requests[i].prefix_ids), requests[i].max_tokens)
        )
        batch: list[tuple[int, RolloutRequest, int]] = []
        size = 0
        for i in order:
            req = requests[i]
            left = req.n
            while left > 0:
                take = min(left, self.max_batch_sequences - size)
                batch.append((i, req, take))
                size += take
                left -= take
                if size == self.max_batch_sequences:
                    yield batch
                    batch, size = [], 0
        if batch:
            yield batch

    def _device(self) -> torch.device:
        device = getattr(self.model, "device", None)
        if isinstance(device, torch.device):
            return device
        return next(self.model.parameters()).device

    def _generate_rows(self, batch: list[tuple[int, RolloutRequest, int]]) -> list[tuple[int, Continuation]]:
        rows: list[tuple[int, RolloutRequest]] = [(i, req) for i, req, k in batch for _ in range(k)]
        width = max(len(req.prefix_ids) for _, req in rows)
        max_new = max(req.max_tokens for _, req in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (_, req) in enumerate(rows):
            n = len(req.prefix_ids)
            input_ids[r, width - n :] = torch.tensor(req.prefix_ids, dtype=torch.long)
            attention_mask[r, width - n :] = 1
        device = self._device()
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=self.generation_config(max_new),
        )
        new_tokens = out[:, width:].tolist()
        result = []
        for (i, req), tokens in zip(rows, new_tokens, strict=True):
            result.append((i, self._cut(tokens, req.max_tokens)))
        return result

    def _cut(self, tokens: list[int], max_tokens: int) -> Continuation:
        """Keep tokens up to and including the first EOS, at most ``max_tokens``; drop padding."""
        tokens = tokens[:max_tokens]
        for j, tok in enumerate(tokens):
            if tok in self.eos_token_ids:
                return Continuation(token_ids=tuple(tokens[: j + 1]), truncated=False)
        return Continuation(token_ids=tuple(tokens), truncated=True)

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """Sample ``requests[i].n`` continuations of every request (see the class docstring)."""
        results: list[list[Continuation]] = [[] for _ in requests]
        if not requests:
            return results
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            with torch.no_grad():
                for batch in self._batches(requests):
                    for i, cont in self._generate_rows(batch):
                        results[i].append(cont)
        finally:
            if was_training:
                self.model.train()
        return results
