"""An async, typed, reconnecting client of the v1 protocol."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from mythic._errors import MythicError
from mythic._extras import require
from mythic.client._scene import Scene, SceneTalk
from mythic.contracts import (
    Ack,
    ASRFinal,
    ASRPartial,
    AudioChunk,
    ClientMessage,
    Cutoff,
    Error,
    IntentRequest,
    IntentUpdate,
    LLMStreamDelta,
    PlayerUtterance,
    ProtocolError,
    SceneEnd,
    SceneJoin,
    SceneObject,
    SceneStart,
    SceneState,
    SceneTurn,
    SceneUpdate,
    ServerMessage,
    SessionEnd,
    SessionStart,
    ToolCall,
    TTSChunk,
    VoiceFormat,
    Welcome,
    dump_audio_frame,
    dump_message,
    is_audio_frame,
    parse_audio_frame,
    parse_server_message,
)

log = logging.getLogger(__name__)

ToolHandler = Callable[[ToolCall], Awaitable["ToolResult"]]
"""Runs a tool call in the game; returns the Ack's status and optional result."""

ToolResult = tuple[Literal["ok", "error", "rejected"], dict[str, Any] | None]
TurnEvent = LLMStreamDelta | ToolCall | Cutoff | Error
_ToolAnswer = tuple[Literal["ok", "error", "rejected"], dict[str, Any] | None, str | None]
_TOOL_ANSWERS = 256


class ClientError(MythicError):
    """The server refused something (an `Error` it sent), or the client cannot go on."""

    def __init__(self, message: str, *, error: Error | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.retryable = bool(error and error.retryable)


class ConnectionLostError(ClientError):
    """The connection is gone: it dropped while a turn was in flight (the client resumes the
    session unless it is closed), or the client is closed (`disconnect`, `aclose`, or it gave
    up reconnecting) and sends nothing until `connect` opens it again."""

    retryable = True


def reply_text(deltas: list[LLMStreamDelta]) -> str:
    """A turn's reply text: its deltas joined, with a space between the reply and the words
    that voice a tool's result after it (the stream's segments, split by a `tool_call` final
    delta), where neither side has one."""
    text = ""
    gap = False
    for d in deltas:
        if gap and text and d.delta and not text[-1].isspace() and not d.delta[0].isspace():
            text += " "
        text += d.delta
        if d.delta or d.final:
            gap = d.final and d.finish_reason == "tool_call"
    return text


class Turn:
    """One player line and everything the NPC sends back for it, in order."""

    def __init__(self, client: MythicClient, npc_id: str, turn_id: str) -> None:
        self.client = client
        self.npc_id = npc_id
        self.turn_id = turn_id
        self.deltas: list[LLMStreamDelta] = []
        self.tool_calls: list[ToolCall] = []
        self.errors: list[Error] = []
        self.finish_reason: str | None = None
        self._queue: asyncio.Queue[TurnEvent | BaseException] = asyncio.Queue()
        self._done = False

    @property
    def text(self) -> str:
        """The reply text received so far."""
        return reply_text(self.deltas)

    def _put(self, item: TurnEvent | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[TurnEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TurnEvent]:
        while not self._done:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self._done = True
                self.client._turns.pop(self.turn_id, None)
                raise item
            match item:
                case LLMStreamDelta():
                    self.deltas.append(item)
                    if item.final and item.finish_reason != "tool_call":
                        self.finish_reason = item.finish_reason
                        self._done = True
                        self.client._turns.pop(self.turn_id, None)
                case ToolCall():
                    self.tool_calls.append(item)
                case Error():
                    self.errors.append(item)
            yield item

    async def reply(self) -> str:
        """Wait for the end of the turn; the whole reply text (tool calls are answered by the
        client's tool handler, if it has one)."""
        async for _ in self:
            pass
        return self.text

    async def cutoff(self) -> None:
        """Stop the NPC (barge-in); the turn ends with finish_reason `cutoff`."""
        await self.client.send(
            Cutoff(npc_id=self.npc_id, session_id=self.client.session_id, turn_id=self.turn_id)
        )


class VoiceTurn:
    """One spoken line to an NPC and everything that comes back for it.

    The client picks the turn's id and sends it with the audio; if the audio holds no words
    (noise, a cough) nothing comes back and `wait` times out. `partials` are the captions
    while the player spoke, `transcript` what the server heard, `deltas` the reply's text,
    `chunks` its audio (`pcm`, at `sample_rate`) with visemes. `cutoff` is set when the NPC
    was cut off. The `*_at` marks are `time.perf_counter()` on this client, for latency.
    """

    def __init__(self, npc_id: str, turn_id: str) -> None:
        self.npc_id = npc_id
        self.turn_id = turn_id
        self.partials: list[str] = []
        self.transcript: str | None = None
        self.deltas: list[LLMStreamDelta] = []
        self.chunks: list[TTSChunk] = []
        self.tool_calls: list[ToolCall] = []
        """The game tools the NPC called in its reply: the client's `tool_handler` answers
        them, or `MythicClient.ack` where it has none."""
        self.errors: list[Error] = []
        self.cutoff: Cutoff | None = None
        self.speech_end_at: float | None = None
        """When the last audio of the line was sent (before any trailing silence)."""
        self.heard_at: float | None = None
        self.first_delta_at: float | None = None
        self.first_audio_at: float | None = None
        self.heard = asyncio.Event()
        """Set when the final transcript (or an error for the line) arrived."""
        self.replied = asyncio.Event()
        """Set when the reply's text is complete."""
        self.spoken = asyncio.Event()
        """Set when the reply's last audio chunk arrived, or the NPC was cut off."""

    @property
    def text(self) -> str:
        """The reply text received so far."""
        return reply_text(self.deltas)

    @property
    def pcm(self) -> bytes:
        """The reply's audio so far, joined."""
        return b"".join(c.pcm for c in self.chunks)

    @property
    def sample_rate(self) -> int | None:
        return self.chunks[0].sample_rate if self.chunks else None

    async def wait(self, timeout_s: float = 60.0, *, quiet_s: float = 5.0) -> VoiceTurn:
        """Wait until the reply has been spoken (its final chunk, or a cut-off), or its text
        is done and no audio came for `quiet_s` (a reply with nothing to say).

        Raises:
            TimeoutError: not done within `timeout_s`.
        """
        async with asyncio.timeout(timeout_s):
            await self.replied.wait()
            while not self.spoken.is_set():
                last = len(self.chunks)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(quiet_s):
                        await self.spoken.wait()
                if len(self.chunks) == last:
                    break
        return self

    def _route(self, message: ServerMessage) -> None:
        now = time.perf_counter()
        match message:
            case ASRPartial():
                self.partials.append(message.text)
            case ASRFinal():
                self.transcript, self.heard_at = message.text, now
                self.heard.set()
            case LLMStreamDelta():
                if self.first_delta_at is None:
                    self.first_delta_at = now
                self.deltas.append(message)
                if message.final and message.finish_reason != "tool_call":
                    self.replied.set()
                    if message.finish_reason in ("cutoff", "error"):
                        self.spoken.set()
            case ToolCall():
                self.tool_calls.append(message)
            case TTSChunk():
                if self.first_audio_at is None:
                    self.first_audio_at = now
                self.chunks.append(message)
                if message.final:
                    self.spoken.set()
            case Cutoff():
                self.cutoff = message
                self.replied.set()
                self.spoken.set()
            case Error():
                self.errors.append(message)
                if self.transcript is None:
                    self.heard.set()


class MythicClient:
    """A game's connection to a Mythic server.

        async with MythicClient("ws://127.0.0.1:8765/v1/ws") as client:
            turn = await client.say("marla", "Is the tavern open?")
            async for event in turn:
                ...                           # LLMStreamDelta, ToolCall, Error, Cutoff
            print(turn.text)

    The client reconnects by itself with backoff and resumes its session (the NPCs keep their
    history); turns in flight when the connection drops end with `ConnectionLostError`. It
    tries `max_reconnects` times within `max_reconnect_s`, then gives up: it is `closed`, and
    what waited for the connection ends with `ConnectionLostError`. `disconnect` closes the
    connection and keeps the session for `connect` to resume; `aclose` ends it. With a
    `tool_handler` it answers every `ToolCall` with an `Ack`, running the handler once per
    `call_id` (a call sent again is acknowledged `duplicate`); without one, call `ack`.
    Messages that belong to no turn (NPC states, pushed intents, errors) go to `events`.

    With `voice`, the session talks by voice: `talk` streams a line of microphone audio to
    an NPC and returns a `VoiceTurn` with the captions, the transcript, the reply and its
    audio; `send_audio` sends raw chunks (a game's own microphone loop).
    """

    def __init__(
        self,
        url: str,
        *,
        player_id: str | None = None,
        tool_handler: ToolHandler | None = None,
        reconnect: bool = True,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        max_reconnects: int = 10,
        max_reconnect_s: float | None = 120.0,
        timeout_s: float = 30.0,
        max_frame_bytes: int = 4 * 1024 * 1024,
        max_events: int = 1024,
        voice: VoiceFormat | None = None,
    ) -> None:
        self._ws_client = require("websockets.asyncio.client", package="websockets", extra="client")
        self.url = url
        self.player_id = player_id
        self.tool_handler = tool_handler
        self.reconnect = reconnect
        """Reconnect and resume the session when the connection drops; without it a drop
        closes the client."""
        self.backoff_s = backoff_s
        """The first wait before reconnecting, doubled after each failed try up to
        `max_backoff_s`."""
        self.max_backoff_s = max_backoff_s
        self.max_reconnects = max_reconnects
        """Tries to reconnect after a drop before the client gives up and is closed."""
        self.max_reconnect_s = max_reconnect_s
        """The bound on all the tries after one drop, waits included (None: only
        `max_reconnects` and each try's `timeout_s` bound them)."""
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.session_id = ""
        self.resume_token: str | None = None
        self.resumes = 0
        """How many times the session was resumed after a dropped connection."""
        self.events: asyncio.Queue[ServerMessage] = asyncio.Queue(max_events)
        """Messages of no turn: NPC states, pushed intents, errors. Bounded: when nobody reads
        it, the oldest are dropped."""
        self.voice = voice
        self._turns: dict[str, Turn] = {}
        self._scenes: dict[str, Scene] = {}
        self._scene_talks: dict[str, SceneTalk] = {}
        """The open scene talk of each line and reply turn id."""
        self._scene_calls: list[tuple[str, Scene, asyncio.Future[None]]] = []
        """Scene messages waiting for the server: the message type, the scene, done when the
        scene's state (or end) comes back, failed by an `Error` whose ref names the type."""
        self._voice_turns: dict[str, VoiceTurn] = {}
        self._intents: dict[str, asyncio.Future[IntentUpdate]] = {}
        self._ws: Any = None
        self._connected = asyncio.Event()
        """Set while a connection is open, and once the client is closed: its waiters wake and
        find no connection is coming."""
        self._welcome: asyncio.Future[Welcome] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tool_answers: OrderedDict[str, asyncio.Future[_ToolAnswer]] = OrderedDict()
        """The tool handler's answer by call_id, the last `_TOOL_ANSWERS` calls."""
        self._reader: asyncio.Task[None] | None = None
        self._stopped: str | None = None
        """Why the client is closed; None while it is connected or reconnecting."""

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the client stopped: after `disconnect` or `aclose`, or when reconnecting
        gave up. It sends nothing and does not reconnect until `connect` opens it again."""
        return self._stopped is not None

    async def connect(self) -> Welcome:
        """Connect and open the session, or resume it (after `disconnect`, or after
        reconnecting gave up: the NPCs keep their history while the server keeps the session).

        Raises:
            ClientError: the server refused the session (`unknown_session`: it expired).
            OSError, TimeoutError: the server cannot be reached.
        """
        if self._reader is not None and not self._reader.done():
            raise ClientError("the client is connected already")
        self._stopped = None
        self._connected.clear()
        try:
            async with asyncio.timeout(self.timeout_s):
                welcome = await self._open()
        except BaseException:
            self._stop(f"cannot connect to {self.url}")
            raise
        self._reader = asyncio.create_task(self._read_forever())
        return welcome

    async def _open(self) -> Welcome:
        self._ws = ws = await self._ws_client.connect(
            self.url, max_size=self.max_frame_bytes, open_timeout=self.timeout_s
        )
        try:
            message = await self._start_session(ws)
        except BaseException:
            ws.transport.abort()  # a half-open connection is not left behind
            raise
        self.session_id, self.resume_token = message.session_id, message.resume_token
        if message.resumed:
            self.resumes += 1
        self._connected.set()
        return message

    async def _start_session(self, ws: Any) -> Welcome:
        resume = self.resume_token is not None
        start = SessionStart(
            player_id=self.player_id,
            session_id=self.session_id if resume else None,
            resume_token=self.resume_token,
            voice=self.voice,
        )
        await ws.send(dump_message(start))
        while True:
            message = parse_server_message(await ws.recv())
            if isinstance(message, Welcome):
                return message
            if isinstance(message, Error):
                raise ClientError(f"{message.code}: {message.message}", error=message)
            self._route(message)

    async def disconnect(self) -> None:
        """Close the connection without ending the session: no `SessionEnd` is sent and the
        client does not reconnect. The server keeps the session for its resume window, and
        `connect` resumes it. Turns in flight end with `ConnectionLostError`."""
        await self._shut("the client disconnected")

    async def aclose(self) -> None:
        """End the session and close the connection; owned tasks are cancelled and awaited."""
        if self._ws is not None and self._connected.is_set() and self._stopped is None:
            with contextlib.suppress(*self._closed_errors()):
                await self._ws.send(dump_message(SessionEnd(session_id=self.session_id)))
        await self._shut("the client is closed")
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _shut(self, why: str) -> None:
        """Stop the client: the reader (and any reconnecting) first, so that no new
        connection opens behind the close, then the connection."""
        self._stop(why)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._ws is not None:
            with contextlib.suppress(TimeoutError, *self._closed_errors()):
                async with asyncio.timeout(self.timeout_s):
                    await self._ws.close()
        self._lost()

    def _stop(self, why: str) -> None:
        """The client is closed. Waiters for the connection wake (none is coming) and raise
        `ConnectionLostError`, as do intents waiting for their answer."""
        if self._stopped is None:
            self._stopped = why
        self._connected.set()
        for answer in self._intents.values():
            if not answer.done():
                answer.set_exception(ConnectionLostError(why))

    async def __aenter__(self) -> MythicClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- sending ------------------------------------------------------------------------------

    async def send(self, message: ClientMessage) -> None:
        """Send a message, waiting (up to `timeout_s`) while the client reconnects.

        Raises:
            ConnectionLostError: the client is closed, or the connection dropped and
                `reconnect` is off.
            TimeoutError: not connected again within `timeout_s`.
        """
        await self._send_frame(dump_message(message))

    async def _send_frame(self, frame: str | bytes) -> None:
        async with asyncio.timeout(self.timeout_s):
            while True:
                await self._connected.wait()
                if self._stopped is not None:
                    raise ConnectionLostError(self._stopped)
                try:
                    await self._ws.send(frame)
                    return
                except self._closed_errors() as exc:
                    if not self.reconnect or self._stopped is not None:
                        raise ConnectionLostError(f"connection closed: {exc}") from exc
                    self._connected.clear()

    async def send_audio(
        self,
        npc_id: str,
        pcm: bytes,
        *,
        sample_rate: int | None = None,
        turn_id: str | None = None,
        end: bool = False,
    ) -> None:
        """Send a chunk of the player's microphone audio (16-bit mono PCM, 20-100 ms) to
        `npc_id`, as a binary frame. `turn_id`: the turn the utterance opens (default: the
        server picks). `end`: push-to-talk released, the utterance ends here.

        Raises:
            ClientError: the session did not open with `voice`.
        """
        if self.voice is None:
            raise ClientError("this client's session has no voice; pass voice=VoiceFormat()")
        chunk = AudioChunk(
            npc_id=npc_id,
            session_id=self.session_id,
            pcm=pcm,
            sample_rate=sample_rate or self.voice.input_rate,
            ts_client=time.time(),
            turn_id=turn_id,
            end=end,
        )
        await self._send_frame(dump_audio_frame(chunk))

    async def talk(
        self,
        npc_id: str,
        pcm: bytes,
        *,
        chunk_ms: int = 40,
        realtime: bool = True,
        silence_ms: int = 700,
        turn_id: str | None = None,
    ) -> VoiceTurn:
        """Speak a line to `npc_id`: stream `pcm` (at the session's `input_rate`) in chunks
        of `chunk_ms`, at real-time pace unless `realtime` is false, then `silence_ms` of
        silence so the server hears the end. `turn_id`: the turn the line opens (default: a
        fresh one). Returns at once after sending; await the turn's `heard`, `replied` and
        `spoken` events, or `wait()`.
        """
        if self.voice is None:
            raise ClientError("this client's session has no voice; pass voice=VoiceFormat()")
        if len(pcm) % 2:
            raise ValueError("pcm is 16-bit samples: an even number of bytes")
        turn = VoiceTurn(npc_id, turn_id or f"v-{uuid.uuid4().hex[:12]}")
        if len(self._voice_turns) >= 64:  # lines that held no words never finish: forget them
            del self._voice_turns[next(iter(self._voice_turns))]
        self._voice_turns[turn.turn_id] = turn
        step = self.voice.input_rate * chunk_ms // 1000 * 2
        silence = bytes(self.voice.input_rate * silence_ms // 1000 * 2)
        began = time.perf_counter()
        sent_s = 0.0
        for offset, end_of_speech in [
            *((o, False) for o in range(0, len(pcm), step)),
            *((len(pcm) + o, True) for o in range(0, len(silence), step)),
        ]:
            data = pcm[offset : offset + step] if not end_of_speech else silence[:step]
            if end_of_speech and turn.speech_end_at is None:
                turn.speech_end_at = time.perf_counter()
            if len(data) < 2:
                continue
            if realtime:
                ahead = began + sent_s - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await self.send_audio(npc_id, data, turn_id=turn.turn_id)
            sent_s += len(data) / 2 / self.voice.input_rate
        if turn.speech_end_at is None:
            turn.speech_end_at = time.perf_counter()
        return turn

    async def say(self, npc_id: str, text: str, *, turn_id: str | None = None) -> Turn:
        """Say `text` to `npc_id`; iterate the returned turn for the reply."""
        turn = Turn(self, npc_id, turn_id or f"t-{uuid.uuid4().hex[:12]}")
        self._turns[turn.turn_id] = turn
        try:
            await self.send(
                PlayerUtterance(
                    npc_id=npc_id,
                    session_id=self.session_id,
                    turn_id=turn.turn_id,
                    text=text,
                    player_id=self.player_id,
                )
            )
        except BaseException:
            self._turns.pop(turn.turn_id, None)
            raise
        return turn

    async def scene(
        self,
        npc_id: str,
        *,
        zone: str | None = None,
        time: str | None = None,
        objects: dict[str, float] | None = None,
        date: str | None = None,
    ) -> None:
        """Tell an NPC what it perceives (`objects`: id -> distance) and the game's `date`
        (`year-month-day` in the world's calendar) and `time` (`HH:MM`)."""
        await self.send(
            SceneUpdate(
                npc_id=npc_id,
                zone=zone,
                time=time,
                date=date,
                objects=(
                    tuple(SceneObject(id=k, dist=float(v)) for k, v in objects.items())
                    if objects is not None
                    else None
                ),
            )
        )

    # -- scenes -------------------------------------------------------------------------------

    async def start_scene(
        self, scene_id: str, npcs: list[str], *, max_exchanges: int | None = None
    ) -> Scene:
        """Open a scene of `npcs` with this client's player in it; the player's lines to it
        (`Scene.say`) are answered by the NPC they name, else the one the player faces, else
        the scene's choice.

        Raises:
            ClientError: the server refused it (an unknown NPC, a duplicate, too many).
        """
        scene = Scene(self, scene_id)
        message = SceneStart(
            scene_id=scene_id,
            session_id=self.session_id,
            npcs=tuple(npcs),
            max_exchanges=max_exchanges,
        )
        await self._scene_call(scene, message, "SceneStart")
        return scene

    async def join_scene(self, scene_id: str) -> Scene:
        """This client's player joins a scene another player opened (it hears what follows).

        Raises:
            ClientError: no such scene, or it has ended.
        """
        scene = Scene(self, scene_id)
        message = SceneJoin(scene_id=scene_id, session_id=self.session_id)
        await self._scene_call(scene, message, "SceneJoin")
        return scene

    async def _scene_call(self, scene: Scene, message: ClientMessage, kind: str) -> None:
        """Send a scene message and wait for the scene's state (or end) that answers it.

        Raises:
            ClientError: the server refused it.
            TimeoutError: no answer within `timeout_s`.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        call = (kind, scene, done)
        self._scenes.setdefault(scene.scene_id, scene)
        self._scene_calls.append(call)
        try:
            await self.send(message)
            async with asyncio.timeout(self.timeout_s):
                await done
        except BaseException:
            opening = kind in ("SceneStart", "SceneJoin") and not scene.npcs
            if opening and self._scenes.get(scene.scene_id) is scene:
                del self._scenes[scene.scene_id]
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._scene_calls.remove(call)

    def _route_scene(self, message: ServerMessage, turn_id: str | None) -> bool:
        """Hand a scene or a scene talk its messages; True when one took it."""
        match message:
            case SceneState(scene_id=scene_id) | SceneEnd(scene_id=scene_id):
                scene = self._scenes.get(scene_id)
                if scene is None:
                    return False
                if isinstance(message, SceneState):
                    scene._state(message)
                else:
                    self._scenes.pop(scene_id, None)
                    scene._ended(message.reason or "ended")
                for _, waiting, done in list(self._scene_calls):
                    if waiting is scene and not done.done():
                        done.set_result(None)
                return True
            case SceneTurn(turn_id=answered):
                talk = self._scene_talks.get(answered)
                if talk is None:
                    return False
                talk._turn(message)
                return True
            case LLMStreamDelta() | ToolCall() if turn_id in self._scene_talks:
                talk = self._scene_talks[turn_id]
                if isinstance(message, LLMStreamDelta):
                    talk._delta(message)
                else:
                    talk._event(message)
                return True
            case Error() if turn_id is not None and turn_id in self._scene_talks:
                self._scene_talks[turn_id]._event(message)
                return True
            case Error(ref=ref) if ref is not None:
                for kind, _, done in self._scene_calls:
                    if ref.split(".")[0] == kind and not done.done():
                        done.set_exception(ClientError(message.message, error=message))
                        return True
        return False

    async def intent(
        self,
        npc_id: str,
        *,
        context: str | None = None,
        with_bark: bool = False,
        request_id: str | None = None,
    ) -> IntentUpdate:
        """Ask for an NPC's intent and wait for it. `request_id` (default: a fresh one) comes
        back in the `IntentUpdate`, so a game's intent cache can drop stale answers.

        Raises:
            ClientError: the server answered with an error.
            TimeoutError: no answer within the client's `timeout_s`.
        """
        request_id = request_id or f"i-{uuid.uuid4().hex[:12]}"
        if request_id in self._intents:
            raise ClientError(f"intent request {request_id} is already waiting for its answer")
        answer: asyncio.Future[IntentUpdate] = asyncio.get_running_loop().create_future()
        self._intents[request_id] = answer
        try:
            await self.send(
                IntentRequest(
                    npc_id=npc_id, request_id=request_id, context=context, with_bark=with_bark
                )
            )
            async with asyncio.timeout(self.timeout_s):
                return await answer
        finally:
            self._intents.pop(request_id, None)

    async def ack(
        self,
        call: ToolCall,
        status: Literal["ok", "error", "rejected", "duplicate"] = "ok",
        result: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> None:
        """Answer a tool call."""
        await self.send(
            Ack(
                ack_of="ToolCall",
                status=status,
                turn_id=call.turn_id,
                call_id=call.call_id,
                result=result,
                message=message,
            )
        )

    # -- receiving ----------------------------------------------------------------------------

    def _closed_errors(self) -> tuple[type[Exception], ...]:
        exceptions = require("websockets.exceptions", package="websockets", extra="client")
        closed: type[Exception] = exceptions.ConnectionClosed
        return (closed, OSError)

    async def _read_forever(self) -> None:
        while True:
            try:
                async for frame in self._ws:
                    try:
                        if isinstance(frame, bytes) and is_audio_frame(frame):
                            audio = parse_audio_frame(frame, side="server")
                            if isinstance(audio, TTSChunk):
                                self._route(audio)
                        else:
                            self._route(parse_server_message(frame))
                    except ProtocolError as exc:
                        log.warning("unreadable message from the server: %s", exc)
            except self._closed_errors():
                pass
            self._lost()
            if self._stopped is not None:
                return
            if not self.reconnect:
                self._stop(f"the connection to {self.url} closed")
                return
            self._connected.clear()
            if not await self._resume():
                return

    async def _resume(self) -> bool:
        """Reconnect and resume the session, with backoff, up to `max_reconnects` tries
        within `max_reconnect_s`; True once resumed. When no try succeeds, or the server
        refuses the session for good, the client stops (`closed`)."""
        backoff, tries = self.backoff_s, 0
        exceptions = require("websockets.exceptions", package="websockets", extra="client")
        # InvalidHandshake: the server answered the upgrade with another status (a 503 while
        # it starts).
        retried: tuple[type[Exception], ...] = (
            TimeoutError,
            *self._closed_errors(),
            exceptions.InvalidHandshake,
        )
        try:
            async with asyncio.timeout(self.max_reconnect_s):
                while tries < self.max_reconnects:
                    tries += 1
                    await asyncio.sleep(backoff)
                    try:
                        async with asyncio.timeout(self.timeout_s):
                            await self._open()
                        return True
                    except ClientError as exc:
                        if exc.error is not None and exc.error.code == "unknown_session":
                            # The session expired: start a fresh one.
                            self.resume_token = None
                            continue
                        if not exc.retryable:
                            self._stop(f"the server refused to resume the session: {exc}")
                            return False
                    except retried as exc:
                        log.info("reconnecting to %s failed: %r", self.url, exc)
                    backoff = min(self.max_backoff_s, backoff * 2)
        except TimeoutError:
            pass
        why = f"gave up reconnecting to {self.url} after {tries} tries"
        log.warning("%s", why)
        self._stop(why)
        return False

    def _lost(self) -> None:
        for turn in list(self._turns.values()):
            turn._put(ConnectionLostError(f"connection lost during turn {turn.turn_id}"))
        self._turns.clear()
        for talk in {id(t): t for t in self._scene_talks.values()}.values():
            talk._finish(ConnectionLostError(f"connection lost during scene line {talk.turn_id}"))
        self._scene_talks.clear()
        for _, _, done in self._scene_calls:
            if not done.done():
                done.set_exception(ConnectionLostError("connection lost"))
        for answer in self._intents.values():
            if not answer.done():
                answer.set_exception(ConnectionLostError("connection lost"))

    def _route(self, message: ServerMessage) -> None:
        turn_id = getattr(message, "turn_id", None)
        if isinstance(message, ToolCall) and self.tool_handler is not None:
            # Every call is answered, a spoken line's too: an unanswered one holds the NPC's
            # turn for the server's tool timeout and its retries.
            task = asyncio.create_task(self._handle_tool(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._route_voice(message, turn_id) or self._route_scene(message, turn_id):
            return
        turn = self._turns.get(turn_id) if turn_id else None
        match message:
            case LLMStreamDelta() | Cutoff() if turn is not None:
                turn._put(message)
                return
            case ToolCall():
                if turn is not None:
                    turn._put(message)
                    return
            case Error() if turn is not None:
                turn._put(message)
                return
            case IntentUpdate() if message.request_id in self._intents:
                future = self._intents[message.request_id]
                if not future.done():
                    future.set_result(message)
                return
        if self.events.full():
            self.events.get_nowait()
        self.events.put_nowait(message)

    def _route_voice(self, message: ServerMessage, turn_id: str | None) -> bool:
        """Hand a voice turn its messages; True when one took it."""
        voice = self._voice_turns.get(turn_id) if turn_id else None
        if voice is None:
            return False
        voice._route(message)
        if voice.spoken.is_set():
            self._voice_turns.pop(voice.turn_id, None)
        return True

    async def _handle_tool(self, call: ToolCall) -> None:
        """Run the tool handler once per call_id. A call the server sends again (the game's
        Ack was late or lost) is acknowledged `duplicate` with the first answer: the game
        does not act twice."""
        assert self.tool_handler is not None
        answered = self._tool_answers.get(call.call_id)
        if answered is not None:
            async with asyncio.timeout(self.timeout_s):
                _, result, message = await asyncio.shield(answered)
            await self._ack_answered(call, "duplicate", result, message)
            return
        answer: asyncio.Future[_ToolAnswer] = asyncio.get_running_loop().create_future()
        self._tool_answers[call.call_id] = answer
        while len(self._tool_answers) > _TOOL_ANSWERS:
            self._tool_answers.popitem(last=False)
        try:
            try:
                status, result = await self.tool_handler(call)
                answer.set_result((status, result, None))
            except MythicError as exc:
                answer.set_result(("error", None, str(exc)[:400]))
        finally:
            if not answer.done():
                answer.cancel()  # the handler failed otherwise: a repeat of the call waits no more
        status, result, message = answer.result()
        await self._ack_answered(call, status, result, message)

    async def _ack_answered(
        self,
        call: ToolCall,
        status: Literal["ok", "error", "rejected", "duplicate"],
        result: dict[str, Any] | None,
        message: str | None,
    ) -> None:
        """Send the tool handler's Ack. The handler runs in a task of its own, with nobody to
        raise to: an Ack the connection cannot carry (the client is closed) is logged."""
        try:
            await self.ack(call, status, result, message)
        except (ConnectionLostError, TimeoutError) as exc:
            log.warning("the Ack of tool call %s was not sent: %s", call.call_id, exc)
