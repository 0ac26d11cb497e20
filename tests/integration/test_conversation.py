"""Talking to an NPC of the example world on the real dialogue model."""

from __future__ import annotations

from pathlib import Path

import pytest

from mythic.config import ChatSettings, EngineSettings, MythicSettings
from mythic.dialogue import Conversation, PlayerInputError, persona_prompt
from mythic.engine import LlamaCppModel, ModelError, load_model
from mythic.knowledge import load_world

pytestmark = pytest.mark.integration

SHORT = ChatSettings(max_tokens=40, temperature=0.0)


def test_the_barkeep_answers_in_a_stream_and_remembers_the_turn(
    qwen: LlamaCppModel, example_world: Path
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
    qwen: LlamaCppModel, example_world: Path
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
    engine = EngineSettings(**(settings.engine.model_dump() | {"n_ctx": 1024}))
    model = load_model("smollm2-135m-instruct", engine)
    try:
        chat = Conversation(load_world(example_world), "marla", model, SHORT)
        for i in range(8):
            assert "".join(chat.reply(f"Tell me about night number {i} in this city.")).strip()
        assert len(chat.history) == 16
        # The prompt for the next line fits, so the oldest turns are no longer in it.
        prompt = chat._prompt("One more question.")
        assert model.count_tokens(prompt) <= model.n_ctx - SHORT.max_tokens
        assert "night number 0" not in prompt
    finally:
        model.close()


def test_a_base_model_cannot_chat(gemma: LlamaCppModel, example_world: Path) -> None:
    with pytest.raises(ModelError, match="no chat template"):
        Conversation(load_world(example_world), "marla", gemma, SHORT)


def test_every_example_persona_fits_a_small_context(example_world: Path) -> None:
    world = load_world(example_world)
    for persona in world.npcs.values():
        prompt = persona_prompt(world, persona)
        assert persona.name in prompt and persona.style in prompt
        assert len(prompt) < 4000
