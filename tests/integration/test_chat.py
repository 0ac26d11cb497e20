"""The terminal's chat in process (`open_chat`): the server's cast and actors on the real model."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from mythic.config import MythicSettings
from mythic.dialogue import Chat, PlayerInputError, UnknownNPCError, open_chat, persona_prompt
from mythic.engine import Engine, ModelError
from mythic.knowledge import load_world
from tests.conftest import EXAMPLE_WORLD
from tests.integration.conftest import load_engine

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),  # retrieval, memory and several replies, on 2 shared cores
]


def _chat(
    engine: Engine, settings: MythicSettings, data_dir: Path, npc_id: str = "marla", **kw: Any
) -> AbstractAsyncContextManager[Chat]:
    """A chat on the example world with short greedy replies, its memory in `data_dir`."""
    chat = settings.chat.model_copy(update={"max_tokens": 40, "temperature": 0.0})
    memory = settings.memory.model_copy(update={"data_dir": data_dir})
    short = settings.model_copy(update={"chat": chat, "memory": memory})
    return open_chat(load_world(EXAMPLE_WORLD), npc_id, short, engine=engine, **kw)


async def test_a_chat_streams_the_npcs_replies_and_keeps_the_servers_history(
    qwen: Engine, settings: MythicSettings, tmp_path: Path
) -> None:
    async with asyncio.timeout(600), _chat(qwen, settings, tmp_path) as chat:
        assert chat.persona.name == load_world(EXAMPLE_WORLD).npc("marla").name
        assert chat.persona.name in chat.cast.actor("marla").system.content
        pieces = [piece async for piece in chat.say("Good evening. What is this place?")]
        assert len(pieces) > 1, "the reply was not streamed"
        reply = "".join(pieces).strip()
        assert reply and "<|im_" not in reply
        spoken = [m for m in chat.history if m.role != "system"]
        assert [m.role for m in spoken] == ["user", "assistant"]
        assert spoken[0].content == "Good evening. What is this place?"
        assert chat.last_turn is not None and chat.last_turn.text == reply

        before = chat.history
        for line in ["", "   \n ", "x" * 4001]:
            with pytest.raises(PlayerInputError):
                [piece async for piece in chat.say(line)]
        assert chat.history == before  # a bad line leaves the conversation as it was

        assert "".join([piece async for piece in chat.say("And what do you sell?")]).strip()
        # The NPC may have acted on the line (a tool call, its result voiced): the server's
        # history has both lines and the replies after each.
        history = chat.history
        assert [m.content for m in history if m.role == "user"] == [
            "Good evening. What is this place?",
            "And what do you sell?",
        ]
        assert history[-1].role == "assistant"


async def test_a_reply_cut_off_is_kept_and_the_chat_goes_on(
    qwen: Engine, settings: MythicSettings, tmp_path: Path
) -> None:
    """Leaving the stream early (Ctrl-C in the terminal) cuts the NPC off, as a barge-in."""
    async with asyncio.timeout(600), _chat(qwen, settings, tmp_path, player_id=None) as chat:
        stream = chat.say("Tell me everything about this town, street by street.")
        first = await anext(stream)
        await stream.aclose()
        assert first
        answer = "".join([piece async for piece in chat.say("Hello?")]).strip()
        assert answer
        assert chat.last_turn is not None and chat.last_turn.turn_id == "t2"


async def test_an_npc_the_world_lacks_is_refused(
    qwen: Engine, settings: MythicSettings, tmp_path: Path
) -> None:
    with pytest.raises(UnknownNPCError):
        async with _chat(qwen, settings, tmp_path, "nobody"):
            pass


async def test_old_turns_drop_out_when_the_context_fills(
    settings: MythicSettings, tmp_path: Path
) -> None:
    """The prompt window moves past the oldest exchanges where the next line would overflow
    the model's context; the history keeps them."""
    engine = load_engine("smollm2-135m-instruct", settings, n_ctx=1024)
    try:
        async with asyncio.timeout(600), _chat(engine, settings, tmp_path) as chat:
            # Long lines, so eight exchanges overflow 1024 tokens however short the replies are.
            story = (
                "I have heard strange stories about the fog, the bells, the river and the marsh. "
            )
            for i in range(8):
                line = f"Tell me about night number {i} in this city. {story * 2}"
                assert "".join([piece async for piece in chat.say(line)]).strip()
            users = [m.content for m in chat.history if m.role == "user"]
            assert len(users) == 8
            # The window the next prompt keeps has the last line and no longer the first.
            actor = chat.cast.actor(chat.npc_id)
            starts = actor.window.starts(chat.session_id)
            kept = " ".join(m.content for m in chat.history[starts[0] :]) if starts else ""
            assert "night number 7" in kept
            assert "night number 0" not in kept
    finally:
        engine.close()


async def test_a_base_model_cannot_chat(
    gemma: Engine, settings: MythicSettings, tmp_path: Path
) -> None:
    with pytest.raises(ModelError, match="no chat template"):
        async with _chat(gemma, settings, tmp_path):
            pass


def test_every_example_persona_fits_a_small_context() -> None:
    world = load_world(EXAMPLE_WORLD)
    for persona in world.npcs.values():
        prompt = persona_prompt(world, persona)
        assert persona.name in prompt and persona.style in prompt
        assert len(prompt) < 4000
