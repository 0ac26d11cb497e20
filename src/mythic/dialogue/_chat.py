"""A conversation of one player with one NPC in process (the terminal's `mythic chat`), played
by the same `Cast` and actors as the server: persona, lore, memory, tool calls and history
policy are the server's, so the terminal shows the NPC a game would meet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pydantic import ValidationError

from mythic._errors import MythicError
from mythic.config import MythicSettings
from mythic.contracts import (
    Ack,
    Cutoff,
    Error,
    LLMStreamDelta,
    PlayerUtterance,
    ServerMessage,
    ToolCall,
)
from mythic.dialogue._cast import Cast, open_chains, read_chains, token_counter
from mythic.dialogue._turn import TurnRecord
from mythic.engine import ChatMessage, Engine, ModelError
from mythic.knowledge import Knowledge, Persona, World
from mythic.memory import Memory
from mythic.route import Router, local_router

CUT_OFF_S = 30.0
"""How long a reply cut off may take to stop (one engine step, in practice)."""


class PlayerInputError(MythicError):
    """The player's line cannot be used (empty, too long); the conversation goes on."""


class Chat:
    """One player's session with one NPC of a cast (`open_chat`). The terminal plays the
    game's side: it accepts every tool call the NPC makes (listed in `tool_calls`)."""

    def __init__(
        self,
        cast: Cast,
        npc_id: str,
        inbox: asyncio.Queue[ServerMessage],
        *,
        session_id: str = "chat",
        player_id: str | None = None,
    ) -> None:
        self.cast = cast
        self.npc_id = npc_id
        self.session_id = session_id
        self.player_id = player_id
        self._inbox = inbox
        self._turns = 0
        self.tool_calls: list[ToolCall] = []
        """The game tool calls the NPC made, in order (each acknowledged `ok`)."""

    async def _next(self, turn_id: str) -> tuple[str, bool, Error | None]:
        """The next message of turn `turn_id` for the terminal: reply text, whether the reply
        ended, an error. A tool call is acknowledged as done (the terminal plays the game)."""
        while True:
            message = await self._inbox.get()
            match message:
                case LLMStreamDelta(turn_id=tid) if tid == turn_id:
                    ended = message.final and message.finish_reason != "tool_call"
                    return message.delta, ended, None
                case ToolCall(turn_id=tid) if tid == turn_id:
                    self.tool_calls.append(message)
                    ack = Ack(ack_of="ToolCall", call_id=message.call_id, status="ok")
                    self.cast.ack(self.session_id, ack)
                case Error(turn_id=tid) if tid == turn_id:
                    return "", False, message

    @property
    def persona(self) -> Persona:
        return self.cast.world.npc(self.npc_id)

    @property
    def history(self) -> list[ChatMessage]:
        """The session's history as the NPC keeps it (context, lines and replies)."""
        return list(self.cast.actor(self.npc_id).histories.get(self.session_id, []))

    @property
    def last_turn(self) -> TurnRecord | None:
        return self.cast.actor(self.npc_id).last_turn

    async def say(self, line: str) -> AsyncIterator[str]:
        """Say `line` to the NPC and stream its reply text; the exchange joins the session's
        history as the server's would. Closing the stream early cuts the NPC off (what it
        said so far is kept).

        Raises:
            PlayerInputError: the line is empty, too long, or does not fit the model's
                context beside the persona.
            MythicError: no model could answer (the reply ends with what was said).
        """
        self._turns += 1
        turn_id = f"t{self._turns}"
        try:
            utterance = PlayerUtterance(
                npc_id=self.npc_id,
                session_id=self.session_id,
                turn_id=turn_id,
                text=line.strip(),
                player_id=self.player_id,
            )
        except ValidationError as exc:
            reason = "the line is empty" if not line.strip() else exc.errors()[0]["msg"]
            raise PlayerInputError(f"say something else: {reason}") from None
        self.cast.deliver(self.session_id, utterance, player_id=self.player_id)
        failed: Error | None = None
        ended = False
        try:
            while not ended:
                piece, ended, error = await self._next(turn_id)
                failed = error or failed
                if piece:
                    yield piece
        finally:
            if not ended:
                # The caller stopped listening (Ctrl-C): the NPC stops talking. The cut-off
                # drops lines queued behind it, so the next line waits for the turn's end.
                self.cast.deliver(
                    self.session_id,
                    Cutoff(npc_id=self.npc_id, session_id=self.session_id, turn_id=turn_id),
                )
                async with asyncio.timeout(CUT_OFF_S):
                    while not ended:
                        _, ended, _ = await self._next(turn_id)
        if failed is not None and failed.code == "ContextOverflow":
            raise PlayerInputError(failed.message)
        if failed is not None:
            raise MythicError(failed.message)


@contextlib.asynccontextmanager
async def open_chat(
    world: World,
    npc_id: str,
    settings: MythicSettings,
    *,
    engine: Engine | None = None,
    router: Router | None = None,
    memory: Memory | None = None,
    player_id: str | None = "player",
) -> AsyncIterator[Chat]:
    """A chat with `npc_id` of `world` on a cast of its own, closed on exit.

    Args:
        world: the loaded world.
        npc_id: the NPC spoken to.
        settings: the settings a server of this world would run with.
        engine: the embedded engine every tier runs on (`route.local_router`), and whose
            tokenizer counts the lore's budgets; or give `router`.
        router: the router of the tiers (the caller owns it).
        memory: the NPCs' memory (the caller owns it); None: one of `settings.memory` when
            it is enabled, started and closed here.
        player_id: who talks: the NPC remembers them across chats (None: a stranger).

    The NPC is served with its archetype's adapters from the world's chain registry
    (`open_chains`), read once at start.

    Raises:
        UnknownNPCError: the world has no such NPC.
        ModelError: the engine's model cannot chat (no chat template).
    """
    if router is None and engine is None:
        raise ValueError("give an engine or a router")
    if engine is not None and engine.backend.chat_format is None:
        raise ModelError(
            f"model {engine.backend.name} has no chat template (a base model); it cannot chat",
            fix="use a chat model, e.g. --model qwen2.5-coder-0.5b-instruct, or set "
            "engine.chat_format for your own GGUF",
        )
    async with contextlib.AsyncExitStack() as opened:
        if router is None:
            assert engine is not None  # checked above
            router = local_router(settings, engine)
            router.start()
            opened.push_async_callback(router.aclose)
        if memory is None and settings.memory.enabled:
            memory = Memory(settings.memory)
            await memory.start()
            opened.push_async_callback(memory.aclose)
        chains = open_chains(settings, world, router)
        if chains is not None:
            opened.push_async_callback(chains.aclose)
            await read_chains(chains)
        count = token_counter(engine or router.engine_for("dialogue"))
        knowledge = Knowledge(world, settings.knowledge, count=count)
        inbox: asyncio.Queue[ServerMessage] = asyncio.Queue()
        cast = Cast(
            world,
            router,
            settings,
            lambda _session, message: inbox.put_nowait(message),
            memory=memory,
            knowledge=knowledge,
            chains=chains,
        )
        async with cast:
            cast.actor(npc_id)  # UnknownNPCError now rather than at the first line
            yield Chat(cast, npc_id, inbox, player_id=player_id)
