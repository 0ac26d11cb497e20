"""What an actor knows of its NPC: the persona card and what its prompts and line filter make
of it, the scene it perceives, and how its requests reach a model."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import zlib
from dataclasses import dataclass

from mythic.archetypes import AdapterTask
from mythic.contracts import SceneObject
from mythic.dialogue._events import AMBIENT_NOTE
from mythic.dialogue._moves import Classified
from mythic.dialogue._naturalness import name_forms, secrets_of
from mythic.dialogue._refusals import AMBIENT_REPEAT, REMINDED, reminder
from mythic.dialogue._stage import Stage
from mythic.dialogue._tools import npc_tools
from mythic.engine import ChatMessage, GenerationRequest, UnknownAdapterError
from mythic.knowledge import (
    ANSWER_NOTE,
    PROMPT_RULES,
    Calendar,
    GameDateError,
    SceneState,
    introduction,
    persona_prompt,
)
from mythic.knowledge import SceneObject as KnownObject
from mythic.route import EndpointRejectedError, RoutedStream, canned_line
from mythic.safety import Guard, SafetyPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Scene:
    """What the NPC perceives, from the game's `SceneUpdate`s."""

    zone: str | None = None
    time: str | None = None
    objects: tuple[SceneObject, ...] = ()
    date: str | None = None
    """The game's date (`year-month-day` in the world's calendar), as the game sent it."""
    game_time: int | None = None
    """`date` and `time` in minutes of the world's calendar: what memories are dated with."""
    said_date: str | None = None
    """`date` as the NPC says it ("the 9th of Ashfall, year 11 of the Strike")."""

    def describe(self) -> str | None:
        parts = []
        if self.zone:
            parts.append(f"zone {self.zone}")
        if self.said_date:
            parts.append(f"date {self.said_date}")
        if self.time:
            parts.append(f"time {self.time}")
        if self.objects:
            near = ", ".join(f"{o.id} ({o.dist:g} away)" for o in self.objects[:12])
            parts.append(f"nearby: {near}")
        return "Scene now: " + "; ".join(parts) if parts else None

    def state(self) -> SceneState:
        return SceneState(
            self.zone,
            self.time,
            tuple(KnownObject(o.id, o.dist) for o in self.objects),
            self.said_date,
        )

    def date_with(self, calendar: Calendar) -> None:
        """Work out `game_time` and `said_date` from `date` and `time` in `calendar` (both
        None without a date, or with one the calendar no longer has: a world reloaded).
        """
        self.game_time = self.said_date = None
        if self.date is None:
            return
        try:
            self.game_time = calendar.minutes(self.date, self.time)
        except GameDateError as exc:
            log.warning("scene date left out: %s", exc)
            return
        self.said_date = calendar.say(self.game_time)

    def targets(self) -> list[str]:
        """What the NPC may face or act on: the player and what is near."""
        ids = ["player", *(o.id for o in self.objects if o.id != "player")]
        return ids[:32]


class Character:
    """One NPC as its actor plays it.

    Raises:
        KeyError: the world has no such NPC.
    """

    def __init__(self, stage: Stage, npc_id: str) -> None:
        self.stage = stage
        self.npc_id = npc_id
        self._generation = -1
        self._last_move: tuple[str, Classified] | None = None
        self.read_card()
        self.scene = Scene(zone=self.persona.zone)

    def read_card(self) -> None:
        """(Re)read the persona card and its packed `## Persona` section: at start, and after
        the world was reloaded.

        Raises:
            KeyError: the world has no such NPC (any more).
        """
        stage, knowledge = self.stage, self.stage.knowledge
        world = stage.world
        self.persona = persona = world.npc(self.npc_id)
        self.tools = npc_tools(self.npc_id, persona.tools)
        safety = stage.settings.safety
        policy = SafetyPolicy.of(world.safety, persona.safety)
        if not safety.classifier:
            policy = dataclasses.replace(policy, classifier=False)
        self.guard = Guard(policy) if safety.enabled else None
        """The content policy of its words and tools (the world's and its card's); None when
        `safety.enabled` is off."""
        self.short_name = persona.name.split(",")[0]
        self.name_forms = name_forms(persona.name, persona.backstory)
        self.others = tuple(
            sorted(
                {
                    form
                    for npc_id, npc in world.npcs.items()
                    if npc_id != self.npc_id
                    for form in name_forms(npc.name, npc.backstory)
                },
                key=len,
                reverse=True,
            )
        )
        """The names of the world's other NPCs: a reply labelled with one ("Marla: ...")
        speaks for them."""
        public = [world.card.description, persona.style, *persona.rules]
        public += [f"{zone.name}: {zone.description}" for zone in world.card.zones.values()]
        public += [npc.name for npc in world.npcs.values()]
        public += persona.catchphrases  # its own words: said on every greeting
        self.secrets = secrets_of(persona.taboos, public)
        """Each taboo's giveaway words: the line filter keeps them from the replies."""
        self.instructions = [persona.style, *persona.rules, *persona.taboos, *PROMPT_RULES]
        self.plain = [
            introduction(world, persona),
            ANSWER_NOTE,
            *(reminder(kind, self.short_name) for kind in REMINDED),
            AMBIENT_NOTE,
            AMBIENT_REPEAT,
        ]
        """What the prompt calls the NPC ("a ghoul of Ravenmoor") and what a try generated
        again is told (`reminder`): never said by the NPC."""
        section = knowledge.persona(self.npc_id) if knowledge is not None else None
        prompt = persona_prompt(world, persona, section, full=knowledge is None)
        self.system = ChatMessage("system", prompt)
        self.known = stage.world_words
        """The words of the NPC's world. Not its prompt's: "You know nothing of computers"
        tells the NPC what it doesn't know, and "I know nothing of computers" said back names
        the real world all the same (the scorecard's in-character check fails it)."""
        self._generation = knowledge.generation if knowledge is not None else 0

    def reread_if_reloaded(self) -> None:
        """Reread the card when the world was reloaded since; an NPC removed from the world
        keeps its card."""
        knowledge = self.stage.knowledge
        if knowledge is not None and knowledge.generation != self._generation:
            with contextlib.suppress(KeyError):
                self.read_card()

    def places(self) -> list[str]:
        return list(self.stage.world.card.zones) or ["here"]

    def place_name(self, place_id: object) -> str:
        zone = self.stage.world.card.zones.get(str(place_id))
        return zone.name if zone is not None else str(place_id).replace("_", " ")

    def canned(self, key: str) -> str:
        """The NPC's line when no model can answer: one of the card's `fallback_lines`, else
        a line in its archetype's voice."""
        lines = self.persona.fallback_lines
        if lines:
            return lines[zlib.crc32(key.encode()) % len(lines)]
        return canned_line(self.persona.archetype, key)

    def classified(self, text: str) -> Classified | None:
        """The move of `text` by the cast's line classifier; None without one (`decider:
        model`). The last line's move is kept: the turn's lore and its decision classify the
        line once. Blocking (17 ms on 2 cores; a second or so when it builds the classifier):
        call it in a worker thread."""
        classifier = self.stage.classifier()
        if classifier is None:
            return None
        last = self._last_move
        if last is not None and last[0] == text:
            return last[1]
        move = classifier.classify(text)
        self._last_move = (text, move)
        return move

    async def open(
        self, request: GenerationRequest, kind: str, task: AdapterTask, *, canned: str | None
    ) -> RoutedStream:
        """Route `request` with its archetype's adapter for `task` (none when the registry has
        none for the serving model, or it is not loaded yet). An endpoint that refuses the
        adapter (unloaded since it was chosen, or a remote server without it) gets the request
        again without it: the base model answers rather than nobody."""
        stage, archetype = self.stage, self.persona.archetype
        request.adapters = stage.adapters_for(request, kind, task, archetype)
        try:
            return await stage.router.open(request, kind, archetype=archetype, canned=canned)
        except (UnknownAdapterError, EndpointRejectedError) as exc:
            if not request.adapters or stage.chains is None:
                raise
            log.info(
                "%s: adapters %s refused (%s); the base model answers",
                self.npc_id,
                sorted(request.adapters),
                exc,
            )
            stage.chains.note_refused(archetype, task)
            request.adapters = {}
            return await stage.router.open(request, kind, archetype=archetype, canned=canned)
