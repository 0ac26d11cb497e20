"""Talking to an NPC of the example world on the real dialogue model."""

from __future__ import annotations

from pathlib import Path

import pytest

from mythic.config import ChatSettings, MythicSettings
from mythic.dialogue import Conversation, PlayerInputError, persona_prompt
from mythic.engine import Engine, ModelError
from mythic.knowledge import load_world
from tests.integration.conftest import load_engine

pytestmark = pytest.mark.integration

SHORT = ChatSettings(max_tokens=40, temperature=0.0)


def test_the_barkeep_answers_in_a_stream_and_remembers_the_turn(
    qwen: Engine, example_world: Path
) -> None:
    world = load_world(example_world)
    chat = Conversation(world, "marla", qwen, SHORT)
    assert world.npc("marla").name in chat.system.content
    pieces = list(chat.reply("Good evening. What is this place?"))
    assert len(pieces) > 1, "the reply was not streamed"
    reply = "".join(pieces).strip()
    assert reply
    assert "<|im_" not in reply
    assert [m.role for m in chat.history] == ["user", "assistant"]
    assert "".join(chat.reply("And what do you sell?")).strip()
    assert len(chat.history) == 4


def test_bad_lines_get_typed_errors_and_the_conversation_survives(
    qwen: Engine, example_world: Path
) -> None:
    chat = Conversation(load_world(example_world), "marla", qwen, SHORT)
    for line in ["", "   \n ", "x" * 2001]:
        with pytest.raises(PlayerInputError):
            list(chat.reply(line))
    assert chat.history == []
    assert "".join(chat.reply("Hello?")).strip()
    assert len(chat.history) == 2


def test_old_turns_drop_out_when_the_context_fills(
    settings: MythicSettings, example_world: Path
) -> None:
    engine = load_engine("smollm2-135m-instruct", settings, n_ctx=1024)
    try:
        chat = Conversation(load_world(example_world), "marla", engine, SHORT)
        # Long lines, so eight exchanges overflow 1024 tokens however short the replies are.
        story = "I have heard strange stories about the fog, the bells, the river and the marsh. "
        for i in range(8):
            line = f"Tell me about night number {i} in this city. {story * 2}"
            assert "".join(chat.reply(line)).strip()
        assert len(chat.history) == 16
        # The last turn fitted because the oldest exchanges were left out of its prompt.
        sent = " ".join(m.content for m in chat.last_messages)
        assert "night number 7" in sent
        assert "night number 0" not in sent
    finally:
        engine.close()


def test_a_base_model_cannot_chat(gemma: Engine, example_world: Path) -> None:
    with pytest.raises(ModelError, match="no chat template"):
        Conversation(load_world(example_world), "marla", gemma, SHORT)


def test_every_example_persona_fits_a_small_context(example_world: Path) -> None:
    world = load_world(example_world)
    for persona in world.npcs.values():
        prompt = persona_prompt(world, persona)
        assert persona.name in prompt and persona.style in prompt
        assert len(prompt) < 4000
