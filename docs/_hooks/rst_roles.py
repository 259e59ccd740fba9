"""MkDocs hook: render the Sphinx roles used in mcadvantage's docstrings as API links.

The docstrings are written for both plain ``help()`` reading and this site, and cite other objects
Sphinx-style (``:class:`~mcadvantage.mc.estimator.MCEstimate```). mkdocstrings renders Markdown, where
such a role shows up as ``:class:<code>~mcadvantage.mc.estimator.MCEstimate</code>``. This hook turns
every such role into an mkdocs-autorefs cross-reference to the object's entry on the API page
(``~`` keeps only the last name, as in Sphinx) and drops the role prefix from anything the API page
does not document (e.g. ``trl.GRPOConfig``), which then stays plain code.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

_ROLE_RE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([\w.]+?)(\(\))?</code>")
_DIRECTIVE_RE = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)

# identifier documented on the API page -> itself; short name ("MCEstimate") -> documented identifier
_targets: dict[str, str] = {}


def on_config(config: Any, **kwargs: Any) -> Any:
    _targets.clear()
    api = Path(config["docs_dir"]) / "api.md"
    for ident in _DIRECTIVE_RE.findall(api.read_text(encoding="utf-8")):
        _targets[ident] = ident
        _targets.setdefault(ident.rsplit(".", 1)[-1], ident)
    return config


def _resolve(ident: str) -> str | None:
    """The API page identifier for ``ident`` (a full path, an alias path or a short name), if any."""
    if ident in _targets:
        return _targets[ident]
    parts = ident.split(".")
    # "mcadvantage.samplers.Sampler" (re-export) or a bare "MCEstimate": match on the object's name.
    if parts[0] in ("mcadvantage", parts[-1]) and parts[-1] in _targets:
        return _targets[parts[-1]]
    # A member: "MCValueEstimator.estimate" or "mcadvantage.mc.estimator.MCValueEstimator.estimate".
    if len(parts) >= 2 and parts[-2] in _targets:
        return f"{_targets[parts[-2]]}.{parts[-1]}"
    return None


def _replace(match: re.Match[str]) -> str:
    tilde, ident, call = match.groups()
    shown = (ident.rsplit(".", 1)[-1] if tilde else ident) + (call or "")
    code = f"<code>{html.escape(shown)}</code>"
    target = _resolve(ident)
    if target is None:
        return code
    return f'<autoref identifier="{html.escape(target)}" optional>{code}</autoref>'


def on_page_content(html_text: str, **kwargs: Any) -> str:
    return _ROLE_RE.sub(_replace, html_text)
