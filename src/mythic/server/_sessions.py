"""Sessions of the gateway: who is connected, what waits to be sent, and resuming after a
disconnect."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable

from mythic._errors import MythicError
from mythic.contracts import ServerMessage


class SessionError(MythicError):
    """A session cannot be opened or resumed; `code` is the wire Error code."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class Session:
    """One game client's session: its outgoing messages and, while connected, its reader.

    Messages queue in `outbox` for the connection's writer; while disconnected they wait for a
    resume, the oldest dropped beyond `outbox_size`. HTTP callers add `listeners` instead
    (one per turn in flight).
    """

    def __init__(self, session_id: str, player_id: str | None, outbox_size: int) -> None:
        self.id = session_id
        self.player_id = player_id
        self.resume_token = secrets.token_urlsafe(24)
        self.outbox: deque[ServerMessage] = deque()
        self.outbox_size = outbox_size
        self.ready = asyncio.Event()
        self.connected = False
        self.overflowed = False
        self.detached_at: float | None = None
        self.listeners: list[Callable[[ServerMessage], None]] = []
        self.on_overflow: Callable[[], None] | None = None
        self.binary_audio = False
        """Send `TTSChunk`s as binary audio frames (the session's `VoiceFormat.binary`)."""

    def push(self, message: ServerMessage) -> None:
        if self.listeners:
            for listener in list(self.listeners):
                listener(message)
            return
        if len(self.outbox) >= self.outbox_size:
            if self.connected:
                # The client does not read fast enough: its connection is closed, the session
                # kept for a resume.
                self.overflowed = True
                if self.on_overflow is not None:
                    self.on_overflow()
                return
            self.outbox.popleft()
        self.outbox.append(message)
        self.ready.set()


class Sessions:
    """The sessions held, connected or waiting to be resumed."""

    def __init__(self, *, max_sessions: int, resume_ttl_s: float, outbox_size: int) -> None:
        self.max_sessions = max_sessions
        self.resume_ttl_s = resume_ttl_s
        self.outbox_size = outbox_size
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def open(
        self, player_id: str | None, *, prefix: str = "s", session_id: str | None = None
    ) -> Session:
        """A new session, named `session_id` or a fresh id starting with `prefix`.

        Raises:
            SessionError: `too_many_sessions` when the server holds its maximum.
        """
        if len(self._sessions) >= self.max_sessions:
            raise SessionError(
                "too_many_sessions",
                f"the server holds {self.max_sessions} sessions; try again later",
                retryable=True,
            )
        session_id = session_id or f"{prefix}-{uuid.uuid4().hex[:20]}"
        session = Session(session_id, player_id, self.outbox_size)
        self._sessions[session.id] = session
        return session

    def resume(self, session_id: str, token: str) -> Session:
        """The session to resume, if the token matches.

        Raises:
            SessionError: `unknown_session` (expired, ended, never existed, or a wrong token).
        """
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.resume_token, token):
            raise SessionError(
                "unknown_session",
                f"no session {session_id!r} to resume (it expired, ended, or the token is wrong)",
            )
        return session

    def remove(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    def expired(self, now: float | None = None) -> list[Session]:
        """Disconnected sessions past their resume window, removed."""
        now = time.monotonic() if now is None else now
        gone = [
            s
            for s in self._sessions.values()
            if not s.connected
            and s.detached_at is not None
            and now - s.detached_at >= self.resume_ttl_s
        ]
        for session in gone:
            del self._sessions[session.id]
        return gone

    def send(self, session_id: str, message: ServerMessage) -> None:
        """The `Outbox` of the cast: a message for a session that is gone is dropped."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.push(message)
