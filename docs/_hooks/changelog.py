"""MkDocs hook: the Changelog page shows the repository's ``CHANGELOG.md``, read at build time (never copied into
``docs/``, so the two cannot drift).

``docs/changelog.md`` holds only the marker line below; this hook replaces it with ``CHANGELOG.md``. Links there are
written relative to the repository root (as GitHub shows the file): links into ``docs/`` are rewritten relative to
the page, and links to other repository files (which the site does not publish) become their path in code, so a
strict build never fails on a link that works on GitHub.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

#: The line of docs/changelog.md that the changelog replaces.
MARKER = "<!-- include: CHANGELOG.md -->"
PAGE = "changelog.md"

_LINK_RE = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _relink(match: re.Match[str]) -> str:
    text, target = match.groups()
    if _SCHEME_RE.match(target) or target.startswith("#"):
        return match.group(0)  # a web address or an anchor on the page: valid as written
    path, hash_sign, anchor = target.partition("#")
    if path.startswith("docs/"):
        return f"[{text}]({path.removeprefix('docs/')}{hash_sign}{anchor})"
    return f"{text} (`{path}`)"


def include_changelog(markdown: str, changelog: str) -> str:
    """``markdown`` with :data:`MARKER` replaced by ``changelog``, its links made valid on the site."""
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} must contain the line {MARKER!r}, which the changelog replaces.")
    return markdown.replace(MARKER, _LINK_RE.sub(_relink, changelog))


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    changelog = Path(config["config_file_path"]).resolve().parent / "CHANGELOG.md"
    return include_changelog(markdown, changelog.read_text(encoding="utf-8"))
