"""MathVerifier's grading process, from the caller's side: start it, send it answers, restart it.

Why the MATH verifier uses a worker process: math-verify bounds its own time with
``signal.alarm``, which only works on the main thread, and some inputs (``9^{9^{9^9}}``, huge
factorials) hang inside C code where no Python-level timeout can interrupt them. Equivalence checks
therefore run in a small supervisor process that forks one grading child and kills and re-forks it
when an answer exceeds its time budget (:mod:`mcadvantage.tasks.supervisor`). The per-answer bound then holds
in any thread of the caller, and restarting costs a fork, not a fresh import of sympy. Cheap cases (identical
strings, plain numbers) are decided in-process first (:mod:`mcadvantage.tasks.math_equivalence`). The
supervisor is a fresh interpreter started with :mod:`subprocess` that runs only
:mod:`mcadvantage.tasks._grading_worker` (see there why): multiprocessing's ``spawn`` would re-run the
caller's ``__main__`` (a script without a main guard crashed) and ``fork`` is unsafe in a multi-threaded
trainer.

``_GradingService`` is the caller's handle on one such process (thread-safe, started lazily, restarted when it
dies or hangs); ``_service_for`` shares one per set of limits between verifiers. At interpreter exit the
processes are closed; a forked child of the caller forgets its parent's.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
import threading
from typing import Any

logger = logging.getLogger(__name__)


# Directory holding the imported ``mcadvantage`` package: the grading process imports the same copy
# (it may come from a sys.path entry the caller added at run time, or a source checkout).
# This file is <root>/mcadvantage/tasks/grading.py.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _StderrTail:
    """Forwards the grading process' stderr to ours and keeps its tail, to name a start-up failure.

    A thread rather than an inherited stderr because a process that dies before it can report (a broken
    interpreter, a missing package) leaves its reason only there. It writes with ``os.write`` on fd 2,
    where an inherited stderr would have written, and so takes none of ``sys.stderr``'s locks (a daemon
    thread holding them at interpreter exit can abort the interpreter).
    """

    _KEEP = 4096  # bytes of tail kept for the error message

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._tail = b""
        self._thread = threading.Thread(target=self._run, name="mcadvantage-grader-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                self._tail = (self._tail + chunk)[-self._KEEP :]
                try:
                    os.write(2, chunk)
                except OSError:  # no stderr to forward to: keep only the tail
                    pass
        except OSError:
            pass
        finally:
            os.close(self._fd)

    def last_line(self, wait: float) -> str:
        """The last non-empty line written, after waiting up to ``wait`` s for the stream to end."""
        self._thread.join(wait)
        lines = [line.strip() for line in self._tail.decode(errors="replace").splitlines()]
        return next((line for line in reversed(lines) if line), "")[:300]

    def join(self, wait: float) -> None:
        self._thread.join(wait)


#: Seconds a grading call waits beyond its answers' own budgets before it gives the grading process up for hung
#: (stopped, or stuck outside its children), kills it and retries the call once in a fresh one.
_BACKSTOP_SLACK_SECONDS = 30.0


class _GradingService:
    """Parent-side client of the supervisor process; thread-safe, started lazily, restarted on failure."""

    def __init__(
        self,
        timeout_seconds: float,
        memory_limit_mb: int | None,
        startup_timeout: float,
        interrupt_in_child: bool,
        num_workers: int,
        python_executable: str | None,
    ) -> None:
        self.num_workers = num_workers
        self.timeout_seconds = timeout_seconds
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout = startup_timeout
        self.interrupt_in_child = interrupt_in_child
        self.python_executable = python_executable
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Any = None
        self._stderr: _StderrTail | None = None

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _start(self) -> None:
        """Start the grading process and wait until it is ready (or raise why it is not)."""
        executable = self._executable()
        self._spawn(executable)
        self._handshake(executable)

    def _executable(self) -> str:
        """The Python that runs the grading process; refused where it cannot run."""
        if os.name != "posix":
            raise RuntimeError(
                "MathVerifier's grading process needs a POSIX system (Linux or macOS): it hands a socket "
                f"to a subprocess and forks grading children, which {sys.platform!r} cannot. On Windows "
                "run under WSL."
            )
        executable = self.python_executable or sys.executable
        if not executable:
            raise RuntimeError(
                "MathVerifier cannot start its grading process: sys.executable is empty (embedded "
                "Python?). Pass MathVerifier(python_executable=...) the path of a Python interpreter "
                "that has mcadvantage and math-verify installed."
            )
        return executable

    def _spawn(self, executable: str) -> None:
        """Start the process with one end of a socket pair (no listening address; it sees end-of-file as soon as
        this process exits or dies) and its stderr on a pipe."""
        from multiprocessing.connection import Connection

        from mcadvantage.tasks._grading_worker import BOOTSTRAP

        parent_sock, child_sock = socket.socketpair()
        err_read, err_write = os.pipe()
        try:
            process = subprocess.Popen(
                [executable, "-c", BOOTSTRAP, _PACKAGE_ROOT, str(child_sock.fileno())],
                stdin=subprocess.DEVNULL,
                stderr=err_write,
                pass_fds=(child_sock.fileno(),),
                # Its own session: a Ctrl-C in the terminal interrupts the caller, not the grader; the
                # grader still exits when the caller does (end-of-file on the socket).
                start_new_session=True,
            )
        except OSError as exc:
            parent_sock.close()
            os.close(err_read)
            raise RuntimeError(
                f"MathVerifier cannot start its grading process with python_executable={executable!r}: "
                f"{exc.strerror or exc}. Pass python_executable= the path of a Python interpreter that "
                "has mcadvantage and math-verify installed."
            ) from None
        finally:
            child_sock.close()
            os.close(err_write)
        self._process, self._conn, self._stderr = (
            process,
            Connection(parent_sock.detach()),
            _StderrTail(err_read),
        )

    def _handshake(self, executable: str) -> None:
        """Send the settings and wait for ``ready``; otherwise stop the process and raise why it did not start."""
        process, conn = self._process, self._conn
        settings = {
            "sys_path": list(sys.path),
            "timeout_seconds": self.timeout_seconds,
            "memory_limit_mb": self.memory_limit_mb,
            "interrupt_in_child": self.interrupt_in_child,
            "num_workers": self.num_workers,
        }
        message: Any = None
        try:
            conn.send(settings)
            if conn.poll(self.startup_timeout):
                message = conn.recv()
        except (EOFError, OSError):  # it exited before answering; its stderr says why
            message = ("exited",)
        except BaseException:  # interrupted (Ctrl-C): an unread "ready" would answer the next request
            self._stop(graceful=False)
            raise
        if message is not None and message[0] == "ready":
            return
        stderr = self._stderr
        if message is not None:  # it reported an error or closed the socket: let it finish exiting
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._stop(graceful=False)
        if message is None:
            raise RuntimeError(
                f"MathVerifier's grading process ({executable}) did not start within "
                f"{self.startup_timeout} s; check that `{executable} -c 'import math_verify'` works, or "
                "raise MathVerifier(startup_timeout=...) on a slow file system."
            )
        if message[0] == "error":  # the process reported the exception itself
            cause = message[1]
        else:  # it died before it could: its last line of stderr is the best explanation
            line = stderr.last_line(2.0) if stderr is not None else ""
            cause = f"it exited with code {process.returncode}" + (f" ({line})" if line else "")
        raise RuntimeError(
            f"MathVerifier's grading process ({executable}) failed to start: {cause}. Check that "
            f"`{executable} -c 'import mcadvantage, math_verify'` works, or pass "
            "MathVerifier(python_executable=...) a Python interpreter that has both installed."
        )

    def _stop(self, graceful: bool = True) -> None:
        process, conn, stderr = self._process, self._conn, self._stderr
        if process is None:
            return
        self._process = self._conn = self._stderr = None
        if graceful:
            try:
                conn.send(("close",))
            except (OSError, ValueError):
                pass
        try:
            process.wait(2 if graceful else 0.2)
        except subprocess.TimeoutExpired:
            # Kill its whole process group (its own session, see _start): a grading child stuck in C
            # code would otherwise outlive the supervisor. Not yet reaped, so the group id is still ours.
            try:
                os.killpg(process.pid, 9)  # SIGKILL (signal.SIGKILL is missing on Windows)
            except OSError:
                process.kill()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:  # unkillable (e.g. stuck in the kernel): stop waiting
                pass
        conn.close()
        if stderr is not None:
            stderr.join(1.0)

    def _request(self, message: tuple[Any, ...], backstop: float) -> Any:
        for attempt in range(2):
            if not self._alive():
                self._stop(graceful=False)
                self._start()
            try:
                self._conn.send(message)
                if self._conn.poll(backstop):
                    return self._conn.recv()[1]
            except (EOFError, OSError):
                pass
            except BaseException:
                # Interrupted between request and answer (e.g. KeyboardInterrupt): the answer would
                # arrive as the reply to the next request, so drop this process; the next call restarts.
                self._stop(graceful=False)
                raise
            # The supervisor only waits on its children, so this is a should-never-happen path.
            logger.warning("math grading process stopped answering (attempt %d); restarting", attempt + 1)
            self._stop(graceful=False)
        return None

    def grade(self, items: list[tuple[str, str]]) -> list[bool]:
        if not items:
            return []
        with self._lock:
            backstop = _BACKSTOP_SLACK_SECONDS + len(items) * (self.timeout_seconds + 1.0) / self.num_workers
            results = self._request(("grade", items), backstop)
        return list(results) if results is not None else [False] * len(items)

    def info(self) -> dict[str, Any]:
        with self._lock:
            return self._request(("info",), 30.0) or {}

    def warmup(self) -> None:
        with self._lock:
            if not self._alive():
                self._stop(graceful=False)
                self._start()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's grading process without touching it.

        The child inherited the lock (possibly held by a parent thread that does not exist here) and a
        copy of the parent's socket; using that socket would interleave both processes' requests and
        answers. The child gets a fresh lock and starts its own grading process when it needs one.
        """
        self._lock = threading.Lock()
        if self._conn is not None:
            self._conn.close()  # closes this process' copy of the descriptor only
        if self._process is not None:
            # Kept referenced: collecting the Popen would try to reap a process that is not our child.
            _INHERITED_PROCESSES.append(self._process)
        self._process = self._conn = self._stderr = None


# (timeout_seconds, memory_limit_mb, startup_timeout, interrupt_in_child, num_workers, python_executable)
_SERVICES: dict[tuple[Any, ...], _GradingService] = {}
_SERVICES_LOCK = threading.Lock()
_INHERITED_PROCESSES: list[Any] = []


def _service_for(
    timeout_seconds: float,
    memory_limit_mb: int | None,
    startup_timeout: float,
    interrupt_in_child: bool,
    num_workers: int,
    python_executable: str | None,
) -> _GradingService:
    # Verifiers with the same limits share one grading process (TRL may build several reward funcs).
    key = (
        timeout_seconds,
        memory_limit_mb,
        startup_timeout,
        interrupt_in_child,
        num_workers,
        python_executable,
    )
    with _SERVICES_LOCK:
        service = _SERVICES.get(key)
        if service is None:
            service = _SERVICES[key] = _GradingService(*key)
        return service


@atexit.register
def _close_services() -> None:
    # Ask each grading process to finish (it would also exit on end-of-file once we are gone, but an
    # orderly close reaps it and its grading children before the interpreter exits).
    for service in list(_SERVICES.values()):
        service.close()


def _after_fork_in_child() -> None:
    global _SERVICES_LOCK
    _SERVICES_LOCK = threading.Lock()
    for service in _SERVICES.values():
        service.forget_after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
