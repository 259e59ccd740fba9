"""Tokenizer and message helpers used by the estimator and the segmenters (one definition each)."""

from __future__ import annotations

from typing import Any

__all__ = ["decode_batch", "is_conversational", "plain_fast_backend"]


def decode_batch(
    tokenizer: Any, sequences: list[list[int]], *, clean_up_tokenization_spaces: bool | None = None
) -> list[str]:
    """``tokenizer.batch_decode(sequences, skip_special_tokens=True)``, without its per-token cost.

    transformers' ``decode`` first runs ``to_py_obj`` over the input, a Python-level type check of
    every token id; on Monte Carlo rollouts (prefix + continuation, millions of ids per training
    step) that check costs more than the decoding itself. For a plain fast tokenizer -- one whose
    decoding is exactly the Rust backend's ``decode`` (no subclass override, no
    ``clean_up_tokenization_spaces`` post-processing) -- this calls the backend's
    ``decode_batch`` directly, which gives the same strings. Any other tokenizer goes through
    ``batch_decode``.

    Args:
        clean_up_tokenization_spaces: None keeps the tokenizer's own setting; False forces raw text (what
            token alignment needs: clean-up would shift characters between tokens).
    """
    backend = plain_fast_backend(tokenizer, ignore_clean_up=clean_up_tokenization_spaces is False)
    if backend is not None:
        return backend.decode_batch(sequences, skip_special_tokens=True)
    kwargs = (
        {}
        if clean_up_tokenization_spaces is None
        else {"clean_up_tokenization_spaces": clean_up_tokenization_spaces}
    )
    return tokenizer.batch_decode(sequences, skip_special_tokens=True, **kwargs)


def plain_fast_backend(tokenizer: Any, *, ignore_clean_up: bool = False) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` when decoding through it is equivalent to
    ``tokenizer.batch_decode(..., skip_special_tokens=True)`` (with ``ignore_clean_up``: equivalent to it with
    ``clean_up_tokenization_spaces=False``); otherwise None."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        return None
    cls = type(tokenizer)
    # A subclass that customises any decoding step (e.g. Whisper's timestamps) keeps its own path.
    for name in ("batch_decode", "decode", "_decode", "convert_tokens_to_string"):
        if getattr(cls, name, None) is not getattr(PreTrainedTokenizerFast, name, None):
            return None
    if not ignore_clean_up and getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None  # transformers post-processes the text (or decides not to): let it
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if callable(getattr(backend, "decode_batch", None)) else None


def is_conversational(prompt: Any) -> bool:
    """TRL's convention: a conversational prompt is a list of ``{"role": ..., "content": ...}`` messages."""
    return (
        isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]
    )
