"""A conversation between the player and one NPC, streamed from the embedded model.

The terminal's path: one NPC, streamed from the shared engine. The NPC actor of the server
replaces it; the persona prompt and the history policy carry over.
"""

from __future__ import annotations

from collections.abc import Iterator

from mythic.config import ChatSettings
from mythic.dialogue._chat import PlayerInputError
from mythic.dialogue._turn import chat_sampling
from mythic.engine import (
    ChatMessage,
    ContextOverflowError,
    Engine,
    GenerationRequest,
    ModelError,
    Priority,
    SyncRequestStream,
)
from mythic.knowledge import World, persona_prompt

MAX_PLAYER_LINE = 2000


class Conversation:
    """The player talking to one NPC on the shared engine; keeps the recent history within the
    model's context."""

    def __init__(
        self,
        world: World,
        npc_id: str,
        engine: Engine,
        settings: ChatSettings,
        *,
        session_id: str = "chat",
    ) -> None:
        if engine.backend.chat_format is None:
            raise ModelError(
                f"model {engine.backend.name} has no chat template (a base model); it cannot chat",
                fix="use a chat model, e.g. --model qwen2.5-coder-0.5b-instruct, or set "
                "engine.chat_format for your own GGUF",
            )
        self.npc_id = npc_id
        self.session_id = session_id
        self.persona = world.npc(npc_id)
        self.engine = engine
        self.settings = settings
        self.system = ChatMessage("system", persona_prompt(world, self.persona))
        self.history: list[ChatMessage] = []
        self.last_messages: list[ChatMessage] = []
        """The messages of the last turn sent to the engine (after dropping old exchanges)."""

    def _submit(self, line: str) -> SyncRequestStream:
        """Submit the turn, dropping the oldest exchanges until it fits the context."""
        s = self.settings
        keep = self.history[-2 * s.history_turns :] if s.history_turns else []
        sampling = chat_sampling(s)
        while True:
            request = GenerationRequest(
                npc_id=self.npc_id,
                session_id=self.session_id,
                messages=[self.system, *keep, ChatMessage("user", line)],
                priority=Priority.SPEAKING,
                sampling=sampling,
            )
            try:
                stream = self.engine.submit_sync(request)
                self.last_messages = list(request.messages or ())
                return stream
            except ContextOverflowError as exc:
                if not keep:
                    raise PlayerInputError(
                        "the persona and this line do not fit the model's context; "
                        "say something shorter"
                    ) from exc
                keep = keep[2:]

    def reply(self, player_line: str) -> Iterator[str]:
        """Stream the NPC's reply to `player_line`; the exchange joins the history at the end.

        Closing the iterator early (Ctrl-C) cancels the generation on the engine.

        Raises:
            PlayerInputError: the line is empty or longer than 2000 characters.
        """
        line = player_line.strip()
        if not line:
            raise PlayerInputError("say something: the line is empty")
        if len(line) > MAX_PLAYER_LINE:
            raise PlayerInputError(
                f"the line has {len(line)} characters; the limit is {MAX_PLAYER_LINE}"
            )
        stream = self._submit(line)
        pieces: list[str] = []
        try:
            for delta in stream:
                if delta.text:
                    pieces.append(delta.text)
                    yield delta.text
        finally:
            stream.cancel()
            # An interrupted reply is still what the NPC said: keep it in the history. A reply
            # that only parrots the player's line is left out, or small models copy it every turn.
            said = "".join(pieces).strip()
            if said and _normalise(said) != _normalise(line):
                self.history += [ChatMessage("user", line), ChatMessage("assistant", said)]


def _normalise(text: str) -> str:
    return " ".join(text.lower().strip(" .!?\"'").split())
