"""One check of an installed dependency's version against the release range mcadvantage is tested with."""

from __future__ import annotations

from collections.abc import Callable

from packaging.version import Version

__all__ = ["check_version_range"]


def check_version_range(
    version: str, minimum: Version, maximum: Version, message: Callable[[Version], str]
) -> None:
    """Raise ``ImportError(message(v))`` unless ``version``'s release (pre-, post- and dev-release parts dropped)
    lies in ``[minimum, maximum)``; ``v`` is ``version`` parsed."""
    v = Version(version)
    if not minimum <= Version(v.base_version) < maximum:
        raise ImportError(message(v))
