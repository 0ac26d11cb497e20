"""The scenes of a server: who is in each, who answers a line, and who hears it.

A player's line to a scene goes to one NPC: the one it names, else the one the player faces
(`SceneLine.to`), else the speaker selector's choice (a gold request constrained to the
scene's NPCs, or nobody). The others hear it (`Cast.overhear`: their histories and memories
keep it); an NPC not in the scene never does. After a reply, an NPC it names may answer
(`max_exchanges` times at most), then the scene waits for a player. A new line from a player
stops the NPC speaking, not the scene.

Ambient lines (`SceneAmbient`: the NPCs talk among themselves, the game deciding when) are
turns of their NPCs at silver or bronze priority, below every player's line: they take no
speaker slot and no gold decision, the engine serves a player's prompt before them, and a
player's line to one of their NPCs stops its ambient line (`PlayerLine.priority`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Literal

from mythic._errors import MythicError
from mythic.config import SceneSettings
from mythic.contracts import (
    SceneAmbient,
    SceneEnd,
    SceneJoin,
    SceneLeave,
    SceneLine,
    SceneStart,
    SceneState,
    SceneTurn,
)
from mythic.dialogue import Cast, MailboxFullError, Outbox, Reply, UnknownNPCError
from mythic.engine import ChatMessage, GenerationRequest, Priority, Sampling
from mythic.scenes._address import address_forms, addressed
from mythic.scenes._errors import (
    AlreadyInSceneError,
    NotInSceneError,
    SceneEndedError,
    SceneExistsError,
    SceneFullError,
    SceneLimitError,
    TooFewNPCsError,
    UnknownSceneError,
    UnknownSceneNPCError,
)
from mythic.scenes._scene import Scene

log = logging.getLogger(__name__)

ChosenBy = Literal["name", "to", "selector", "nobody", "ambient"]

_ENDED = 1024
"""Ended scenes remembered, so that a late message to one is told it ended."""
_CONTEXT_LINES = 6
"""Lines of the scene the selector's prompt shows before the one it decides for."""
PLAYER = "player"
"""The speaker of a player's lines in a scene's log."""
_PRIORITY = {"silver": Priority.SILVER, "bronze": Priority.BRONZE}


class Scenes:
    """The open scenes of a cast. Runs on the event loop; never blocks (a line's replies play
    in a task of their own).

    Raises (from each method, the scene unharmed): the `SceneError`s.
    """

    def __init__(self, cast: Cast, send: Outbox, settings: SceneSettings) -> None:
        self.cast = cast
        self._send = send
        self.settings = settings
        self.scenes: dict[str, Scene] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self.selections: dict[str, int] = {
            "name": 0,
            "to": 0,
            "selector": 0,
            "nobody": 0,
            "ambient": 0,
        }
        """Lines answered, by how the speaker was chosen (for /metrics)."""
        self.selector_failures = 0

    # -- membership ---------------------------------------------------------------------------

    def start(self, session_id: str, message: SceneStart, *, player_id: str | None) -> Scene:
        if message.scene_id in self.scenes:
            raise SceneExistsError(f"scene {message.scene_id!r} is open already", field="scene_id")
        if len(self.scenes) >= self.settings.max_scenes:
            raise SceneLimitError(
                f"{len(self.scenes)} scenes are open, the most this server allows "
                "(scenes.max_scenes); end one first",
                field="scene_id",
            )
        npcs = list(dict.fromkeys(message.npcs))
        if len(npcs) != len(message.npcs):
            raise AlreadyInSceneError("a scene names each NPC once", field="npcs")
        if len(npcs) > self.settings.max_members:
            raise SceneFullError(
                f"{len(npcs)} NPCs, more than a scene holds (scenes.max_members: "
                f"{self.settings.max_members})",
                field="npcs",
            )
        for npc_id in npcs:
            self._known(npc_id, "npcs")
        exchanges = (
            self.settings.max_exchanges if message.max_exchanges is None else message.max_exchanges
        )
        scene = Scene(message.scene_id, session_id, npcs, [session_id], exchanges)
        scene.player_of[session_id] = player_id
        self._ended.pop(scene.id, None)
        self.scenes[scene.id] = scene
        self._tell_state(scene)
        return scene

    def join(self, session_id: str, message: SceneJoin, *, player_id: str | None) -> None:
        scene = self._open(message.scene_id)
        npc_id = message.npc_id
        if npc_id is None:
            if session_id in scene.sessions:
                raise AlreadyInSceneError(
                    f"this session is in scene {scene.id!r} already", field="session_id"
                )
            scene.sessions.append(session_id)
            scene.player_of[session_id] = player_id
        else:
            self._member(scene, session_id)
            self._known(npc_id, "npc_id")
            if npc_id in scene.npcs:
                raise AlreadyInSceneError(
                    f"{npc_id!r} is in scene {scene.id!r} already", field="npc_id"
                )
            if len(scene.npcs) >= self.settings.max_members:
                raise SceneFullError(
                    f"scene {scene.id!r} has {len(scene.npcs)} NPCs, the most a scene holds "
                    "(scenes.max_members)",
                    field="npc_id",
                )
            scene.npcs.append(npc_id)
        self._tell_state(scene)

    def leave(self, session_id: str, message: SceneLeave) -> None:
        scene = self._open(message.scene_id)
        self._member(scene, session_id)
        npc_id = message.npc_id
        if npc_id is None:
            self._player_leaves(scene, session_id)
            return
        if npc_id not in scene.npcs:
            raise NotInSceneError(
                f"{npc_id!r} is not in scene {scene.id!r}", field="npc_id", fix="SceneJoin it"
            )
        scene.npcs.remove(npc_id)
        if scene.speaking is not None and scene.speaking[0] == npc_id:
            self._interrupt(scene, "cancelled")  # it walks away mid-sentence
        self._tell_state(scene)

    def end(self, session_id: str, message: SceneEnd) -> None:
        scene = self._open(message.scene_id)
        self._member(scene, session_id)
        self._close(scene, message.reason or "ended by the game")

    def session_gone(self, session_id: str, *, forget: bool) -> None:
        """A session disconnected (`forget=False`: it may resume; the replies to its lines
        stop, its scenes stay) or ended (its player leaves every scene it was in)."""
        for scene in [s for s in self.scenes.values() if session_id in s.sessions]:
            if forget:
                self._player_leaves(scene, session_id)
            elif scene.speaking is not None and scene.speaking[1] == session_id:
                self._interrupt(scene, "cancelled")

    async def aclose(self) -> None:
        tasks = [s.chain for s in self.scenes.values() if s.chain is not None]
        for scene in list(self.scenes.values()):
            self._close(scene, "the server is shutting down")
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- lines --------------------------------------------------------------------------------

    def line(self, session_id: str, message: SceneLine, *, player_id: str | None) -> None:
        """The player says `message` to the scene: the NPC speaking now stops, and the replies
        to this line play in order (without waiting here)."""
        scene = self._open(message.scene_id)
        self._member(scene, session_id)
        if message.to is not None and message.to not in scene.npcs:
            raise NotInSceneError(f"{message.to!r} is not in scene {scene.id!r}", field="to")
        self._interrupt(scene, "barge_in")
        player = message.player_id or player_id or scene.player_of.get(session_id)
        scene.chain = asyncio.create_task(
            self._guarded(scene, partial(self._answer, scene, session_id, player, message)),
            name=f"scene {scene.id}",
        )

    def ambient(self, session_id: str, message: SceneAmbient, *, player_id: str | None) -> None:
        """The scene's NPCs talk among themselves, `message.lines` lines (without waiting
        here): the NPC speaking now stops first, as for a player's line."""
        scene = self._open(message.scene_id)
        self._member(scene, session_id)
        if message.opener is not None and message.opener not in scene.npcs:
            raise NotInSceneError(
                f"{message.opener!r} is not in scene {scene.id!r}", field="opener"
            )
        if len(scene.npcs) < 2:
            raise TooFewNPCsError(
                f"scene {scene.id!r} has {len(scene.npcs)} NPC; talking among themselves takes two",
                field="scene_id",
                fix="SceneJoin another NPC first",
            )
        self._interrupt(scene, "cancelled")
        player = player_id or scene.player_of.get(session_id)
        scene.chain = asyncio.create_task(
            self._guarded(scene, partial(self._chatter, scene, session_id, player, message)),
            name=f"scene {scene.id} ambient",
        )

    async def _guarded(self, scene: Scene, play: Callable[[], Awaitable[None]]) -> None:
        """Run a line's replies (`play`): whatever fails, the scene goes on."""
        try:
            await play()
        except asyncio.CancelledError:
            raise
        except MythicError as exc:  # a refused line to an NPC: the scene goes on
            log.warning("scene %s: %s", scene.id, exc)
        except Exception:  # one bad line must not end the scene or the server
            log.exception("scene %s: a line's replies failed", scene.id)
        finally:
            if scene.chain is asyncio.current_task():
                scene.speaking = None

    async def _answer(
        self, scene: Scene, session_id: str, player_id: str | None, line: SceneLine
    ) -> None:
        """The replies to the player's `line` (`_play`); when they are over (not stopped by a
        new line), a `SceneTurn` with no speakers says its last reply is answered by nobody:
        a client knows the line's replies are all in."""
        last = await self._play(scene, session_id, player_id, line)
        if last is not None:
            self._tell_turn(scene, last, (), (), "nobody")

    async def _play(
        self, scene: Scene, session_id: str, player_id: str | None, line: SceneLine
    ) -> str | None:
        """Returns the turn of the line's last reply; None when nobody answered it (its
        `SceneTurn` said so already)."""
        speaker, chosen_by = await self._choose(scene, session_id, line)
        self.selections[chosen_by] += 1
        scene.record(PLAYER, line.turn_id, line.text)
        speakers = (speaker,) if speaker is not None else ()
        self._tell_turn(scene, line.turn_id, speakers, (line.turn_id,)[: len(speakers)], chosen_by)
        heard = f"The player: {line.text}"
        self._overhear(scene, session_id, player_id, heard, but=speakers)
        if speaker is None:
            return None
        npc_id, turn_id, text, said_by = speaker, line.turn_id, line.text, None
        base = line.turn_id[:120]
        exchanges = scene.max_exchanges
        for exchange in range(exchanges + 1):
            answer = await self._say(
                scene, session_id, npc_id, turn_id, text, said_by, player_id, tools=said_by is None
            )
            if answer is None:
                return turn_id
            if said_by is None:
                scene.last_speaker[session_id] = npc_id
            said = answer.text.strip()
            if not said:
                return turn_id
            scene.record(npc_id, turn_id, said)
            gone = npc_id not in scene.npcs or answer.reason not in ("stop", "length")
            named = [] if gone or exchange == exchanges else self._named(scene, said, npc_id)
            nxt = named[0] if named else None
            self._overhear(
                scene, session_id, player_id, f"{self._name(npc_id)}: {said}", but=(npc_id, nxt)
            )
            if nxt is None:
                return turn_id
            reply_turn = f"{base}.{exchange + 1}"
            self._tell_turn(scene, turn_id, (nxt,), (reply_turn,), "name")
            self.selections["name"] += 1
            npc_id, turn_id, text, said_by = nxt, reply_turn, said, self._name(npc_id)
        return turn_id

    async def _chatter(
        self, scene: Scene, session_id: str, player_id: str | None, cue: SceneAmbient
    ) -> None:
        """The ambient exchange `cue` asks for (`_chat`); when it is over (not stopped by a
        player), a `SceneTurn` with no speakers says its last line is answered by nobody."""
        last = await self._chat(scene, session_id, player_id, cue)
        self._tell_turn(scene, last, (), (), "nobody")

    async def _chat(
        self, scene: Scene, session_id: str, player_id: str | None, cue: SceneAmbient
    ) -> str:
        """NPCs talk among themselves: the opener starts on the game's cue; each line is
        answered by an NPC it names, else by the next NPC of the scene after its speaker; the
        others hear it. An NPC with nothing to say (an empty line) passes the line to the next;
        the exchange stops early at two empty lines in a row, a line cut off, or its NPC
        gone. Returns the turn of its last line (the cue's when none was said)."""
        priority = _PRIORITY[cue.priority]
        npc_id = cue.opener or scene.npcs[0]
        asker = next(n for n in scene.npcs if n != npc_id)
        # The cue: the opener is asked by another of the scene (a question the small models
        # answer as a character, where a stage direction is read back). Nobody said it: no
        # one heard it or remembers it.
        text, said_by, answered = self._cue(cue.topic), self._name(asker), cue.turn_id
        cued, said_from, silent = True, asker, False
        base = cue.turn_id[:120]
        for k in range(1, cue.lines + 1):
            turn_id = f"{base}.{k}"
            self._tell_turn(scene, answered, (npc_id,), (turn_id,), "ambient")
            self.selections["ambient"] += 1
            answer = await self._say(
                scene,
                session_id,
                npc_id,
                turn_id,
                text,
                said_by,
                None if cued else player_id,  # the cue is nobody's: no memory keeps it
                tools=False,
                priority=priority,
            )
            if answer is None:
                return answered
            said = answer.text.strip()
            if answer.reason not in ("stop", "length"):
                return turn_id  # broken off (a player spoke to it)
            if not said:
                # Nothing it could say (every try caught): another of the scene answers the
                # same line; two silences in a row end the exchange.
                other = self._after(scene, npc_id, but=(npc_id, said_from))
                if silent or other is None:
                    return turn_id
                npc_id, silent = other, True
                continue
            silent = False
            scene.record(npc_id, turn_id, said)
            nxt = self._next_talker(scene, said, npc_id) if k < cue.lines else None
            self._overhear(
                scene, session_id, player_id, f"{self._name(npc_id)}: {said}", but=(npc_id, nxt)
            )
            if nxt is None:
                return turn_id
            npc_id, text, said_by, answered, said_from = (
                nxt,
                said,
                self._name(npc_id),
                turn_id,
                npc_id,
            )
            cued = False
        return answered

    async def _say(
        self,
        scene: Scene,
        session_id: str,
        npc_id: str,
        turn_id: str,
        text: str,
        said_by: str | None,
        player_id: str | None,
        *,
        tools: bool,
        priority: Priority = Priority.SPEAKING,
    ) -> Reply | None:
        """`npc_id` answers `text` (said by `said_by`, else the player) as the scene's speaker
        now; what it said, or None when it has too many lines waiting to take this one."""
        scene.speaking = (npc_id, session_id, turn_id)
        try:
            reply = self.cast.say_to(
                session_id,
                npc_id,
                turn_id,
                text,
                speaker=said_by,
                player_id=player_id,
                tools=tools,
                priority=priority,
            )
        except MailboxFullError as exc:
            log.warning("scene %s: %s cannot answer: %s", scene.id, npc_id, exc)
            scene.speaking = None
            return None
        answer = await reply
        scene.speaking = None
        return answer

    @staticmethod
    def _cue(topic: str | None) -> str:
        """What starts NPCs talking among themselves: the game's topic, else the news."""
        return f"What do you make of {topic}?" if topic else "What news today?"

    def _next_talker(self, scene: Scene, said: str, speaker: str) -> str | None:
        """Who answers `speaker`'s ambient line: an NPC it names, else the next after it."""
        named = self._named(scene, said, speaker)
        if named:
            return named[0]
        return self._after(scene, speaker, but=(speaker,))

    @staticmethod
    def _after(scene: Scene, npc_id: str, *, but: tuple[str, ...]) -> str | None:
        """The first NPC of the scene after `npc_id`, in the order they joined, not in `but`."""
        at = scene.npcs.index(npc_id) + 1 if npc_id in scene.npcs else 0
        order = scene.npcs[at:] + scene.npcs[:at]
        return next((n for n in order if n not in but), None)

    async def _choose(
        self, scene: Scene, session_id: str, line: SceneLine
    ) -> tuple[str | None, ChosenBy]:
        """Who answers the player's `line`: the NPC it names first, else `to`, else the
        selector's pick (or nobody)."""
        named = self._named(scene, line.text)
        if named:
            return named[0], "name"
        if line.to is not None:
            return line.to, "to"
        fallback = scene.last_speaker.get(session_id)
        if fallback not in scene.npcs:
            fallback = scene.npcs[0] if scene.npcs else None
        if fallback is None:
            return None, "nobody"
        if self.settings.selector == "first" or len(scene.npcs) == 1:
            return fallback, "selector"
        try:
            async with asyncio.timeout(self.settings.selector_timeout_s):
                pick = await self._select(scene, line.text)
        except (TimeoutError, MythicError, ValueError) as exc:
            log.warning("scene %s: the speaker selector failed (%s)", scene.id, exc)
            self.selector_failures += 1
            return fallback, "selector"
        if pick == "nobody":
            # A question is always answered: by whoever the player spoke with last.
            return (fallback, "selector") if "?" in line.text else (None, "nobody")
        return pick, "selector"

    async def _select(self, scene: Scene, text: str) -> str:
        """The selector: a gold request on the dialogue engine, its answer one of the scene's
        NPC ids or `nobody`.

        Raises:
            ValueError: the answer was not one of them.
        """
        options = [*scene.npcs, "nobody"]
        present = "\n".join(f"- {npc_id}: {self._described(npc_id)}" for npc_id in scene.npcs)
        system = (
            "You direct a scene of a video game. These characters are present:\n"
            f"{present}\n"
            "Name the one the player's last line is meant for, the one who would answer it; "
            "nobody when it is meant for none of them."
        )
        recent = [
            f"{'The player' if r.speaker == PLAYER else self._name(r.speaker)}: {r.text}"
            for r in list(scene.log)[-_CONTEXT_LINES:]
        ]
        user = "\n".join([*recent, f"The player: {text}", "Who answers?"])
        schema = {
            "type": "object",
            "properties": {"speaker": {"enum": options}},
            "required": ["speaker"],
            "additionalProperties": False,
        }
        request = GenerationRequest(
            npc_id="_scene",
            session_id=f"{scene.id}/speaker",
            messages=[ChatMessage("system", system), ChatMessage("user", user)],
            priority=Priority.GOLD,
            json_schema=schema,
            sampling=Sampling(max_tokens=32, temperature=0.0),
        )
        done = await self.cast.stage.router.complete(request, "speaker")
        pick = json.loads(done.text).get("speaker")
        if pick not in options:
            raise ValueError(f"the selector answered {pick!r}")
        return str(pick)

    # -- helpers ------------------------------------------------------------------------------

    def _open(self, scene_id: str) -> Scene:
        scene = self.scenes.get(scene_id)
        if scene is not None:
            return scene
        if scene_id in self._ended:
            raise SceneEndedError(
                f"scene {scene_id!r} has ended", field="scene_id", fix="SceneStart a new one"
            )
        raise UnknownSceneError(
            f"no open scene {scene_id!r}", field="scene_id", fix="SceneStart it first"
        )

    @staticmethod
    def _member(scene: Scene, session_id: str) -> None:
        if session_id not in scene.sessions:
            raise NotInSceneError(
                f"this session is not in scene {scene.id!r}",
                field="session_id",
                fix="SceneJoin it first",
            )

    def _known(self, npc_id: str, field: str) -> None:
        if npc_id not in self.cast.world.npcs:
            raise UnknownSceneNPCError(f"the world has no NPC {npc_id!r}", field=field)

    def _name(self, npc_id: str) -> str:
        persona = self.cast.world.npcs.get(npc_id)
        return persona.name.split(",")[0].strip() if persona is not None else npc_id

    def _described(self, npc_id: str) -> str:
        persona = self.cast.world.npcs.get(npc_id)
        return f"{persona.name}, a {persona.archetype}" if persona is not None else npc_id

    def _named(self, scene: Scene, text: str, but: str | None = None) -> list[str]:
        world = self.cast.world.npcs
        forms = {
            npc_id: address_forms(world[npc_id].name, world[npc_id].backstory)
            for npc_id in scene.npcs
            if npc_id in world and npc_id != but
        }
        return addressed(text, forms)

    def _overhear(
        self,
        scene: Scene,
        session_id: str,
        player_id: str | None,
        line: str,
        *,
        but: Iterable[str | None],
    ) -> None:
        """Every NPC of the scene but `but` hears `line`, in the conversation of the session."""
        skip = set(but)
        for npc_id in scene.npcs:
            if npc_id not in skip:
                with contextlib.suppress(UnknownNPCError):
                    self.cast.overhear(session_id, npc_id, (line,), player_id=player_id)

    def _interrupt(self, scene: Scene, reason: str) -> None:
        """Stop the replies being played: the NPC speaking stops (a final delta `cutoff`)."""
        if scene.chain is not None and not scene.chain.done():
            scene.chain.cancel()
        if scene.speaking is not None:
            npc_id, session_id, turn_id = scene.speaking
            self.cast.stop(session_id, npc_id, turn_id, reason)
            scene.speaking = None

    def _player_leaves(self, scene: Scene, session_id: str) -> None:
        if scene.speaking is not None and scene.speaking[1] == session_id:
            self._interrupt(scene, "cancelled")
        scene.sessions.remove(session_id)
        scene.player_of.pop(session_id, None)
        if not scene.sessions:
            self._close(scene, "its last player left")
        else:
            self._tell_state(scene)

    def _close(self, scene: Scene, reason: str) -> None:
        """End `scene`: the NPC speaking stops; every session in it is told (`SceneEnd`)."""
        self._interrupt(scene, "cancelled")
        self.scenes.pop(scene.id, None)
        self._ended[scene.id] = None
        while len(self._ended) > _ENDED:
            self._ended.popitem(last=False)
        for session_id in scene.sessions:
            self._send(
                session_id, SceneEnd(scene_id=scene.id, session_id=session_id, reason=reason)
            )

    def _tell_state(self, scene: Scene) -> None:
        for session_id in scene.sessions:
            self._send(
                session_id,
                SceneState(
                    scene_id=scene.id,
                    session_id=session_id,
                    npcs=tuple(scene.npcs),
                    players=tuple(scene.sessions),
                ),
            )

    def _tell_turn(
        self,
        scene: Scene,
        turn_id: str,
        speakers: tuple[str, ...],
        turn_ids: tuple[str, ...],
        chosen_by: ChosenBy,
    ) -> None:
        for session_id in scene.sessions:
            self._send(
                session_id,
                SceneTurn(
                    scene_id=scene.id,
                    session_id=session_id,
                    turn_id=turn_id,
                    speakers=speakers,
                    turn_ids=turn_ids,
                    chosen_by=chosen_by,
                ),
            )
