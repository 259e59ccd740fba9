"""Inside MathVerifier's grading process: the supervisor loop and the grading children it forks.

Runs only in the grading process (started by :mod:`mcadvantage.tasks.grading` through its entry point
:mod:`mcadvantage.tasks._grading_worker`). ``_supervisor_main`` never grades itself, so it always answers; it
hands answers one at a time to ``num_workers`` forked grading children (``_child_main``, which run
:mod:`mcadvantage.tasks.math_equivalence`'s ``_math_equal``), gives each answer its time budget, and kills and
re-forks a child whose answer runs over (that answer scores False). A child also stops a slow answer itself
with ``SIGALRM`` where it can, and runs under an address-space limit.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import mcadvantage.tasks.math_equivalence as math_equivalence


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside the child; a BaseException so math-verify's ``except Exception``
    blocks cannot swallow it."""


def _limit_memory(memory_limit_mb: int | None) -> None:
    if not memory_limit_mb:
        return
    try:
        import resource

        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = current + memory_limit_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):  # not Linux: rely on the supervisor's kill
        pass


def _detach_from_supervisor(supervisor: tuple[int, int]) -> None:
    """In a forked grading child: let go of the supervisor's link to the caller; die with the supervisor.

    The fork copied the supervisor's end of its socket to the caller. While a child stuck in C code held
    that copy, the caller saw no end-of-file when the supervisor died and waited out its long backstop.
    The fd is pointed at /dev/null rather than closed because the supervisor's Connection object (copied
    too) still owns the number. On Linux the child also asks to be killed when the supervisor dies (killed
    from outside, e.g. by the OOM killer), since nothing else could stop an answer stuck in C code.
    """
    supervisor_pid, caller_fd = supervisor
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, caller_fd)
    os.close(devnull)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
    except (OSError, AttributeError):  # not Linux: the caller's kill of the process group remains
        return
    if os.getppid() != supervisor_pid:  # the supervisor died before prctl took effect
        os._exit(1)


def _child_main(
    conn: Any,
    soft_timeout: float | None,
    memory_limit_mb: int | None,
    supervisor: tuple[int, int] | None = None,
) -> None:
    """Grading child: grade items in order, sending ``(index, verdict)`` after each.

    ``supervisor`` is ``(pid, fd of its connection to the caller)`` when the child was forked.
    """
    import signal

    if supervisor is not None:
        _detach_from_supervisor(supervisor)
    math_equivalence._install_eval_guard()
    _limit_memory(memory_limit_mb)
    use_alarm = soft_timeout is not None and hasattr(signal, "setitimer")

    def on_alarm(signum: int, frame: Any) -> None:
        raise _SoftTimeout()

    if use_alarm:
        signal.signal(signal.SIGALRM, on_alarm)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] != "grade":
            return
        for index, (pred, gold) in enumerate(message[1]):
            verdict = False
            refused_before = math_equivalence._REFUSED_COUNT
            try:
                try:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_REAL, soft_timeout)
                    verdict = math_equivalence._math_equal(pred, gold)
                finally:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_REAL, 0)
            except (_SoftTimeout, Exception, MemoryError, RecursionError):
                verdict = False
            refused = (
                math_equivalence._REFUSED[-1]
                if math_equivalence._REFUSED_COUNT > refused_before and math_equivalence._REFUSED
                else None
            )
            conn.send((index, verdict, refused))


class _Child:
    """The supervisor's handle on one grading child."""

    def __init__(
        self,
        ctx: Any,
        soft_timeout: float | None,
        memory_limit_mb: int | None,
        supervisor: tuple[int, int] | None,
    ) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main, args=(child_conn, soft_timeout, memory_limit_mb, supervisor), daemon=True
        )
        self.process.start()
        child_conn.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


def _supervisor_main(
    conn: Any,
    timeout_seconds: float,
    memory_limit_mb: int | None,
    interrupt_in_child: bool,
    num_workers: int,
) -> None:
    """Supervisor process: never grades itself, so it always answers; enforces per-answer deadlines.

    It hands answers one at a time to ``num_workers`` grading children, gives each answer
    ``timeout_seconds`` from the moment it is handed over, and kills and re-forks a child whose answer
    runs over (that answer scores False).
    """
    import math_verify  # noqa: F401  (imported before forking so children start warm)

    math_equivalence._install_eval_guard()
    methods = multiprocessing.get_all_start_methods()
    # Forking from this single-threaded process is safe and fast (sympy is already imported).
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    # SIGALRM in the child stops most slow answers cheaply (the child survives); answers stuck in C
    # code ignore it until the supervisor's deadline kills the child.
    soft_timeout = max(0.05, 0.75 * timeout_seconds) if interrupt_in_child else None
    # What a forked child must let go of (see _detach_from_supervisor); a spawned one inherits nothing.
    supervisor = (os.getpid(), conn.fileno()) if ctx.get_start_method() == "fork" else None
    pool = _Pool(lambda: _Child(ctx, soft_timeout, memory_limit_mb, supervisor), num_workers, timeout_seconds)
    if ctx.get_start_method() == "fork":
        pool.children[0] = pool.new_child()
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "grade":
                conn.send(("result", pool.grade(message[1])))
            elif message[0] == "info":
                info = {
                    "guard": math_equivalence._eval_guard_active(),
                    "kills": pool.kills,
                    "refusals": len(pool.refusals),
                }
                info.update(refused_samples=pool.refusals[:20], workers=num_workers, pid=os.getpid())
                conn.send(("info", info))
            else:
                break
    finally:
        for child in pool.children:
            if child is not None:
                child.kill()


class _Pool:
    """The supervisor's grading children: answers handed one at a time, each with ``timeout_seconds`` from the
    moment it is handed over; a child whose answer runs over (it scores False) or that dies is killed and replaced
    by a fresh one when next needed."""

    def __init__(self, new_child: Callable[[], _Child], num_workers: int, timeout_seconds: float) -> None:
        self.new_child, self.num_workers, self.timeout_seconds = new_child, num_workers, timeout_seconds
        self.children: list[_Child | None] = [None] * num_workers
        self.kills = 0
        self.refusals: list[str] = []

    def _replace(self, slot: int) -> None:
        """Kill the child in ``slot``; a fresh one is forked when the slot is next used."""
        self.children[slot].kill()  # type: ignore[union-attr]
        self.children[slot] = None
        self.kills += 1

    def grade(self, items: list[tuple[str, str]]) -> list[bool]:
        """Each ``(answer, gold)`` graded by a child within its deadline (False when it runs over)."""
        from multiprocessing.connection import wait

        results = [False] * len(items)
        todo = list(range(len(items) - 1, -1, -1))  # a stack, popped in order
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (item index, deadline)
        while todo or busy:
            for slot in range(self.num_workers):
                if slot in busy or not todo:
                    continue
                child = self.children[slot]
                if child is None or not child.process.is_alive():
                    child = self.children[slot] = self.new_child()
                index = todo.pop()
                child.conn.send(("grade", [items[index]]))
                busy[slot] = (index, time.monotonic() + self.timeout_seconds)
            now = time.monotonic()
            first_deadline = min(deadline for _, deadline in busy.values())
            conns = {self.children[slot].conn: slot for slot in busy}  # type: ignore[union-attr]
            for ready in wait(list(conns), timeout=max(0.0, first_deadline - now)):
                slot = conns[ready]
                index, _ = busy.pop(slot)
                try:
                    _, verdict, refused = ready.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):  # the child died (e.g. killed by the OS): replace it
                    self._replace(slot)
                    continue
                results[index] = verdict
                if refused is not None:
                    self.refusals.append(refused)
            now = time.monotonic()
            for slot, (_, deadline) in list(busy.items()):
                if now >= deadline:  # over budget: the answer scores False; replace the child
                    del busy[slot]
                    self._replace(slot)
        return results
