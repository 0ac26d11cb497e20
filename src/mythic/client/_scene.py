"""Scenes from the game's side: `MythicClient.start_scene` opens one, `Scene.say` sends the
player's line to it and `Scene.ambient` asks its NPCs to talk among themselves; each returns a
`SceneTalk`, every reply to it in order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from mythic.contracts import (
    ClientMessage,
    Error,
    LLMStreamDelta,
    SceneAmbient,
    SceneEnd,
    SceneJoin,
    SceneLeave,
    SceneLine,
    SceneState,
    SceneTurn,
    ToolCall,
)


class SceneHost(Protocol):
    """What a scene needs of its client (`MythicClient`)."""

    session_id: str
    player_id: str | None
    _scenes: dict[str, Scene]
    _scene_talks: dict[str, SceneTalk]

    async def send(self, message: ClientMessage) -> None: ...

    async def _scene_call(self, scene: Scene, message: ClientMessage, kind: str) -> None: ...


SceneEvent = SceneTurn | LLMStreamDelta | ToolCall | Error
"""What a `SceneTalk` yields: who answers next (`SceneTurn`), the replies' deltas, their
tool calls, and an error refusing the line."""


@dataclass(slots=True)
class SceneReply:
    """One NPC's reply in a scene: to the player's line, or to another NPC's."""

    npc_id: str
    turn_id: str
    """The reply's turn (the line's own for its first reply; `<line>.1`, ... after)."""
    deltas: list[LLMStreamDelta] = field(default_factory=list)
    finish_reason: str | None = None
    """Set by its final delta; None while it streams."""

    @property
    def text(self) -> str:
        return "".join(d.delta for d in self.deltas)


class SceneTalk:
    """A line said to a scene (the player's, or the game's cue for an ambient exchange) and
    every reply it gets, in order, as the scene announces them (`SceneTurn`). It is over when
    the scene says nobody answers the last reply, when the line is refused (`errors`), when a
    new line to the scene stopped it (its reply then ends `cutoff`), or when the scene ends.

        talk = await scene.say("Captain, when is curfew?")
        async for event in talk:
            ...            # SceneTurn, LLMStreamDelta, ToolCall, Error
        for reply in talk.replies:
            print(reply.npc_id, reply.text)
    """

    def __init__(self, scene: Scene, turn_id: str) -> None:
        self.scene = scene
        self.turn_id = turn_id
        self.replies: list[SceneReply] = []
        self.turns: list[SceneTurn] = []
        self.errors: list[Error] = []
        self.over = False
        self._open: dict[str, SceneReply] = {}
        """Replies announced whose final delta has not come, by turn id."""
        self._stopped = False
        self._queue: asyncio.Queue[SceneEvent | BaseException | None] = asyncio.Queue()

    @property
    def speakers(self) -> list[str]:
        """Who answered, in order."""
        return [r.npc_id for r in self.replies]

    def __aiter__(self) -> AsyncIterator[SceneEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SceneEvent]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def wait(self) -> SceneTalk:
        """Until it is over; itself."""
        async for _ in self:
            pass
        return self

    # -- fed by the client's reader -----------------------------------------------------------

    def _turn(self, turn: SceneTurn) -> None:
        self.turns.append(turn)
        for npc_id, turn_id in zip(turn.speakers, turn.turn_ids, strict=True):
            reply = SceneReply(npc_id, turn_id)
            self.replies.append(reply)
            self._open[turn_id] = reply
            self.scene._client._scene_talks[turn_id] = self
        self._queue.put_nowait(turn)
        if not turn.speakers:
            self._finish()

    def _delta(self, delta: LLMStreamDelta) -> None:
        reply = self._open.get(delta.turn_id)
        if reply is None:
            return
        reply.deltas.append(delta)
        self._queue.put_nowait(delta)
        if delta.final and delta.finish_reason != "tool_call":
            reply.finish_reason = delta.finish_reason
            del self._open[delta.turn_id]
            if self._stopped and not self._open:
                self._finish()

    def _event(self, event: ToolCall | Error) -> None:
        self._queue.put_nowait(event)
        if isinstance(event, Error):
            self.errors.append(event)
            if event.turn_id == self.turn_id and not self.replies:
                self._finish()  # the line was refused

    def _stop(self) -> None:
        """A new line to the scene stopped this one: over once its reply in flight ends."""
        self._stopped = True
        if not self._open:
            self._finish()

    def _finish(self, error: BaseException | None = None) -> None:
        if self.over:
            return
        self.over = True
        talks = self.scene._client._scene_talks
        for turn_id in [self.turn_id, *(r.turn_id for r in self.replies)]:
            if talks.get(turn_id) is self:
                del talks[turn_id]
        if self.scene._talk is self:
            self.scene._talk = None
        if error is not None:
            self._queue.put_nowait(error)
        self._queue.put_nowait(None)


class Scene:
    """A scene this client opened or joined: its NPCs and players as the server last said
    (`SceneState`), and its lines. Raises `ClientError` for a message the server refuses
    (the scene unharmed)."""

    def __init__(self, client: SceneHost, scene_id: str) -> None:
        self._client = client
        self.scene_id = scene_id
        self.npcs: tuple[str, ...] = ()
        self.players: tuple[str, ...] = ()
        self.ended: str | None = None
        """Why the scene ended (`SceneEnd.reason`); None while it is open."""
        self._talk: SceneTalk | None = None
        self._changed = asyncio.Event()

    async def say(
        self, text: str, *, to: str | None = None, turn_id: str | None = None
    ) -> SceneTalk:
        """The player says `text` to the scene (`to`: the NPC the player faces); the NPC
        speaking stops. Iterate the returned talk for the replies."""
        turn_id = turn_id or f"t-{uuid.uuid4().hex[:12]}"
        line = SceneLine(
            scene_id=self.scene_id,
            session_id=self._client.session_id,
            turn_id=turn_id,
            text=text,
            to=to,
            player_id=self._client.player_id,
        )
        return await self._talk_by(line, turn_id)

    async def ambient(
        self,
        lines: int = 6,
        *,
        topic: str | None = None,
        opener: str | None = None,
        priority: Literal["silver", "bronze"] = "bronze",
        turn_id: str | None = None,
    ) -> SceneTalk:
        """The scene's NPCs talk among themselves, `lines` lines (1-30), below every player's
        line; `opener` starts, on `topic` when given."""
        turn_id = turn_id or f"a-{uuid.uuid4().hex[:12]}"
        cue = SceneAmbient(
            scene_id=self.scene_id,
            session_id=self._client.session_id,
            turn_id=turn_id,
            lines=lines,
            topic=topic,
            opener=opener,
            priority=priority,
        )
        return await self._talk_by(cue, turn_id)

    async def join(self, npc_id: str) -> tuple[str, ...]:
        """`npc_id` walks in (it hears what is said from now); the scene's NPCs then."""
        message = SceneJoin(
            scene_id=self.scene_id, session_id=self._client.session_id, npc_id=npc_id
        )
        await self._client._scene_call(self, message, "SceneJoin")
        return self.npcs

    async def leave(self, npc_id: str | None = None) -> tuple[str, ...]:
        """`npc_id` walks out (mid-sentence: it stops); None: this client's player leaves
        the scene. The scene's NPCs then."""
        message = SceneLeave(
            scene_id=self.scene_id, session_id=self._client.session_id, npc_id=npc_id
        )
        if npc_id is None:
            await self._client.send(message)
            self._client._scenes.pop(self.scene_id, None)
            self._ended("the player left")
            return self.npcs
        await self._client._scene_call(self, message, "SceneLeave")
        return self.npcs

    async def end(self, reason: str | None = None) -> None:
        """End the scene for everyone in it; waits for the server's `SceneEnd`."""
        message = SceneEnd(
            scene_id=self.scene_id, session_id=self._client.session_id, reason=reason
        )
        await self._client._scene_call(self, message, "SceneEnd")

    async def _talk_by(self, message: SceneLine | SceneAmbient, turn_id: str) -> SceneTalk:
        talk = SceneTalk(self, turn_id)
        client = self._client
        client._scene_talks[turn_id] = talk
        before, self._talk = self._talk, talk
        try:
            await client.send(message)
        except BaseException:
            client._scene_talks.pop(turn_id, None)
            self._talk = before
            raise
        if before is not None:
            before._stop()
        return talk

    # -- fed by the client's reader -----------------------------------------------------------

    def _state(self, state: SceneState) -> None:
        self.npcs, self.players = state.npcs, state.players
        self._changed.set()

    def _ended(self, reason: str) -> None:
        self.ended = reason
        if self._talk is not None:
            self._talk._finish()
        self._changed.set()
