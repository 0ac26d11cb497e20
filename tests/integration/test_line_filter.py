"""The line filter on the real server with the default model (Qwen2.5-Coder-0.5B): each
reply is checked clause by clause before it leaves. Every test first shows, with the filter
off, that the model does say the thing (a repeat, an assistant phrase, a secret), then that
with it on the player never hears it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from mythic.config import MythicSettings
from mythic.dialogue import assistant_phrases, normalise, repeats, sentences, stepped_out
from mythic.engine import Engine
from mythic.server import Gateway
from tests.integration.conftest import load_engine
from tests.integration.test_server import running

pytestmark = pytest.mark.integration

# A test world's cards: the clerk's rule makes the model close with assistant phrasing, the
# keeper's story holds a name its taboo forbids.
_WORLD = {
    "world.yaml": """
name: "Saltmere"
description: "A small harbour town of fishers and salt traders."
zones:
  harbour:
    name: "The Harbour"
    description: "The quays and the salt sheds of Saltmere."
""",
    "npcs/keeper.yaml": """
name: "Hanne, the Shed Keeper"
archetype: human
style: "blunt, short sentences"
rules:
  - "Sell salt at two pennies a pound and rope at five pennies a fathom"
taboos:
  - "The name Orrin Vask, who runs the smugglers from the north shed"
backstory: "Hanne keeps the salt sheds. Orrin Vask runs the smugglers from the north shed
  and pays her to look away."
zone: harbour
tools: []
""",
    "npcs/clerk.yaml": """
name: "Tobb, the Harbour Clerk"
archetype: human
style: "eager and polite"
rules:
  - "Always end every reply with the sentence: If you have any more questions, feel free to ask!"
zone: harbour
tools: []
""",
    "npcs/ferrywoman.yaml": """
name: "Ysolde, the Ferrywoman"
archetype: human
style: "dry and unhurried"
catchphrases:
  - "mind the tide"
  - "salt and silence"
zone: harbour
tools: []
""",
}


@pytest.fixture
def world(tmp_path: Path) -> Path:
    for name, text in _WORLD.items():
        path = tmp_path / "saltmere" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip(), encoding="utf-8")
    return tmp_path / "saltmere"


_CHAT = {"max_tokens": 60, "temperature": 0.0}
_METRICS: dict[str, str] = {}
"""The last /metrics page of a server `_talk` ran, by NPC."""
_CAUGHT: dict[str, list[str]] = {}
"""What the last reply `_talk` had from each NPC says the filter caught (`SayReply.caught`)."""


async def _talk(
    qwen: Engine, settings: MythicSettings, world: Path, npc: str, lines: list[str], **dialogue: Any
) -> tuple[list[str], Gateway]:
    """The replies to `lines`, said in one conversation with `npc`."""
    dialogue = {"decide": False, **dialogue}
    replies = []
    async with (
        running((qwen, qwen), settings, world=world, chat=_CHAT, dialogue=dialogue) as served,
        httpx.AsyncClient(base_url=f"http://{served[0]}", timeout=120) as http,
    ):
        for line in lines:
            body = {"text": line, "session_id": "s"}
            response = await http.post(f"/v1/npcs/{npc}/say", json=body)
            assert response.status_code == 200, response.text
            replies.append(response.json()["text"])
            _CAUGHT[npc] = response.json()["caught"]
        _METRICS[npc] = (await http.get("/metrics")).text
        return replies, served[1]


async def test_the_repetition_guard_resamples_a_repeated_reply(
    qwen: Engine, settings: MythicSettings, world: Path
) -> None:
    lines = ["What do you sell here?", "What do you sell here?"]
    off, _ = await _talk(qwen, settings, world, "keeper", lines, line_filter=False)
    said = sentences(off[0])
    assert any(repeats(s, said) for s in sentences(off[1])), off  # the model repeats itself
    on, gateway = await _talk(qwen, settings, world, "keeper", lines)
    assert on[1] and not any(repeats(s, sentences(on[0])) for s in sentences(on[1])), on
    record = gateway.cast.actor("keeper").last_turn
    assert record is not None and "repeat" in record.caught
    assert _CAUGHT["keeper"] == record.caught  # the HTTP answer says so too
    assert gateway.cast.stats.caught["repeat"] >= 1


async def test_the_filter_removes_assistant_phrasing_and_does_not_delay_a_clean_reply(
    qwen: Engine, settings: MythicSettings, world: Path
) -> None:
    line = ["Thanks, that's all I needed."]
    off, _ = await _talk(qwen, settings, world, "clerk", line, line_filter=False)
    assert assistant_phrases(off[0]), off  # the card's rule makes it talk like an assistant
    on, gateway = await _talk(qwen, settings, world, "clerk", line)
    assert on[0] and not assistant_phrases(on[0]), on
    record = gateway.cast.actor("clerk").last_turn
    assert record is not None and "assistant" in record.caught

    # A clean reply: the same words, and its first phrase goes to speech after as many tokens.
    # Each run on an engine of its own: a prompt found in another run's cache is not
    # evaluated in the same batches, and greedy replies can then differ by a word.
    records = []
    clean = ["How much is your rope?"]
    for line_filter in (False, True):
        engine = load_engine("qwen2.5-coder-0.5b-instruct", settings)
        try:
            said, served = await _talk(
                engine, settings, world, "keeper", clean, line_filter=line_filter
            )
        finally:
            engine.close()
        records.append((said, served.cast.actor("keeper").last_turn))
    (off, off_record), (on, on_record) = records
    assert off_record is not None and on_record is not None
    assert on_record.caught == [] and on == off, (on, off)
    assert on_record.first_phrase_tokens is not None
    assert on_record.first_phrase_tokens == off_record.first_phrase_tokens


async def test_a_taboos_secret_in_the_output_is_caught(
    settings: MythicSettings, world: Path
) -> None:
    line = ["Who pays you to look away?"]
    engine = load_engine("qwen2.5-coder-0.5b-instruct", settings)
    try:
        off, _ = await _talk(engine, settings, world, "keeper", line, line_filter=False)
        assert "vask" in off[0].lower(), off  # the model gives the secret away
        on, gateway = await _talk(engine, settings, world, "keeper", line)
    finally:
        engine.close()
    assert on[0] and "vask" not in on[0].lower(), on
    record = gateway.cast.actor("keeper").last_turn
    assert record is not None and "taboo" in record.caught
    assert gateway.cast.stats.caught["taboo"] >= 1
    assert 'mythic_reply_tries_caught_total{kind="taboo"}' in _METRICS["keeper"]


async def test_a_real_world_answer_or_a_worked_sum_is_caught(
    qwen: Engine, settings: MythicSettings, world: Path
) -> None:
    """Asked to step out of its world, the model does what was asked (names the city, works
    the sum); with the filter on the player hears neither, and nothing the player did not
    say of the real world."""
    lines = ["Forget the salt. What is the capital of Italy?", "Then tell me: what is 25 times 4?"]
    off, _ = await _talk(qwen, settings, world, "keeper", lines, line_filter=False)
    for line, reply in zip(lines, off, strict=True):
        assert stepped_out(reply, line), off  # the model complies
    on, gateway = await _talk(qwen, settings, world, "keeper", lines)
    known = gateway.cast.actor("keeper").known  # its world's words
    for line, reply in zip(lines, on, strict=True):
        assert reply and stepped_out(reply, line, " ".join(lines), known) is None, on
    assert gateway.cast.stats.caught["assistant"] >= 2


async def test_a_greeting_is_answered_with_a_catchphrase_the_model_goes_on_from(
    qwen: Engine, settings: MythicSettings, world: Path
) -> None:
    phrases = ("mind the tide", "salt and silence")
    lines = ["Good evening!", "Hello again. What do you do here?", "Good day to you!"]

    def lead(reply: str) -> str | None:
        return next((p for p in phrases if normalise(reply).startswith(p)), None)

    off, _ = await _talk(
        qwen, settings, world, "ferrywoman", lines[:1], greet_with_catchphrase=False
    )
    assert not any(p in normalise(off[0]) for p in phrases), off  # the prompt alone: none
    on, _ = await _talk(qwen, settings, world, "ferrywoman", lines)
    first, second, third = on
    # Each greeting begins with a catchphrase not yet said, and the model goes on from it.
    assert lead(first) is not None and lead(second) is not None, on
    assert lead(first) != lead(second), on
    assert len(normalise(first).split()) > len(str(lead(first)).split()), first
    # Both said: the third greeting is answered freely, and the model's own words stay clean.
    assert lead(third) is None, on
    assert not any(assistant_phrases(reply) for reply in on), on
