"""One WebSocket connection: parse, rate-limit and route what the game sends; write what the
NPCs say. Bad input gets a typed `Error` and the connection goes on, until too many
violations close it (1008)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import APIRouter
from starlette.websockets import WebSocket, WebSocketDisconnect

from mythic._errors import MythicError
from mythic.contracts import (
    Ack,
    AudioChunk,
    ClientMessage,
    Cutoff,
    Error,
    LLMStreamDelta,
    PlayerUtterance,
    ProtocolError,
    SceneAmbient,
    SceneEnd,
    SceneJoin,
    SceneLeave,
    SceneLine,
    SceneStart,
    ServerMessage,
    SessionEnd,
    SessionStart,
    TTSChunk,
    Welcome,
    dump_audio_frame,
    dump_message,
    error_message,
    is_audio_frame,
    parse_audio_frame,
    parse_client_message,
)
from mythic.dialogue import MailboxFullError, UnknownCallError, UnknownNPCError
from mythic.knowledge import GameDateError
from mythic.scenes import SceneError
from mythic.server._app import Gateway
from mythic.server._sessions import Session, SessionError
from mythic.voice import VoiceError

log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013
TAKEN_OVER = 4000


class _Bucket:
    """Token bucket: `rate` messages per second sustained, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


socket_routes = APIRouter()


@socket_routes.websocket("/v1/ws")
async def websocket(ws: WebSocket) -> None:
    """The v1 protocol: SessionStart first, then any client message for any NPC."""
    await ws.accept()
    await Connection(ws.app.state.gateway, ws).serve()


class Connection:
    """Serves one accepted WebSocket until it closes; owns its writer task. The gateway's
    `Link` to the session it serves."""

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        self.gateway = gateway
        self.ws = ws
        settings = gateway.settings.server
        self.max_frame_bytes = settings.max_frame_bytes
        self.max_violations = settings.max_violations
        self.bucket = _Bucket(settings.rate_per_s, settings.rate_burst)
        self.session: Session | None = None
        self.violations = 0
        self._limited_until = 0.0
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._close_code: int | None = None
        self._direct: list[Error | SessionEnd] = []
        """Answers sent before the connection has a session."""
        self._direct_ready = asyncio.Event()
        self._kicked = False

    async def serve(self) -> None:
        metrics = self.gateway.metrics
        metrics.connections += 1
        metrics.open_connections += 1
        try:
            async with asyncio.TaskGroup() as tasks:
                self._writer = tasks.create_task(self._write())
                self._reader = tasks.create_task(self._read_then_close())
            if self._kicked:
                with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                    await self.ws.close(self._close_code or TAKEN_OVER)
        finally:
            metrics.open_connections -= 1
            self._detach()

    async def _read_then_close(self) -> None:
        try:
            await self._read()
            if self._close_code is not None:
                await self._drain()
                with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                    await self.ws.close(self._close_code)
        finally:
            if self._writer is not None:
                self._writer.cancel()

    # -- reading ------------------------------------------------------------------------------

    async def _read(self) -> None:
        while self._close_code is None:
            try:
                frame = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if frame["type"] == "websocket.disconnect":
                return
            data = frame.get("text")
            if data is None:
                data = frame.get("bytes") or b""
            self.gateway.metrics.frames_in += 1
            if not self.bucket.take():
                self._refuse_rate()
                continue
            try:
                if isinstance(data, bytes) and is_audio_frame(data):
                    message: ClientMessage = parse_audio_frame(
                        data, side="client", max_bytes=self.max_frame_bytes
                    )  # type: ignore[assignment]
                else:
                    message = parse_client_message(data, max_bytes=self.max_frame_bytes)
            except ProtocolError as exc:
                self._violation(error_message(exc), exc.code)
                continue
            self.gateway.metrics.messages_in[message.type] += 1
            await self._handle(message)

    def _refuse_rate(self) -> None:
        now = time.monotonic()
        self.gateway.metrics.errors["rate_limited"] += 1
        self.violations += 1
        if now >= self._limited_until:
            # One notice per second, so a flood cannot make the server flood back.
            self._limited_until = now + 1.0
            self._send(
                Error(
                    code="rate_limited",
                    message=f"more than {self.bucket.rate:g} messages/s; slow down",
                    retryable=True,
                )
            )
        self._check_violations()

    def _violation(self, error: Error, code: str) -> None:
        self.gateway.metrics.errors[code] += 1
        self.violations += 1
        self._send(error)
        self._check_violations()

    def _check_violations(self) -> None:
        if self.violations >= self.max_violations and self._close_code is None:
            self._send(
                Error(
                    code="too_many_errors",
                    message=f"{self.violations} bad or refused messages; closing the connection",
                )
            )
            self._close_code = POLICY_VIOLATION

    def _fail(
        self,
        code: str,
        message: str,
        *,
        ref: str | None = None,
        turn_id: str | None = None,
        call_id: str | None = None,
        retryable: bool = False,
    ) -> None:
        error = Error(
            code=code,
            message=message[:500],
            ref=ref,
            turn_id=turn_id,
            call_id=call_id,
            retryable=retryable,
        )
        self._violation(error, code)

    async def _handle(self, message: ClientMessage) -> None:
        turn_id = getattr(message, "turn_id", None)
        match message:
            case SessionStart():
                await self._start(message)
                return
            case Error():
                log.info("client error %s: %s", message.code, message.message)
                return
        session = self.session
        if session is None:
            self._fail("no_session", "send SessionStart first", ref=message.type)
            return
        claimed = getattr(message, "session_id", session.id)
        if claimed != session.id:
            self._fail(
                "unknown_session",
                f"this connection is session {session.id!r}, not {claimed!r}",
                ref=f"{message.type}.session_id",
                turn_id=turn_id,
            )
            return
        match message:
            case SessionEnd():
                self.gateway.end_session(session)
                self.session = None
                self._send(SessionEnd(session_id=session.id, reason="ended by the client"))
                self._close_code = 1000
                return
            case AudioChunk():
                self._audio(session, message)
                return
            case Cutoff():
                if self.gateway.voice is not None:
                    self.gateway.voice.client_cutoff(session.id, message.npc_id, message.turn_id)
            case (
                SceneStart()
                | SceneJoin()
                | SceneLeave()
                | SceneEnd()
                | SceneLine()
                | SceneAmbient()
            ):
                self._scene(session, message)
                return
        if isinstance(message, PlayerUtterance):
            self.gateway.traces.begin(
                session.id, message.npc_id, message.turn_id, source="websocket"
            )
        try:
            self.gateway.cast.deliver(session.id, message, player_id=session.player_id)
        except UnknownNPCError as exc:
            self._fail("unknown_npc", exc.message, ref=f"{message.type}.npc_id", turn_id=turn_id)
        except UnknownCallError as exc:
            call_id = message.call_id if isinstance(message, Ack) else None
            self._fail("unknown_call", exc.message, ref="Ack.call_id", call_id=call_id)
        except MailboxFullError as exc:
            self._fail("npc_busy", exc.message, ref=message.type, turn_id=turn_id, retryable=True)
        except GameDateError as exc:
            self._fail(exc.code, exc.message, ref=f"{message.type}.date")
        except MythicError as exc:
            self._fail("refused", exc.message, ref=message.type, turn_id=turn_id)
        else:
            return
        if isinstance(message, PlayerUtterance):
            self.gateway.traces.end(session.id, message.npc_id, message.turn_id, error="refused")
            # A refused line still ends its turn, so a client waiting on it is released.
            session.push(
                LLMStreamDelta(
                    npc_id=message.npc_id,
                    session_id=session.id,
                    turn_id=message.turn_id,
                    seq=0,
                    delta="",
                    final=True,
                    finish_reason="error",
                )
            )

    def _scene(
        self,
        session: Session,
        message: SceneStart | SceneJoin | SceneLeave | SceneEnd | SceneLine | SceneAmbient,
    ) -> None:
        scenes, player = self.gateway.scenes, session.player_id
        try:
            match message:
                case SceneStart():
                    scenes.start(session.id, message, player_id=player)
                case SceneJoin():
                    scenes.join(session.id, message, player_id=player)
                case SceneLeave():
                    scenes.leave(session.id, message)
                case SceneEnd():
                    scenes.end(session.id, message)
                case SceneLine():
                    scenes.line(session.id, message, player_id=player)
                case SceneAmbient():
                    scenes.ambient(session.id, message, player_id=player)
        except SceneError as exc:
            ref = f"{message.type}.{exc.field}" if exc.field else message.type
            turn_id = message.turn_id if isinstance(message, SceneLine | SceneAmbient) else None
            self._fail(exc.code, exc.message, ref=ref, turn_id=turn_id, retryable=exc.retryable)

    def _audio(self, session: Session, chunk: AudioChunk) -> None:
        voice = self.gateway.voice
        if voice is None:
            self._fail(
                "voice_unavailable",
                "this server runs without speech (speech.enabled is false, or the speech "
                "extra is missing); send PlayerUtterance",
                ref="AudioChunk",
            )
            return
        try:
            voice.audio(session.id, chunk)
        except VoiceError as exc:
            self._fail(exc.code, exc.message, ref="AudioChunk", retryable=exc.code != "bad_audio")
        except UnknownNPCError as exc:
            self._fail("unknown_npc", exc.message, ref="AudioChunk.npc_id")

    async def _start(self, start: SessionStart) -> None:
        if self.session is not None:
            self._fail("session_started", "this connection already has a session")
            return
        if start.voice is not None and self.gateway.voice is None:
            self._fail(
                "voice_unavailable",
                "this server runs without speech (speech.enabled is false, or the speech "
                "extra is missing); start the session without voice",
                ref="SessionStart.voice",
            )
            return
        try:
            if start.session_id is not None and start.resume_token is not None:
                session = self.gateway.sessions.resume(start.session_id, start.resume_token)
                resumed = True
            else:
                session = self.gateway.sessions.open(start.player_id)
                resumed = False
        except SessionError as exc:
            self._fail(exc.code, exc.message, ref="SessionStart", retryable=exc.retryable)
            return
        self.gateway.attach(session, self)
        self.session = session
        if start.voice is not None and self.gateway.voice is not None:
            self.gateway.voice.open_session(session.id, start.voice, session.player_id)
            session.binary_audio = start.voice.binary
        welcome = Welcome(
            session_id=session.id,
            resume_token=session.resume_token,
            max_frame_bytes=self.max_frame_bytes,
            resumed=resumed,
        )
        # Welcome goes before anything that waited for the resume.
        session.outbox.appendleft(welcome)
        session.ready.set()
        self._direct_ready.set()

    # -- writing ------------------------------------------------------------------------------

    def _send(self, message: Error | SessionEnd) -> None:
        """Answer on this connection (before a session exists, too)."""
        if self.session is not None:
            self.session.push(message)
        else:
            self._direct.append(message)
            self._direct_ready.set()

    async def _write(self) -> None:
        metrics = self.gateway.metrics
        while True:
            if self._direct:
                batch: list[ServerMessage] = list(self._direct)
                self._direct = []
                for message in batch:
                    await self._send_frame(message)
                continue
            session = self.session
            if session is not None and session.outbox:
                message = session.outbox.popleft()
                await self._send_frame(message)
                metrics.messages_out[message.type] += 1
                continue
            # Nothing to send: sleep until an answer or an NPC's message is queued, or the
            # connection gets its session (`_start` sets `_direct_ready`).
            self._direct_ready.clear()
            waiters = [asyncio.ensure_future(self._direct_ready.wait())]
            if session is not None:
                session.ready.clear()
                waiters.append(asyncio.ensure_future(session.ready.wait()))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    async def _send_frame(self, message: ServerMessage) -> None:
        try:
            session = self.session
            if isinstance(message, TTSChunk) and session is not None and session.binary_audio:
                await self.ws.send_bytes(dump_audio_frame(message))
            else:
                await self.ws.send_text(dump_message(message))
        except (WebSocketDisconnect, RuntimeError, OSError):
            # The client is gone: stop reading too.
            if self._reader is not None:
                self._reader.cancel()
            raise asyncio.CancelledError from None

    async def _drain(self) -> None:
        """Stop the writer and send the last answers (an Error, a SessionEnd) ourselves."""
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        pending: list[ServerMessage] = list(self._direct)
        if self.session is not None:
            pending += self.session.outbox
            self.session.outbox.clear()
        self._direct = []
        with contextlib.suppress(TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
            async with asyncio.timeout(1.0):
                for message in pending:
                    await self.ws.send_text(dump_message(message))

    def taken_over(self) -> None:
        """Another connection resumed this one's session."""
        self.session = None
        self._kick(TAKEN_OVER)

    def too_slow(self) -> None:
        """The client does not read fast enough: its session's outbox overflowed."""
        self._kick(TRY_AGAIN_LATER)

    def _kick(self, code: int) -> None:
        self._close_code = code
        if self._reader is not None:
            self._reader.cancel()
        if self._writer is not None:
            self._writer.cancel()
        self._kicked = True

    def _detach(self) -> None:
        if self.session is not None:
            self.gateway.detach(self.session, self)
            self.session = None
