"""MkDocs hook: the docs' lists of built-in estimators are made from the one table,
:data:`mcadvantage.estimators.BUILTIN_ESTIMATORS`, when the site is built, so a new built-in appears everywhere
without editing a page.

A page holds a marker where a list goes:

- ``<!-- builtin-estimators: names -->``: the names inline, ```"vineppo"`, `"grpo"`, ...``;
- ``<!-- builtin-estimators: table -->``: a table of each built-in's name, class, what it computes, and the config
  fields it reads (its ``config_fields``).
"""

from __future__ import annotations

from typing import Any

NAMES_MARKER = "<!-- builtin-estimators: names -->"
TABLE_MARKER = "<!-- builtin-estimators: table -->"


def names_markdown() -> str:
    """The built-in names, inline."""
    from mcadvantage.estimators import BUILTIN_ESTIMATORS

    return ", ".join(f'`"{name}"`' for name in BUILTIN_ESTIMATORS)


def table_markdown() -> str:
    """One row per built-in: name, class, summary, the config fields it reads."""
    from mcadvantage.estimators import BUILTIN_ESTIMATORS, get_advantage_estimator

    rows = [
        "| `advantage_estimator` | class | what it computes | settings it reads |",
        "|---|---|---|---|",
    ]
    for name, row in BUILTIN_ESTIMATORS.items():
        cls = get_advantage_estimator(name)
        fields = ", ".join(f"`{field}`" for field in cls.config_fields) or "none of its own"
        rows.append(f'| `"{name}"` | `{cls.__name__}` | {row.summary} | {fields} |')
    return "\n".join(rows)


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by its list."""
    if NAMES_MARKER in markdown:
        markdown = markdown.replace(NAMES_MARKER, names_markdown())
    if TABLE_MARKER in markdown:
        markdown = markdown.replace(TABLE_MARKER, table_markdown())
    return markdown


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    return render(markdown)
