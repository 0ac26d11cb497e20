"""A turn's decision: the intent of the player's line and at most one game tool, by the line
classifier or by a gold constrained request on the model."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mythic.dialogue._character import Character
from mythic.dialogue._events import PlayerLine
from mythic.dialogue._moves import zone_named
from mythic.dialogue._stage import ExternalTool, Stage
from mythic.dialogue._tools import (
    INTENTS,
    TOOLS_BY_INTENT,
    ToolArgumentError,
    decision_schema,
    describe_tools,
    validate_call,
)
from mythic.engine import (
    ChatMessage,
    EngineError,
    GenerationRequest,
    Priority,
    RequestError,
)

log = logging.getLogger(__name__)

_RECENT = 3
"""At most this many results of the NPC's MCP read tools in a decision's prompt, ..."""
_RECENT_CHARS = 390
"""... in at most this many characters together (each line a third)."""


@dataclass(slots=True)
class Decision:
    """What the intent engine chose for a turn."""

    intent: str
    tool: tuple[str, dict[str, Any]] | None


class Decider:
    """Decides the lines spoken to one NPC."""

    def __init__(self, stage: Stage, character: Character) -> None:
        self.stage = stage
        self.character = character

    def _intent_prompt(self, tools: list[str], external: Sequence[ExternalTool] = ()) -> str:
        character = self.character
        name = character.short_name
        lines = [
            f"You decide what {name}, a {character.persona.archetype} in the video game "
            f"world {self.stage.world.name}, does when the player speaks.",
            "Intents: chitchat (small talk), trade (buying, selling, prices), quest (tasks, "
            "jobs), hint (help, secrets), combat (threats, fighting), navigation (the way "
            "somewhere, where something is), admin (the game itself).",
        ]
        if tools or external:
            lines += [
                f"Actions {name} can take in the game:",
                describe_tools(tools, external),
                "Places: " + ", ".join(character.places()) + ".",
                "Take an action only when the player asks for it (set_waypoint or set_marker "
                "when they ask the way, open_dialog or give_item to trade); otherwise null.",
            ]
        if external:
            lines.append(
                "A tool named server.tool asks another service: use it when the player asks "
                "what it tells or does."
            )
        scene = character.scene.describe()
        if scene:
            lines.append(scene)
        lines.append('Answer with JSON: {"intent": ..., "action": null or {"name", "args"}}.')
        return "\n".join(lines)

    def _recent_prompt(self) -> str | None:
        """What the NPC's MCP read tools told it recently (`ExternalTools.recent`), newest
        first, each line capped; None when nothing. A result the content policy blocks is
        left out, as the turn withholds it. No I/O."""
        external, character = self.stage.external, self.character
        if external is None:
            return None
        cap = _RECENT_CHARS // _RECENT
        lines = []
        for told in external.recent(character.npc_id, _RECENT):
            answer = _compact(told.result)
            if character.guard is not None and not character.guard.check(answer, "tool").ok:
                continue
            line = f"- {told.name} {_compact(told.args)}: {answer}"
            lines.append(line if len(line) <= cap else line[: cap - 1] + "…")
        if not lines:
            return None
        head = f"What {character.short_name}'s tools answered recently (tool arguments: answer):"
        return "\n".join([head, *lines])

    def external(self, tools: bool) -> Sequence[ExternalTool]:
        """The external (MCP) tools the NPC may call now; none when `tools` is False. No I/O."""
        external = self.stage.external
        return external.offered(self.character.npc_id) if tools and external else ()

    def request(self, session_id: str, text: str, *, tools: bool) -> GenerationRequest:
        """The gold request that decides `text`'s intent and tool (`tools`: the NPC's tools
        offered, its external ones among them); its system message is the same for every
        line of a scene, so a warm-up (`Gateway.warmup`) can have it evaluated before the
        player's first line. What the NPC's MCP read tools answered recently follows it, in a
        message of its own before the line (none when nothing)."""
        character = self.character
        offered = character.tools if tools else []
        external = self.external(tools)
        schema = decision_schema(
            offered,
            places=character.places(),
            targets=character.scene.targets(),
            external=external,
        )
        messages = [ChatMessage("system", self._intent_prompt(offered, external))]
        recent = self._recent_prompt()
        if recent is not None:
            messages.append(ChatMessage("system", recent))
        messages.append(ChatMessage("user", text))
        return GenerationRequest(
            npc_id=character.npc_id,
            session_id=f"{session_id}/decide",
            messages=messages,
            priority=Priority.GOLD,
            json_schema=schema,
            sampling=self.stage.decision_sampling(),
        )

    async def decide(self, line: PlayerLine) -> Decision | None:
        """The intent of the line and at most one tool call: by the cast's line classifier
        (`dialogue.decider`), else by a gold constrained request on the model.

        Only the line itself is judged: with the previous exchange in the prompt, the 0.5B
        model repeated the last tool on "thank you". A refused or failed decision is logged
        and counts as none: the reply goes on. An NPC with external (MCP) tools has a line
        the classifier finds no game tool for decided by the model, which may pick one.
        """
        stats, npc_id = self.stage.stats, self.character.npc_id
        move = await asyncio.to_thread(self.character.classified, line.text)
        external = {t.name for t in self.external(line.tools)}
        if move is not None and (move.acts or not external):
            tool = await self._move_tool(line, move.move) if move.acts and line.tools else None
            stats.intents[move.intent] += 1
            return Decision(move.intent, tool)
        tools = self.character.tools if line.tools else []
        request = self.request(line.session_id, line.text, tools=line.tools)
        try:
            done = await self.stage.router.complete(
                request, "tool_decision", archetype=self.character.persona.archetype
            )
            data = json.loads(done.text)
        except (RequestError, EngineError, ValueError) as exc:
            log.warning("decision for %s failed: %s", npc_id, exc)
            stats.decision_failures += 1
            return None
        intent = data.get("intent") if isinstance(data, dict) else None
        if intent not in INTENTS:
            stats.decision_failures += 1
            return None
        action = data.get("action")
        tool = None
        if isinstance(action, dict) and action.get("name") in external:
            # Mythic calls it: the arguments are checked against the tool's schema there.
            args = action.get("args")
            if isinstance(args, dict):
                tool = (str(action["name"]), args)
            else:
                stats.tool_calls["invalid"] += 1
        elif isinstance(action, dict):
            try:
                name = str(action.get("name"))
                allowed = [t for t in TOOLS_BY_INTENT[intent] if t in tools]
                tool = (name, validate_call(name, action.get("args"), allowed))
            except ToolArgumentError as exc:
                log.warning("%s chose an invalid tool call: %s", npc_id, exc)
                stats.tool_calls["invalid"] += 1
        stats.intents[intent] += 1
        return Decision(intent, tool)

    async def _move_tool(self, line: PlayerLine, move: str) -> tuple[str, dict[str, Any]] | None:
        """The game tool a classified acting `move` calls, among the NPC's tools: the way to
        the zone the line names, by its name or a title of its lore (a waypoint, else a
        marker); a purchase opens the trade window,
        else gives the item the model reads from the line; work opens the quest window; a
        threat turns the NPC to face the player (else a glare). None: no tool fits."""
        has = set(self.character.tools).__contains__
        call: tuple[str, dict[str, Any]] | None = None
        match move:
            case "way":
                world = self.stage.world
                zones = {z: zone.name for z, zone in world.card.zones.items()}
                titles = [
                    (d.zone, d.title) for d in world.lore if d.zone in zones and d.faction is None
                ]
                place = await asyncio.to_thread(zone_named, line.text, zones, titles)
                if place is not None and has("set_waypoint"):
                    call = ("set_waypoint", {"target": place})
                elif place is not None and has("set_marker"):
                    call = ("set_marker", {"location": place})
            case "buy" if has("open_dialog"):
                call = ("open_dialog", {"dialog": "trade"})
            case "buy" if has("give_item"):
                return await self._item_asked(line)
            case "work" if has("open_dialog"):
                call = ("open_dialog", {"dialog": "quest"})
            case "threat" if has("set_focus"):
                call = ("set_focus", {"target": "player"})
            case "threat" if has("play_emote"):
                call = ("play_emote", {"emote": "glare"})
        if call is None:
            return None
        try:
            return (call[0], validate_call(call[0], call[1]))
        except ToolArgumentError as exc:  # a zone id no tool accepts
            log.warning("%s cannot call %s: %s", self.character.npc_id, call[0], exc)
            return None

    async def _item_asked(self, line: PlayerLine) -> tuple[str, dict[str, Any]] | None:
        """`give_item` with the item and quantity the model reads from the player's line (a
        constrained gold request); None when it fails."""
        character = self.character
        schema = decision_schema(
            ["give_item"], places=character.places(), targets=character.scene.targets()
        )
        trade = next(b for b in schema["anyOf"] if b["properties"]["intent"]["const"] == "trade")
        request = GenerationRequest(
            npc_id=character.npc_id,
            session_id=f"{line.session_id}/decide",
            messages=[
                ChatMessage(
                    "system",
                    f"The player buys from {character.short_name}. Write the item they ask "
                    'for, in their words, and how many: {"intent": "trade", "action": {"name": '
                    '"give_item", "args": {"item": ..., "quantity": ...}}}.',
                ),
                ChatMessage("user", line.text),
            ],
            priority=Priority.GOLD,
            json_schema=trade,
            sampling=self.stage.decision_sampling(),
        )
        try:
            done = await self.stage.router.complete(
                request, "tool_decision", archetype=character.persona.archetype
            )
            action = json.loads(done.text)["action"]
            return ("give_item", validate_call("give_item", action["args"], ["give_item"]))
        except (
            RequestError,
            EngineError,
            ToolArgumentError,
            ValueError,
            LookupError,
            TypeError,
        ) as exc:
            log.warning("%s could not read the item asked for: %s", character.npc_id, exc)
            self.stage.stats.decision_failures += 1
            return None


def _compact(value: Any) -> str:
    """`value` as JSON without spaces, for a prompt."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
