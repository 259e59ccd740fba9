"""What a step segmenter is, how to get one by name, and how the steps map onto tokens.

VinePPO estimates one value per reasoning step, so a response is first cut into *steps*: contiguous
character spans that cover the text exactly (``"".join(steps) == text``, whitespace included). The
segmenters live with their tasks; their cut rules follow the paper's Appendix B:

* :class:`~mcadvantage.tasks.gsm8k.GSM8KSegmenter` -- one step per line; the final ``#### N`` answer line
  joins the last step.
* :class:`~mcadvantage.tasks.math.MathSegmenter` -- cut at newlines and sentence ends, never inside math;
  parts longer than ``max_part_length`` characters are cut again at logical points; very short parts join a
  neighbour.
* :class:`~mcadvantage.tasks.newline.NewlineSegmenter` -- one step per line, nothing else.

This module holds what they share: the :class:`StepSegmenter` protocol, the step-list helpers, the name
registry :data:`SEGMENTER_NAMES` behind :func:`get_segmenter`, and the token alignment:
:func:`step_token_boundaries` maps the steps onto token indices (a token belongs to the step that
contains its first character), which is what the estimator needs to build the states ``S_i``;
:func:`segment_completion` decodes, segments and aligns in one call.

Conventions shared by every segmenter:

* Empty text gives ``[]`` (no steps), so ``"".join(segmenter("")) == ""`` still holds.
* Whitespace is never dropped: a line's trailing newline stays with that line (the line segmenters
  can put it at the start of the next step instead, as the official VinePPO code does, with
  ``newline_placement="start"``); after a sentence end the following spaces start the next step
  (byte-level and SentencePiece tokenizers attach a space to the word after it, so the word's token
  then lands in the step it begins).

Layering: this module is below the task modules (:mod:`~mcadvantage.tasks.newline`,
:mod:`~mcadvantage.tasks.gsm8k`, :mod:`~mcadvantage.tasks.math`) and imports none of them; each adds its
segmenter to :data:`SEGMENTER_NAMES` when it is imported. The package :mod:`mcadvantage.tasks` imports every
task module, and Python runs it before any of its modules, so the registry is complete whenever this module
can be used.

This module imports only the standard library at import time (no torch, TRL or vLLM).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

from mcadvantage.core.text import decode_batch

__all__ = [
    "StepSegmenter",
    "get_segmenter",
    "step_token_boundaries",
    "segment_completion",
    "token_char_offsets",
    "SEGMENTER_NAMES",
]


@runtime_checkable
class StepSegmenter(Protocol):
    """Anything that cuts a text into reasoning steps.

    ``segmenter(text)`` returns a list of strings whose concatenation is exactly ``text``.
    """

    def __call__(self, text: str) -> list[str]: ...


def _check_max_steps(max_steps: int | None) -> int | None:
    if max_steps is None:
        return None
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(
            f"max_steps must be None (no cap) or an integer >= 1, got {max_steps!r}; "
            "pass e.g. max_steps=25 to merge everything after the 24th step into the 25th."
        )
    return max_steps


def _cap_steps(steps: list[str], max_steps: int | None) -> list[str]:
    """Merge the tail so that at most ``max_steps`` steps remain (bounds the rollout cost)."""
    if max_steps is None or len(steps) <= max_steps:
        return steps
    return steps[: max_steps - 1] + ["".join(steps[max_steps - 1 :])]


def _pieces(text: str, cuts: Sequence[int]) -> list[str]:
    """Cut ``text`` at the given sorted positions; building steps from cuts keeps the join exact."""
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in pairwise(bounds) if b > a]


# --------------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------------


#: Segmenter name -> class: ``"gsm8k"``, ``"math"`` and ``"newline"``. Each task module adds its own when
#: imported (``mcadvantage.tasks`` imports them all).
SEGMENTER_NAMES: dict[str, type] = {}


class _CheckedSegmenter:
    """Wraps a user callable and verifies every output joins back to the input (no silent loss)."""

    def __init__(self, fn: Callable[[str], list[str]]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)

    def __repr__(self) -> str:
        return f"_CheckedSegmenter({self.name})"

    def __call__(self, text: str) -> list[str]:
        steps = self.fn(text)
        if isinstance(steps, str) or not isinstance(steps, (list, tuple)):
            raise ValueError(
                f"segmenter {self.name} must return a list of strings, got {type(steps).__name__}"
            )
        steps = list(steps)
        if not all(isinstance(s, str) for s in steps):
            raise ValueError(f"segmenter {self.name} returned a non-string step: {steps!r:.200}")
        if "".join(steps) != text:
            joined = "".join(steps)
            k = next(
                (i for i, (x, y) in enumerate(zip(joined, text, strict=False)) if x != y),
                min(len(joined), len(text)),
            )
            raise ValueError(
                f"segmenter {self.name} lost or changed text: its {len(steps)} steps join to "
                f"{len(joined)} characters but the input has {len(text)} (first difference at "
                f"character {k}: {text[k : k + 20]!r} vs {joined[k : k + 20]!r}). A segmenter must "
                "return contiguous pieces of its input, whitespace included, so that "
                "''.join(steps) == text."
            )
        return steps


def get_segmenter(
    spec: str | StepSegmenter | Callable[[str], list[str]], **kwargs: Any
) -> Callable[[str], list[str]]:
    """Resolve a segmenter specification.

    Args:
        spec: a name (``"gsm8k"``, ``"math"`` or ``"newline"``, case-insensitive), an instance of
            one of the built-in segmenters (returned unchanged), or any callable
            ``f(text) -> list[str]``. Foreign callables are wrapped so that an output that does not
            join back to the input raises a ``ValueError`` naming the segmenter.
        **kwargs: constructor arguments when ``spec`` is a name (e.g. ``max_steps=25``).

    Raises:
        ValueError: unknown name, or keyword arguments given with a non-name ``spec``.
        TypeError: ``spec`` is neither a string nor callable.
    """
    if isinstance(spec, str):
        cls = SEGMENTER_NAMES.get(spec.strip().lower())
        if cls is None:
            raise ValueError(
                f"unknown segmenter {spec!r}; valid names are {sorted(SEGMENTER_NAMES)}, or pass a "
                "callable f(text) -> list[str]."
            )
        return cls(**kwargs)
    if kwargs:
        raise ValueError(
            f"keyword arguments {sorted(kwargs)} only apply to a segmenter name, not to {spec!r}; "
            "configure the instance yourself instead."
        )
    if isinstance(spec, (*SEGMENTER_NAMES.values(), _CheckedSegmenter)):
        return spec
    if callable(spec):
        return _CheckedSegmenter(spec)
    raise TypeError(
        f"segmenter must be a name {sorted(SEGMENTER_NAMES)} or a callable f(text) -> list[str], "
        f"got {type(spec).__name__}"
    )


# --------------------------------------------------------------------------------------------------
# Token alignment
# --------------------------------------------------------------------------------------------------

# Context tokens decoded in front of each token. Decoders are not additive at the start of a text
# (SentencePiece strips the first token's leading space, byte-level BPE may start mid-character);
# a few tokens of context make those effects cancel in the length difference.
_CONTEXT_TOKENS = 4
_REPLACEMENT = "\ufffd"


def _decode_many(tokenizer: Any, windows: list[list[int]]) -> list[str]:
    # One Rust call for all windows where the tokenizer allows it: transformers' Python decode costs ~10-20 us
    # per call, which alone would exceed the ~20 ms budget for 3 x 1024 windows.
    return decode_batch(tokenizer, windows, clean_up_tokenization_spaces=False)


def token_char_offsets(tokenizer: Any, token_ids: Sequence[int]) -> tuple[list[int], str]:
    """Start character of each token in the decoded text, and that decoded text.

    ``offsets[t]`` is the index (in the returned text) of the character that contains token ``t``'s
    first byte, so a token that completes a multi-byte character started by the previous token has
    the same offset as that token; special tokens skipped by decoding get the offset of the next
    character. The text is the concatenation of per-token pieces, normally equal to
    ``tokenizer.decode(token_ids, skip_special_tokens=True)``.

    Cost: one batched decode of ``3 * len(token_ids)`` windows of at most ~5 tokens (linear).
    """
    ids = [int(t) for t in token_ids]
    total = len(ids)
    if total == 0:
        return [], ""
    singles = _decode_many(tokenizer, [[t] for t in ids])
    # Tokens that cannot start a window cleanly: skipped specials (empty) and continuation bytes.
    bad_start = [s == "" or s.startswith(_REPLACEMENT) for s in singles]
    starts = []
    windows: list[list[int]] = []
    for t in range(total):
        s = max(0, t - _CONTEXT_TOKENS)
        floor = max(0, t - 4 * _CONTEXT_TOKENS)
        while s > floor and bad_start[s]:
            s -= 1
        starts.append(s)
        windows.append(ids[s:t])
        windows.append(ids[s : t + 1])
    texts = _decode_many(tokenizer, windows)
    offsets = [0] * total
    pieces: list[str] = []
    pos = 0
    for t in range(total):
        before = texts[2 * t].rstrip(_REPLACEMENT)  # drop an incomplete trailing character
        after = texts[2 * t + 1].rstrip(_REPLACEMENT)
        offsets[t] = pos
        delta = max(len(after) - len(before), 0)
        if delta:
            piece = after[len(before) :] if after.startswith(before) else after[-delta:]
            pieces.append(piece)
            pos += delta
    return offsets, "".join(pieces)


def _align_positions(src: str, dst: str) -> list[int]:
    """Monotone map from positions in ``src`` (0..len) to positions in ``dst``.

    Used when the decoded pieces differ from the segmented text (decode-time space clean-up, a
    replacement character, a caller that segmented a slightly different string). Equal characters
    map one to one; extra whitespace on either side is skipped; other differences are resynchronised
    on the next matching 8-character window when one is near, else treated as substitutions. Runs in
    linear time (bounded look-ahead) where a general diff would be quadratic.
    """
    ns, nd = len(src), len(dst)
    out = [0] * (ns + 1)
    i = j = 0
    while i < ns:
        if j < nd and src[i] == dst[j]:
            out[i] = j
            i += 1
            j += 1
        elif src[i].isspace():
            out[i] = j
            i += 1
        elif j < nd and dst[j].isspace():
            j += 1
        elif j >= nd:
            out[i] = nd
            i += 1
        else:
            probe = src[i : i + 8]
            k = dst.find(probe, j, j + 64 + len(probe))
            if k > j:
                j = k  # dst has extra characters
                continue
            probe = dst[j : j + 8]
            k = src.find(probe, i, i + 64 + len(probe))
            if k > i:
                for q in range(i, k):  # src has extra characters: they map onto dst[j]
                    out[q] = j
                i = k
                continue
            out[i] = j  # substitution
            i += 1
            j += 1
    # The end of src maps to where the walk stopped: trailing characters only dst has (e.g. the
    # U+FFFD of a cut-off multi-byte character) then still own the text-less tokens at the end.
    out[ns] = min(j, nd)
    return out


def step_token_boundaries(
    tokenizer: Any,
    token_ids: Sequence[int],
    steps: Sequence[str],
    *,
    offsets: Sequence[int] | Sequence[tuple[int, int]] | None = None,
) -> list[int]:
    """Token index where each step starts: ``[0 = b_0 < b_1 < ... < b_n = len(token_ids)]``.

    Token ``t`` belongs to the step that contains its first character (for a token that continues a
    multi-byte character, the character it continues). Tokens without text of their own -- EOS and
    other special tokens at the end -- stay in the step of the token before them, i.e. the last
    step, so appending EOS never adds a boundary. Steps that own no token (all their characters lie
    inside a token that starts in an earlier step) are merged with the step before, so the result can
    have fewer than ``len(steps) + 1`` entries; it is always strictly increasing and ends at
    ``len(token_ids)``. Empty ``token_ids`` give ``[0]``.

    The text is recovered by decoding (see :func:`token_char_offsets`); when it differs from
    ``"".join(steps)`` (a decode that adds or removes spaces, an undecodable byte) character
    positions are aligned and clamped instead of raising; each token is then placed by the first
    non-whitespace character of its decoded piece, since whitespace is what such decoders change.

    Args:
        tokenizer: a Hugging Face tokenizer (fast tokenizers are decoded in one batched call). Not
            used when ``offsets`` is given.
        token_ids: the response's token ids (no prompt), EOS included if it was generated.
        steps: the response text cut into steps (e.g. ``MathSegmenter()(text)``).
        offsets: optional start character of each token in ``"".join(steps)`` (or ``(start, end)``
            pairs as from ``return_offsets_mapping``), to skip decoding. They are made
            non-decreasing (running maximum), so a special token reported at ``(0, 0)`` joins the
            step of the token before it.
    """
    total = len(token_ids)
    if total == 0:
        return [0]
    text = "".join(steps)
    ends = []
    acc = 0
    for s in steps:
        acc += len(s)
        ends.append(acc)
    n_steps = len(ends)
    if n_steps <= 1:
        return [0, total]

    if offsets is not None:
        if len(offsets) != total:
            raise ValueError(
                f"offsets has {len(offsets)} entries but token_ids has {total}; pass one start "
                "offset (or (start, end) pair) per token."
            )
        chars = [int(o[0]) if isinstance(o, (tuple, list)) else int(o) for o in offsets]
    else:
        if tokenizer is None:
            raise ValueError(
                "step_token_boundaries needs a tokenizer (or offsets=...) to map steps to tokens"
            )
        raw, decoded = token_char_offsets(tokenizer, token_ids)
        if decoded == text:
            chars = raw
        else:
            # Decoders disagree about whitespace (added, removed or changed spaces), so anchor each
            # token on the first non-whitespace character of its decoded piece.
            mapping = _align_positions(decoded, text)
            chars = []
            for a, b in zip(raw, [*raw[1:], len(decoded)], strict=True):
                k = a
                while k < b and decoded[k].isspace():
                    k += 1
                chars.append(mapping[a if k == b else k])

    bounds = [0]
    step_prev = 0
    high = 0
    last = n_steps - 1
    n_chars = len(text)
    for t in range(total):
        if chars[t] >= n_chars:
            continue  # no text of its own (EOS, trailing specials): stays with the token before
        high = max(high, chars[t])
        step = min(bisect.bisect_right(ends, high), last)
        if step > step_prev:
            if t > 0:
                bounds.append(t)
            step_prev = step
    bounds.append(total)
    return bounds


def segment_completion(
    segmenter: str | StepSegmenter | Callable[[str], list[str]], tokenizer: Any, token_ids: Sequence[int]
) -> list[int]:
    """Decode ``token_ids`` (special tokens skipped), cut the text into steps and return the step
    token boundaries (see :func:`step_token_boundaries`)."""
    seg = get_segmenter(segmenter)
    if len(token_ids) == 0:
        return [0]
    offsets, text = token_char_offsets(tokenizer, token_ids)
    # Segment the very text the offsets refer to: alignment is then exact and decoding runs once.
    return step_token_boundaries(tokenizer, token_ids, seg(text), offsets=offsets)
