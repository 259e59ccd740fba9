"""The plain newline segmenter: one step per line, nothing else (``segmenter="newline"``).

:class:`NewlineSegmenter` is also the base of GSM8K's segmenter (:mod:`mcadvantage.tasks.gsm8k`), which adds
the ``#### N`` answer-line rule. The newline placement option (end of a line's step, or start of the next) is
defined here.
"""

from __future__ import annotations

from mcadvantage.tasks.segmentation import SEGMENTER_NAMES, _cap_steps, _check_max_steps

__all__ = ["NewlineSegmenter"]


_NEWLINE_PLACEMENTS = ("end", "start")


def _check_newline_placement(newline_placement: str) -> str:
    if newline_placement not in _NEWLINE_PLACEMENTS:
        raise ValueError(
            f"newline_placement must be 'end' (a line's newline ends its step, the default) or "
            f"'start' (the newline starts the next step, as in the official VinePPO code), got "
            f"{newline_placement!r}"
        )
    return newline_placement


class NewlineSegmenter:
    """One step per line.

    Each step keeps its trailing ``"\\n"`` (see ``newline_placement`` for the other convention).
    Blank (whitespace-only) lines merge forward into the next step; blank lines at the very end join
    the last step. Only ``"\\n"`` separates lines (``"\\r\\n"`` stays inside its line).

    Args:
        max_steps: cap on the number of steps; the tail beyond it is merged into the last allowed
            step. ``None`` (default) means no cap.
        newline_placement: ``"end"`` (default): the newline that ends a line is the last character
            of that line's step (``["a\\n", "b"]``). ``"start"``: it is the first character of the
            next step (``["a", "\\nb"]``); the steps are the same lines, only the newline between
            two steps moves. Blank lines still merge forward (``"a\\n\\nb"`` gives ``["a",
            "\\n\\nb"]``).
    """

    #: Lines whose stripped text starts with this marker join the previous step (None: no marker).
    answer_marker: str | None = None

    def __init__(self, max_steps: int | None = None, *, newline_placement: str = "end") -> None:
        self.max_steps = _check_max_steps(max_steps)
        self.newline_placement = _check_newline_placement(newline_placement)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_steps={self.max_steps!r}{self._placement_repr()})"

    def _placement_repr(self) -> str:
        # Shown only when not the default, so the repr of a default instance stays as it was.
        return "" if self.newline_placement == "end" else f", newline_placement={self.newline_placement!r}"

    def __call__(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__} expects a str, got {type(text).__name__}")
        steps: list[str] = []
        pending = ""  # blank lines waiting for the next non-blank line
        for line in _split_lines(text):
            if not line.strip():
                pending += line
                continue
            chunk, pending = pending + line, ""
            marker = self.answer_marker
            if marker is not None and steps and line.lstrip().startswith(marker):
                steps[-1] += chunk
            else:
                steps.append(chunk)
        if pending:
            if steps:
                steps[-1] += pending
            else:
                steps.append(pending)
        if self.newline_placement == "start":
            steps = _newlines_to_next_step(steps)
        return _cap_steps(steps, self.max_steps)


def _split_lines(text: str) -> list[str]:
    # str.splitlines would also cut at "\r", "\x0b", "\u2028", ...; only "\n" ends a line here.
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _newlines_to_next_step(steps: list[str]) -> list[str]:
    """Move the newline that ends each step (but the last) to the start of the next step.

    Every step but the last ends with ``"\\n"`` (it ends a line) and holds a non-blank line, so no
    step becomes empty and the join is unchanged.
    """
    out = list(steps)
    for k in range(len(out) - 1):
        out[k], out[k + 1] = out[k][:-1], "\n" + out[k + 1]
    return out


SEGMENTER_NAMES["newline"] = NewlineSegmenter
