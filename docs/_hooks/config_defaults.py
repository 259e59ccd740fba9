"""MkDocs hook: the table of ``GRPOConfig`` defaults that ``VinePPOConfig`` resolves differently is made from the
one list, :data:`mcadvantage.trainer.config.GRPO_DEFAULT_DIFFERENCES`, when the site is built.

A page holds the marker ``<!-- grpo-default-differences: table -->`` where the table goes.
"""

from __future__ import annotations

from typing import Any

TABLE_MARKER = "<!-- grpo-default-differences: table -->"


def table_markdown() -> str:
    """One row per field: its name and why ``VinePPOConfig`` resolves it differently."""
    from mcadvantage.trainer.config import GRPO_DEFAULT_DIFFERENCES

    rows = ["| field | how `VinePPOConfig` resolves it, and why |", "|---|---|"]
    rows += [f"| `{name}` | {reason} |" for name, reason in GRPO_DEFAULT_DIFFERENCES.items()]
    return "\n".join(rows)


def render(markdown: str) -> str:
    """``markdown`` with the marker replaced by the table."""
    return markdown.replace(TABLE_MARKER, table_markdown()) if TABLE_MARKER in markdown else markdown


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    return render(markdown)
