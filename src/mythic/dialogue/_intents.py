"""Intents for the game's controllers: what the NPC means to do (and, asked, a bark), one gold
request at a time, the newest request waiting."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from mythic._errors import MythicError
from mythic.archetypes import AdapterTask
from mythic.contracts import MAX_BARK_WORDS, Error, IntentRequest, IntentUpdate
from mythic.dialogue._character import Character
from mythic.dialogue._events import AskIntent
from mythic.dialogue._stage import Stage
from mythic.engine import (
    ChatMessage,
    EngineError,
    GenerationRequest,
    Priority,
    RequestError,
)
from mythic.knowledge import intent_prompt, intent_schema

log = logging.getLogger(__name__)


def error_message(exc: MythicError, *, turn_id: str | None) -> Error:
    """The `Error` a failed request becomes on the wire."""
    code = type(exc).__name__.removesuffix("Error") or "EngineError"
    return Error(
        code=code[:64],
        message=exc.message[:500],
        turn_id=turn_id,
        retryable=exc.retryable,
    )


class Intents:
    """One NPC's intents: served to controllers (`AskIntent`) and pushed after a turn."""

    def __init__(
        self, stage: Stage, character: Character, last_line: Callable[[], str | None]
    ) -> None:
        self.stage = stage
        self.character = character
        self._last_line = last_line
        self.last: IntentUpdate | None = None
        self.task: asyncio.Task[None] | None = None
        self.waiting: AskIntent | None = None

    def reset(self) -> None:
        """After a crash of the actor's loop (its tasks are gone)."""
        self.task = self.waiting = None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def ask(self, ask: AskIntent, tasks: asyncio.TaskGroup) -> None:
        """Serve `ask`, or, while a request runs, after it (the newest request wins)."""
        if self.task is None or self.task.done():
            self.task = tasks.create_task(self._serve(ask))
        else:
            self.waiting = ask

    def push(self, session_id: str, intent: str) -> None:
        """A turn decided `intent`: the session's controller hears it."""
        update = IntentUpdate(npc_id=self.character.npc_id, intent=intent, target="player")  # type: ignore[arg-type]
        self.last = update
        self.stage.send(session_id, update)

    async def _serve(self, ask: AskIntent) -> None:
        send = self.stage.send
        while True:
            try:
                update = await self._intent(ask.request)
                self.last = update
                send(ask.session_id, update)
            except (RequestError, EngineError) as exc:
                send(ask.session_id, error_message(exc, turn_id=None))
            except (ValueError, KeyError) as exc:
                # A decision cut at max_tokens is not whole JSON: say so, keep serving.
                log.warning("intent for %s did not parse: %s", self.character.npc_id, exc)
                send(
                    ask.session_id,
                    Error(code="intent_failed", message="the intent did not complete; retry"),
                )
            if self.waiting is None:
                return
            ask, self.waiting = self.waiting, None

    async def _intent(self, ask: IntentRequest) -> IntentUpdate:
        character = self.character
        schema = intent_schema(character.scene.targets(), with_bark=ask.with_bark)
        prompt = intent_prompt(
            character.persona,
            character.scene.describe(),
            context=ask.context,
            last_line=self._last_line(),
            with_bark=ask.with_bark,
        )
        request = GenerationRequest(
            npc_id=character.npc_id,
            session_id="intent",
            messages=[ChatMessage("system", prompt), ChatMessage("user", "Decide.")],
            priority=Priority.GOLD,
            json_schema=schema,
            sampling=self.stage.decision_sampling(),
        )
        canned: dict[str, Any] = {"intent": "chitchat", "target": None, "urgency": 0}
        if ask.with_bark:
            canned["bark"] = character.canned(ask.request_id)
        stream = await character.open(
            request,
            "bark" if ask.with_bark else "intent",
            AdapterTask.ACTION_POLICY,
            canned=json.dumps(canned),
        )
        async with stream:
            done = await stream.collect()
        data = json.loads(done.text)
        bark = data.get("bark")
        if isinstance(bark, str):
            bark = " ".join(bark.split()[:MAX_BARK_WORDS]).strip() or None
        target = data.get("target")
        self.stage.stats.intents[data["intent"]] += 1
        return IntentUpdate(
            npc_id=character.npc_id,
            intent=data["intent"],
            target=target if isinstance(target, str) else None,
            urgency=int(data["urgency"]) / 9,
            bark=bark,
            request_id=ask.request_id,
        )
