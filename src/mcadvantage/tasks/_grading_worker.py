"""Entry point of :class:`~mcadvantage.MathVerifier`'s grading process (internal).

The verifier starts this process with :mod:`subprocess`, not :mod:`multiprocessing`::

    <python> -c "<BOOTSTRAP>" <package root> <socket fd>

Why not ``multiprocessing``: its ``spawn`` start method re-runs the caller's ``__main__`` module in the
child, so a plain script without an ``if __name__ == "__main__":`` guard re-entered the verifier and the
start failed with an ``EOFError``; ``fork`` is unsafe in a multi-threaded trainer. A fresh interpreter that
imports only this module has neither problem, whatever the caller's entry point (script, ``python -c``,
notebook, pytest, ``accelerate launch``).

Why ``-c`` and an explicit package root instead of ``-m mcadvantage.tasks._grading_worker``: ``-m`` puts the
working directory first on ``sys.path``, where another ``mcadvantage`` folder could shadow the one the
caller imported; the bootstrap puts the caller's package root first instead. ``__main__`` then has no
file or module spec, so even the supervisor's ``spawn`` fallback (platforms without ``fork``) has no main
module to re-run.

Protocol on the socket (a :class:`multiprocessing.connection.Connection`): the parent first sends a
settings dict (its ``sys.path`` and the grading limits); the process answers ``("ready", pid)`` once
math-verify is imported and the eval guard is on, or ``("error", "<one line>")`` if that failed, and
then serves requests in :func:`mcadvantage.tasks.supervisor._supervisor_main`.

Layering: :mod:`mcadvantage.tasks.grading` (the caller's side) imports only :data:`BOOTSTRAP` from here;
:func:`main` imports :mod:`~mcadvantage.tasks.supervisor` and the eval guard
(:mod:`~mcadvantage.tasks.math_equivalence`) once ``sys.path`` is the caller's, and never the caller's side.
"""

from __future__ import annotations

import sys
from typing import Any

# Run by ``python -c``; argv[1] is the directory that holds the caller's ``mcadvantage`` package.
BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from mcadvantage.tasks._grading_worker import main; sys.exit(main(int(sys.argv[2])))"
)


def main(fd: int) -> int:
    """Serve grading requests on the connected socket ``fd`` until the parent closes it; exit status."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    try:
        settings: dict[str, Any] = conn.recv()
    except (EOFError, OSError):  # the parent went away before sending the settings
        return 0
    # Resolve imports exactly as the caller does (as multiprocessing's spawn does too): math-verify or
    # sympy may live in a directory the caller added to sys.path at run time.
    sys.path[:] = list(settings["sys_path"])
    try:
        import math_verify  # noqa: F401  (the import that fails when the environment is wrong)

        from mcadvantage.tasks.math_equivalence import _install_eval_guard
        from mcadvantage.tasks.supervisor import _supervisor_main

        _install_eval_guard()
    except BaseException as exc:  # report any start-up failure in one line instead of dying silently
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        try:
            conn.send(("error", message))
        except OSError:
            pass
        return 1
    _supervisor_main(
        conn,
        settings["timeout_seconds"],
        settings["memory_limit_mb"],
        settings["interrupt_in_child"],
        settings["num_workers"],
    )
    return 0
