"""The sessions of :mod:`mcadvantage.envs.openenv_client`: one OpenEnv WebSocket session (synchronous, every wait
with a timeout), and the bounded pool an environment class's instances share (``env_max_sessions``): the batch's
episodes and every Monte Carlo continuation lease sessions from it, and an instance whose session went to another is
rebuilt by replay when it acts again, so the open sessions never grow with batch x K."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__: list[str] = []  # private to mcadvantage.envs.openenv_client


class _Refused(RuntimeError):
    """An error message from the server (``{"type": "error", "data": {"message", "code"}}``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(f"{message} (code: {code})")
        self.code = code


class _Session:
    """One OpenEnv WebSocket session (``/ws``), synchronous, with a timeout on the handshake and on every reply.

    openenv-core's ``GenericEnvClient.sync()`` speaks the same protocol, but importing ``openenv.core`` costs
    seconds (it loads gradio) and each sync client runs its own event-loop thread; an episode needs neither, so the
    four messages (reset, step, state, close) go through ``websockets``' synchronous client directly.
    """

    def __init__(self, url: str, connect_timeout_s: float, message_timeout_s: float) -> None:
        from websockets.sync.client import connect

        ws_url = "ws" + url[len("http") :] if url.startswith("http") else url
        self._ws = connect(f"{ws_url}/ws", open_timeout=connect_timeout_s, close_timeout=1.0, max_size=2**27)
        self._timeout = message_timeout_s

    def request(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(json.dumps({"type": kind, "data": data} if kind != "state" else {"type": kind}))
        except ConnectionClosed:
            pass  # a server that refused the session sent why before closing: read it below
        reply = json.loads(self._ws.recv(timeout=self._timeout))
        if reply.get("type") == "error":
            error = reply.get("data", {})
            raise _Refused(str(error.get("message", "unknown error")), str(error.get("code", "UNKNOWN")))
        return reply.get("data", {})

    def close(self) -> None:
        try:
            self._ws.send(json.dumps({"type": "close"}))
        finally:
            self._ws.close()


class _SessionPool:
    """At most ``limit`` open sessions for the instances of one environment class.

    Every request runs under the pool's lock with a session leased to its instance (:meth:`lease`): the instance's
    own, a free one, a new one while fewer than ``limit`` are open, or else the least recently used instance's,
    which is parked (its ``_client`` dropped, its state kept client-side) and rebuilt by replay when it acts again.
    """

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.lock = threading.RLock()
        self.holders: OrderedDict[int, Any] = OrderedDict()  # id(instance) -> instance, least recent first
        self.free: list[_Session] = []

    def open_sessions(self) -> int:
        """Sessions open now: the holders' and the free ones."""
        return len(self.holders) + len(self.free)

    def lease(self, owner: Any, opener: Callable[[], _Session]) -> tuple[_Session, bool]:
        """``(session, fresh)``: ``owner``'s session (marked most recently used), else one for it; ``fresh`` when
        it was not ``owner``'s (the owner must reset or rebuild on it before use)."""
        if owner._client is not None:
            self.holders.move_to_end(id(owner))
            return owner._client, False
        while self.open_sessions() > self.limit and self.free:
            _close_quietly(self.free.pop())  # the limit was lowered: close what is over it
        if self.free:
            session = self.free.pop()
        elif self.open_sessions() < self.limit or not self.holders:
            session = opener()
        else:
            _, parked = self.holders.popitem(last=False)
            session, parked._client = parked._client, None
            while self.open_sessions() >= self.limit and self.holders:  # the limit was lowered: park more
                _, extra = self.holders.popitem(last=False)
                _close_quietly(extra._client)
                extra._client = None
        owner._client = session
        self.holders[id(owner)] = owner
        return session, True

    def close_all(self) -> None:
        """Close every session (the holders' too: they are rebuilt by replay if they act again)."""
        while self.holders:
            _, owner = self.holders.popitem()
            _close_quietly(owner._client)
            owner._client = None
        while self.free:
            _close_quietly(self.free.pop())

    def release(self, owner: Any, *, keep: bool) -> None:
        """Take ``owner``'s session back: kept open for the next lease (``keep``), or closed (a broken session)."""
        session, owner._client = owner._client, None
        self.holders.pop(id(owner), None)
        if session is None:
            return
        if keep and self.open_sessions() < self.limit:
            self.free.append(session)
        else:
            _close_quietly(session)


def _close_quietly(session: _Session | None) -> None:
    """Close a session, ignoring a session already gone."""
    if session is not None:
        try:
            session.close()
        except Exception:  # the session is gone either way
            pass
