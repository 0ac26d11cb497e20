"""The server on a real uvicorn on loopback, with the real embedded model (SmolLM2-135M for
dialogue and decisions), driven through the real client SDK and raw WebSockets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from mythic.client import ConnectionLostError, MythicClient, ToolResult
from mythic.config import (
    EndpointSettings,
    MythicSettings,
    RouteRule,
    TierSettings,
    effective_route,
)
from mythic.contracts import (
    Cutoff,
    Error,
    LLMStreamDelta,
    NPCState,
    PlayerUtterance,
    ToolCall,
    parse_server_message,
)
from mythic.dialogue import INTERRUPTED_NOTE, ReplySink
from mythic.dialogue._decision import Decision
from mythic.dialogue._events import PlayerLine, PrepareLine
from mythic.engine import ChatMessage, Engine
from mythic.knowledge import ANSWER_NOTE, Query, load_world
from mythic.memory import Memory
from mythic.route import EmbeddedEndpoint, Endpoint, Router
from mythic.server import Gateway, serving
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.integration


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll a condition of another thread's state (the engine's) or the server's, bounded."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - no event to wait on across threads
            await asyncio.sleep(0.01)


@pytest.fixture
def engines(smollm: Engine, qwen: Engine) -> tuple[Engine, Engine]:
    """SmolLM2 talks (fast); Qwen 0.5B decides intents and tools (SmolLM2 calls nearly every
    line `navigation`)."""
    return smollm, qwen


def talk_and_decide(settings: MythicSettings, talk: Engine, decide: Engine) -> Router:
    """Dialogue on `talk`; the per-line decision (intent and tool) and the game's intents and
    barks on `decide`, through a tier of its own."""
    route = settings.route.model_copy(
        update={
            "endpoints": {"decide": EndpointSettings(model="decide")},
            "tiers": {
                "gold": TierSettings(endpoints=["decide"], retrieval=False),
                "decide": TierSettings(endpoints=["decide"], tools=True, retrieval=False),
            },
            "rules": [RouteRule(tier="decide", kinds=["tool_decision"])],
        }
    )
    effective = effective_route(settings.model_copy(update={"route": route}))
    endpoints: dict[str, Endpoint] = {
        name: EmbeddedEndpoint(name, endpoint, decide if name == "decide" else talk)
        for name, endpoint in effective.endpoints.items()
    }
    return Router(effective, endpoints)


@contextlib.asynccontextmanager
async def running(
    engines: tuple[Engine, Engine],
    settings: MythicSettings,
    *,
    replies: ReplySink | None = None,
    world: Path = EXAMPLE_WORLD,
    memory: Memory | None = None,
    **sections: dict[str, Any],
) -> AsyncIterator[tuple[str, Gateway]]:
    """A real uvicorn serving the example world on a free loopback port (with `memory`, the
    NPCs remember players; the server starts and closes it)."""
    updates = {
        name: getattr(settings, name).model_copy(update=values) for name, values in sections.items()
    }
    effective = settings.model_copy(update=updates)
    talk, decide = engines
    router = talk_and_decide(effective, talk, decide)
    gateway = Gateway(effective, load_world(world), router=router, replies=replies, memory=memory)
    async with serving(gateway) as (host, port):
        yield f"{host}:{port}", gateway


def _chat(settings: MythicSettings) -> dict[str, Any]:
    del settings
    return {"max_tokens": 40, "temperature": 0.0}


@pytest.fixture
async def server(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> AsyncIterator[tuple[str, Gateway]]:
    async with running(
        engines,
        settings,
        chat=_chat(settings),
        dialogue={"max_concurrent_speakers": 4, "tool_timeout_s": 10.0},
    ) as served:
        yield served


async def done(call: ToolCall) -> ToolResult:
    """The game's side of a tool call: it did it."""
    del call
    return "ok", None


async def _npc(address: str, npc_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        response = await http.get(f"/v1/npcs/{npc_id}")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


async def test_a_turn_with_a_waypoint_tool_call_and_its_ack(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    calls: list[ToolCall] = []

    async def game(call: ToolCall) -> ToolResult:
        calls.append(call)
        return "ok", {"distance_m": 140}

    async with MythicClient(f"ws://{address}/v1/ws", tool_handler=game) as client:
        await client.scene("marla", zone="old_town", time="21:10", objects={"player": 1.2})
        async with asyncio.timeout(120):
            turn = await client.say(
                "marla", "Which way to Blackfen Marsh? Set a waypoint to blackfen_marsh for me."
            )
            events = [event async for event in turn]
        # The history holds the line, the reply, the tool's result and the voiced follow-up.
        history = list(gateway.cast.actors["marla"].histories[client.session_id])
    # The context told (lore, scene), the line, the reply, the tool's result, the voiced
    # follow-up: what the turn told stays with its exchange, so it is not told again.
    assert [m.role for m in history] == ["system", "user", "assistant", "system", "assistant"]
    context = gateway.cast.actors["marla"].last_context
    assert context is not None and "## Scene" in context.content
    assert '"zone":"old_town"' in context.content and "player (1.2 away)" in context.content
    assert history[0] == context
    assert history[3].content == (
        'Game event: set_waypoint {"target": "blackfen_marsh"} -> ok {"distance_m": 140}'
    )
    assert [c.name for c in calls] == ["set_waypoint"], turn.text
    call = calls[0]
    assert call.args == {"target": "blackfen_marsh"}
    assert call.npc_id == "marla" and call.turn_id == turn.turn_id and call.call_id
    deltas = [e for e in events if isinstance(e, LLMStreamDelta)]
    assert [d.seq for d in deltas] == list(range(len(deltas)))
    finals = [d.finish_reason for d in deltas if d.final]
    assert finals[0] == "tool_call" and finals[-1] in ("stop", "length") and len(finals) == 2
    # The ToolCall came after the reply's first segment, and the result was voiced after it.
    tool_at = events.index(call)
    voiced = "".join(e.delta for e in events[tool_at:] if isinstance(e, LLMStreamDelta))
    assert voiced == "There: follow the mark to Blackfen Marsh."  # dialogue.tool_voice template
    status = await _npc(address, "marla")
    assert status["last_turn"]["tool_calls"] == [
        {"name": "set_waypoint", "args": {"target": "blackfen_marsh"}, "status": "ok"}
    ]
    assert status["last_turn"]["intent"] == "navigation"
    assert gateway.cast.stats.tool_calls["ok"] == 1


async def test_a_question_is_told_the_lore_line_that_answers_it_after_it(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """With `dialogue.answer_line`, a question has the lore line retrieved as its answer told
    once more right after the player's line, for this reply only: the history keeps the lore
    message, the line and the reply, not the note. A greeting gets no such line."""
    on = {"answer_line": True}
    async with running(engines, settings, chat=_chat(settings), dialogue=on) as served:
        address, gateway = served
        actor = gateway.cast.actor("marla")
        prompts: list[tuple[ChatMessage, ...]] = []
        generate = actor.turns.generate

        def watched(
            out: Any, history: list[ChatMessage], *tail: ChatMessage, **kw: Any
        ) -> AsyncGenerator[str, None]:
            prompts.append(tail)
            return generate(out, history, *tail, **kw)

        actor.turns.generate = watched  # type: ignore[method-assign]
        async with MythicClient(f"ws://{address}/v1/ws") as client, asyncio.timeout(180):
            greeting = await client.say("marla", "Good evening!")
            await greeting.reply()
            asked = await client.say("marla", "When does the Drowned Lantern close?")
            await asked.reply()
            history = list(actor.histories[client.session_id])
    greeted, question = prompts[0], prompts[-1]
    assert greeted[-1] == ChatMessage("user", "Good evening!")  # nothing after a greeting
    at = question.index(ChatMessage("user", "When does the Drowned Lantern close?"))
    note = question[at + 1]
    assert note.role == "system" and note.content.startswith(ANSWER_NOTE), question
    assert "third bell after midnight" in note.content  # the line that answers it
    assert not any(m.content.startswith(ANSWER_NOTE) for m in history)
    assert sum(m.role == "user" for m in history) == 2


async def test_the_decision_starts_once_the_replys_first_phrase_is_out(
    server: tuple[str, Gateway],
) -> None:
    """The intent and tool decision is a gold request (the reply's steps wait while it runs)
    needed only when the reply ends: it starts once the reply's first phrase has gone to
    speech, so it delays neither the first token nor the first audio; its intent is used."""
    address, gateway = server
    actor = gateway.cast.actor("marla")
    stats = gateway.cast.stats
    phrases_then: list[int] = []
    decide = actor.decider.decide

    def watched(line: PlayerLine) -> Coroutine[Any, Any, Decision | None]:
        phrases_then.append(stats.phrases)  # when the task is created, not when it runs
        return decide(line)

    actor.decider.decide = watched  # type: ignore[method-assign]
    async with MythicClient(f"ws://{address}/v1/ws") as client:
        before = stats.phrases
        async with asyncio.timeout(120):
            turn = await client.say("marla", "Tell me about the cellar and the rooms upstairs.")
            events = [event async for event in turn]
    assert any(isinstance(e, LLMStreamDelta) and e.final for e in events)
    assert stats.phrases - before >= 2, turn.text  # a reply of more than one phrase
    assert len(phrases_then) == 1 and 1 <= phrases_then[0] - before < stats.phrases - before
    assert actor.last_turn is not None and actor.last_turn.intent is not None


async def test_a_reply_frees_its_speaking_slot_while_its_decision_runs(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """With one speaking slot, Bran's reply starts while Marla's reply is over and her
    decision still runs (held here until Bran has spoken): the decision is not speech."""
    async with running(
        engines, settings, chat=_chat(settings), dialogue={"max_concurrent_speakers": 1}
    ) as (address, gateway):
        marla = gateway.cast.actor("marla")
        deciding, go_on = asyncio.Event(), asyncio.Event()
        decide = marla.decider.decide

        async def held(line: PlayerLine) -> Decision | None:
            deciding.set()
            await go_on.wait()
            return await decide(line)

        marla.decider.decide = held  # type: ignore[method-assign]
        async with (
            MythicClient(f"ws://{address}/v1/ws") as first,
            MythicClient(f"ws://{address}/v1/ws") as second,
        ):
            async with asyncio.timeout(120):
                marla_turn = await first.say("marla", "Good evening.")
                await deciding.wait()
                bran_turn = await second.say("bran", "Good evening.")
                spoke = False
                async with contextlib.aclosing(aiter(bran_turn)) as events:
                    async for event in events:
                        if isinstance(event, LLMStreamDelta) and event.delta:
                            spoke = True  # Bran speaks while Marla's decision is held
                            break
                go_on.set()
                await marla_turn.reply()
                await bran_turn.reply()
    assert spoke and bran_turn.text.strip()
    assert marla_turn.text.strip()  # Marla spoke too: she held the slot before her decision
    assert marla.last_turn is not None and marla.last_turn.intent is not None
    assert not gateway.cast.speakers.locked()  # the slot was given back


async def test_an_npc_calls_only_the_tools_its_card_lists(
    engines: tuple[Engine, Engine], settings: MythicSettings, tmp_path: Path
) -> None:
    world = tmp_path / "ravenmoor"
    shutil.copytree(EXAMPLE_WORLD, world)
    card = world / "npcs" / "marla.yaml"
    card.write_text(card.read_text() + "tools: [play_emote]\n")
    async with (
        running(engines, settings, world=world, chat=_chat(settings)) as (address, gateway),
        MythicClient(f"ws://{address}/v1/ws", tool_handler=done) as client,
        asyncio.timeout(120),
    ):
        turn = await client.say(
            "marla", "Which way to Blackfen Marsh? Set a waypoint to blackfen_marsh for me."
        )
        await turn.reply()
    assert turn.tool_calls == [] and turn.finish_reason in ("stop", "length")
    assert gateway.cast.actors["marla"].tools == ["play_emote"]


async def test_the_classifier_decides_a_purchase_and_small_talk(
    engines: tuple[Engine, Engine],
    settings: MythicSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default decider: a purchase from an NPC who can only hand items over gives the
    item the model read from the line; thanks calls nothing; neither waits on a model
    request to be classified; the way to a place of the lore sets a waypoint to its zone.
    Each line's lore is retrieved with the line's own intent."""
    world = tmp_path / "ravenmoor"
    shutil.copytree(EXAMPLE_WORLD, world)
    card = world / "npcs" / "marla.yaml"
    card.write_text(card.read_text() + "tools: [give_item, set_waypoint]\n")
    calls: list[ToolCall] = []

    async def game(call: ToolCall) -> ToolResult:
        calls.append(call)
        return "ok", None

    async with (
        running(engines, settings, world=world, chat=_chat(settings)) as (address, gateway),
        MythicClient(f"ws://{address}/v1/ws", tool_handler=game) as client,
        asyncio.timeout(180),
    ):
        knowledge = gateway.cast.knowledge
        assert knowledge is not None
        context, intents = knowledge.context, list[str | None]()

        def spied(npc_id: str, query: Query, **kw: Any) -> Any:
            intents.append(query.intent)
            return context(npc_id, query, **kw)

        monkeypatch.setattr(knowledge, "context", spied)
        bought = await client.say("marla", "Two mugs of your dark ale for me, here's the coin.")
        await bought.reply()
        thanked = await client.say("marla", "Much appreciated, that's all for tonight.")
        await thanked.reply()
        # A place of the lore, not a zone's name: the way to the zone it is written in.
        asked = await client.say("marla", "Which way to the Bone Market from here?")
        await asked.reply()
        assert gateway.cast.classifier() is not None
    assert [c.name for c in calls] == ["give_item", "set_waypoint"], (bought.text, thanked.text)
    assert "ale" in calls[0].args["item"].lower() and calls[0].args.get("quantity") in (None, 2)
    assert calls[1].args == {"target": "the_catacombs"}
    assert bought.tool_calls == calls[:1] and thanked.tool_calls == []
    stats = gateway.cast.stats.intents
    assert stats["trade"] == 1 and stats["chitchat"] == 1 and stats["navigation"] == 1
    # Each line's lore is retrieved with its own intent, not the last line's.
    assert intents == ["trade", "chitchat", "navigation"]


async def test_an_unanswered_tool_call_is_resent_then_times_out(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    async with running(
        engines,
        settings,
        chat=_chat(settings),
        dialogue={"tool_timeout_s": 0.2, "tool_retries": 2, "tool_voice": "model"},
    ) as (address, gateway):
        async with MythicClient(f"ws://{address}/v1/ws") as client:
            async with asyncio.timeout(120):
                turn = await client.say(
                    "marla", "Which way to Blackfen Marsh? Set a waypoint to blackfen_marsh for me."
                )
                events = [event async for event in turn]
            calls = [e for e in events if isinstance(e, ToolCall)]
            # Sent three times with one call_id (the game de-duplicates), then TOOL_TIMEOUT.
            assert len(calls) == 3 and len({c.call_id for c in calls}) == 1
            errors = [e for e in events if isinstance(e, Error)]
            assert [e.code for e in errors] == ["TOOL_TIMEOUT"]
            assert errors[0].call_id == calls[0].call_id
            assert turn.finish_reason in ("stop", "length")
            # The model voiced the failure after the ToolCalls and the TOOL_TIMEOUT.
            after = events[events.index(errors[0]) :]
            assert any(isinstance(e, LLMStreamDelta) and e.delta for e in after)
            # A late Ack of the settled call is ignored; an Ack of a call never made is not.
            await client.ack(calls[0], "ok")
            await client.ack(calls[0].model_copy(update={"call_id": "c-never-made"}), "ok")
            async with asyncio.timeout(10):
                error = await _next(client, Error)
            assert error.code == "unknown_call" and error.call_id == "c-never-made"
        assert gateway.cast.stats.tool_calls["timeout"] == 1


async def _next(client: MythicClient, kind: type[Any]) -> Any:
    while True:
        event = await client.events.get()
        if isinstance(event, kind):
            return event


async def test_a_cutoff_stops_the_turn_and_a_new_line_barges_in(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    url = f"ws://{address}/v1/ws"
    async with MythicClient(url, tool_handler=done) as client, asyncio.timeout(120):
        turn = await client.say("bran", "Tell me the whole history of Ravenmoor, in detail.")
        async for event in turn:
            if isinstance(event, LLMStreamDelta) and event.delta:
                await turn.cutoff()
        assert turn.finish_reason == "cutoff"
        cut_text = turn.text
        # Barge-in by speaking over the NPC: the first turn is cut off, the second answered.
        first = await client.say("bran", "Tell me everything about the marsh and its dangers.")
        first_events = []
        async for event in first:
            first_events.append(event)
            if isinstance(event, LLMStreamDelta) and event.delta and len(first_events) == 1:
                second = await client.say("bran", "Never mind. Good night!")
        assert first.finish_reason == "cutoff"
        # The server tells the game to stop playing the first turn.
        assert [e.reason for e in first_events if isinstance(e, Cutoff)] == ["barge_in"]
        reply = await second.reply()
        assert second.finish_reason in ("stop", "length") and reply
        history = gateway.cast.actors["bran"].histories[client.session_id]
    # What was said before each cutoff stays in the history, marked, so the next turn knows.
    said = [m.content for m in history if m.role == "assistant"]
    assert said[0] == f"{cut_text.strip()} {INTERRUPTED_NOTE}"
    assert [m.content for m in history if m.role == "user"][-1] == "Never mind. Good night!"
    # What was said, each exchange after the context it told (lore, scene) if any.
    assert {m.role for m in history} <= {"system", "user", "assistant"}
    assert all(
        m.content.startswith(("## Lore", "## More Lore", "## Scene"))
        for m in history
        if m.role == "system"
    )
    await until(lambda: not gateway.engine.metrics().running)


async def test_two_npcs_in_parallel_keep_separate_histories(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    url = f"ws://{address}/v1/ws"
    async with MythicClient(url, tool_handler=done) as client, asyncio.timeout(180):
        marla, grisk = await asyncio.gather(
            client.say("marla", "What does black ale cost?"),
            client.say("grisk", "What do you sell in the Bone Market?"),
        )
        texts = await asyncio.gather(marla.reply(), grisk.reply())
        assert all(texts)
        states: list[NPCState] = []
        while not client.events.empty():
            event = client.events.get_nowait()
            if isinstance(event, NPCState):
                states.append(event)
        for npc_id, line, text in (
            ("marla", "What does black ale cost?", texts[0]),
            ("grisk", "What do you sell in the Bone Market?", texts[1]),
        ):
            history = gateway.cast.actors[npc_id].histories[client.session_id]
            # The context told, the line, the reply, and (when the NPC called a tool) the
            # result and follow-up.
            assert [m.content for m in history if m.role == "user"] == [line]
            assert [m.role for m in history[:3]] == ["system", "user", "assistant"]
            assert "## Lore" in history[0].content and len(history) in (3, 5)
            said = [m.content for m in history if m.role == "assistant"]
            assert all(part.strip() in text for part in said)
        marla_state = await _npc(address, "marla")
        assert marla_state["state"] == "idle"
        assert list(marla_state["history_messages"]) == [client.session_id]
    assert {s.npc_id for s in states} == {"marla", "grisk"}
    # Ending the session forgets its histories.
    assert not gateway.cast.actors["marla"].histories


async def test_resume_after_a_dropped_connection(server: tuple[str, Gateway]) -> None:
    address, gateway = server
    async with MythicClient(f"ws://{address}/v1/ws", backoff_s=0.05, tool_handler=done) as client:
        session_id = client.session_id
        async with asyncio.timeout(120):
            await (await client.say("marla", "Is the tavern open tonight?")).reply()
            turn = await client.say("marla", "And what does a room cost?")
            with pytest.raises(ConnectionLostError):  # noqa: PT012 - the drop happens mid-stream
                async for event in turn:
                    if isinstance(event, LLMStreamDelta) and event.delta:
                        client._ws.transport.abort()  # the network drops mid-turn
            third = await client.say("marla", "Thank you, friend.")
            assert await third.reply()
        assert client.session_id == session_id and client.resumes == 1
        history = gateway.cast.actors["marla"].histories[session_id]
        users = [m.content for m in history if m.role == "user"]
        assert users[0] == "Is the tavern open tonight?" and users[-1] == "Thank you, friend."


async def test_at_most_max_concurrent_speakers_speak_and_phrases_cover_each_reply(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    phrases: dict[str, list[str]] = {}
    done: dict[str, str] = {}

    class Phrases:
        def phrase(self, session_id: str, npc_id: str, turn_id: str, text: str) -> None:
            assert turn_id not in done  # every phrase before the end
            phrases.setdefault(turn_id, []).append(text)

        def reply_done(self, session_id: str, npc_id: str, turn_id: str, reason: str) -> None:
            done[turn_id] = reason

    async with (
        running(
            engines,
            settings,
            replies=Phrases(),
            chat=_chat(settings),
            dialogue={"max_concurrent_speakers": 1, "decide": False},
        ) as (address, _),
        MythicClient(f"ws://{address}/v1/ws") as client,
        asyncio.timeout(180),
    ):
        turns = await asyncio.gather(
            *(client.say(npc, "Good evening! What news?") for npc in ("marla", "bran", "grisk"))
        )
        texts = await asyncio.gather(*(turn.reply() for turn in turns))
        speaking: set[str] = set()
        most = 0
        while not client.events.empty():
            event = client.events.get_nowait()
            if isinstance(event, NPCState):
                if event.state == "speaking":
                    speaking.add(event.npc_id)
                else:
                    speaking.discard(event.npc_id)
                most = max(most, len(speaking))
    assert most == 1  # the others waited, thinking, for the one speaker slot
    for turn, text in zip(turns, texts, strict=True):
        # Every word of the reply reached speech, in order, in phrases.
        assert " ".join(phrases[turn.turn_id]).split() == text.split()
        assert done[turn.turn_id] == turn.finish_reason


async def test_an_intent_request_gets_a_constrained_intent_and_a_short_bark(
    server: tuple[str, Gateway],
) -> None:
    address, _ = server
    async with MythicClient(f"ws://{address}/v1/ws") as client, asyncio.timeout(120):
        await client.scene("grisk", zone="the_catacombs", objects={"player": 2.0, "ghoul_2": 4.5})
        update = await client.intent("grisk", context="the player drew a sword", with_bark=True)
    assert update.npc_id == "grisk" and update.request_id
    assert update.target in (None, "player", "ghoul_2")
    assert 0 <= update.urgency <= 1
    assert update.bark is not None and 1 <= len(update.bark.split()) <= 8


async def test_a_warm_up_evaluates_the_npcs_decision_prompt_before_its_first_line(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """Where the model decides lines (`dialogue.decider: model`)."""
    _, decide = engines  # the per-line decision runs on its own engine here
    model_decides = {"decider": "model"}
    async with running(engines, settings, chat=_chat(settings), dialogue=model_decides) as served:
        address, _ = served
        before = decide.metrics()
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http:
            assert (await http.post("/v1/warmup", json={"npcs": ["old_tobin"]})).status_code == 200
        warmed = decide.metrics()
        # The decision's system prompt (the NPC's tools, the places, the answer's form) was
        # evaluated on the engine that decides...
        assert warmed.prompt_tokens - before.prompt_tokens >= 150
        async with MythicClient(f"ws://{address}/v1/ws", tool_handler=done) as client:
            async with asyncio.timeout(120):
                await (await client.say("old_tobin", "Good evening, how are you?")).reply()
        after = decide.metrics()
        # ...so the first line's decision found it cached (a cold one evaluates all of it).
        assert after.completed > warmed.completed
        assert after.cached_prompt_tokens - warmed.cached_prompt_tokens >= 150


async def test_a_started_server_warms_its_first_npcs_prompts_behind_the_players(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    talk, decide = engines
    before = talk.metrics(), decide.metrics()
    async with running(
        engines, settings, server={"warm_npcs": 2}, dialogue={"decider": "model"}
    ) as (address, gateway):
        assert gateway.ready  # readiness did not wait for the NPCs
        await until(lambda: len(gateway.warmed) == 2, timeout_s=120)
        after = talk.metrics(), decide.metrics()
        async with MythicClient(f"ws://{address}/v1/ws", tool_handler=done) as client:
            async with asyncio.timeout(120):
                await (await client.say(gateway.warmed[0], "Good evening!")).reply()
        line = talk.metrics(), decide.metrics()
    assert gateway.warmed == sorted(gateway.world.npcs)[:2]
    # Each NPC's persona on the dialogue engine and its decision prompt on the deciding one
    # (beside one request per engine that warms the engine itself)...
    for engine in (0, 1):
        assert after[engine].completed - before[engine].completed >= 3
        assert after[engine].prompt_tokens - before[engine].prompt_tokens >= 2 * 150
    # ...and the first line's reply and decision start from them.
    for engine in (0, 1):
        assert line[engine].cached_prompt_tokens - after[engine].cached_prompt_tokens >= 150


async def test_http_endpoints(server: tuple[str, Gateway]) -> None:
    address, _ = server
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http:
        assert (await http.get("/healthz")).json()["status"] == "ok"
        assert (await http.get("/readyz")).status_code == 200
        warm = await http.post("/v1/warmup", json={"npcs": ["marla"]})
        assert warm.status_code == 200 and warm.json()["ready"] is True
        assert (await http.post("/v1/warmup", json={"npcs": ["nobody"]})).status_code == 404
        npcs = (await http.get("/v1/npcs")).json()["npcs"]
        assert "marla" in {n["npc_id"] for n in npcs}
        assert (await http.get("/v1/npcs/nobody")).status_code == 404
        said = await http.post(
            "/v1/npcs/marla/say", json={"text": "Good evening!", "session_id": "alice"}
        )
        assert said.status_code == 200, said.text
        body = said.json()
        assert body["text"] and body["finish_reason"] in ("stop", "length")
        again = await http.post(
            "/v1/npcs/marla/say", json={"text": "Still open?", "session_id": "alice"}
        )
        assert again.status_code == 200
        # Two lines at once on one HTTP conversation: the second barges in on the first, and
        # both requests get their answer (none waits for a turn that will never end).
        both = await asyncio.gather(
            *(
                http.post("/v1/npcs/bran/say", json={"text": text, "session_id": "bob"})
                for text in ("Hello!", "Any news?")
            )
        )
        assert [r.status_code for r in both] == [200, 200]
        assert {r.json()["finish_reason"] for r in both} <= {"stop", "length", "cutoff"}
        # Whichever arrived last was answered in full.
        assert any(r.json()["text"] and r.json()["finish_reason"] != "cutoff" for r in both)
        state = (await http.get("/v1/npcs/marla")).json()
        # Two exchanges, the first after the lore and scene it told; the second told only
        # lore the first had not (if any), and not the unchanged scene again.
        assert state["history_messages"]["http.alice"] in (5, 6)
        assert (await http.post("/v1/npcs/marla/say", json={"text": ""})).status_code == 422
        assert (await http.post("/v1/npcs/marla/say", json={"text": "  \n"})).status_code == 422
        too_long = {"text": "a" * 4001}
        assert (await http.post("/v1/npcs/marla/say", json=too_long)).status_code == 422
        assert (await http.post("/v1/npcs/marla/say", content=b"{nope")).status_code == 422
        metrics = (await http.get("/metrics")).text
        answered = Counter(
            r["finish_reason"] for r in (body, again.json(), *(r.json() for r in both))
        )
        turns = {
            sample.labels["finish"]: sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "mythic_turns"
            for sample in family.samples
            if sample.name == "mythic_turns_total"
        }
        # Each line answered above is counted, under the finish reason its reply gave.
        assert all(turns.get(r, 0) >= n for r, n in answered.items()), (answered, turns)
        assert "mythic_engine_tokens_per_s" in metrics
        parked = [
            sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "mythic_engine_parked_bytes"
            for sample in family.samples
        ]
        assert parked and all(value >= 0 for value in parked)
        tasks = [
            sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "mythic_asyncio_tasks"
            for sample in family.samples
        ]
        assert len(tasks) == 1 and tasks[0] >= 1  # the loop's live tasks (bench/soak.py)


async def test_every_line_gets_one_final_delta_even_one_stopped_before_its_turn_began(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """Lines that come at once barge in on turns that have not taken a step yet, and a cutoff
    drops its player's lines still waiting: each of those lines still ends in a `cutoff`
    final delta (an HTTP caller or an SDK waiting on it is answered), the last line is
    answered in full, and another player's waiting line is neither dropped nor cut."""
    async with running(engines, settings, chat=_chat(settings)) as (_, gateway):
        finals: dict[str, list[str | None]] = {}

        def listen(message: Any) -> None:
            if isinstance(message, LLMStreamDelta) and message.final:
                finals.setdefault(message.turn_id, []).append(message.finish_reason)

        for name in ("alice", "bob"):
            gateway.sessions.open(None, session_id=name).listeners.append(listen)

        def utter(session: str, turn: str) -> None:
            said = PlayerUtterance(npc_id="bran", session_id=session, turn_id=turn, text="Hello!")
            gateway.cast.deliver(session, said)

        # Three lines in one tick: the first two are stopped before their turns begin.
        for turn in ("a-1", "a-2", "a-3"):
            utter("alice", turn)
        await until(lambda: "a-3" in finals, timeout_s=120)
        assert finals["a-1"] == finals["a-2"] == ["cutoff"]
        assert finals["a-3"] in (["stop"], ["length"])

        # A turn running; behind it a line of the same player and one of another player. The
        # player's cutoff stops the turn and drops their waiting line, not the other player's.
        actor = gateway.cast.actor("bran")
        utter("alice", "a-4")
        await until(lambda: actor.machine.state.value != "idle")
        utter("alice", "a-5")
        utter("bob", "b-1")
        gateway.cast.deliver("alice", Cutoff(npc_id="bran", session_id="alice", turn_id="a-4"))
        await until(lambda: "b-1" in finals, timeout_s=120)
        assert finals["a-4"] == finals["a-5"] == ["cutoff"]
        assert finals["b-1"] in (["stop"], ["length"])


# -- bad input ------------------------------------------------------------------------------


async def _raw(address: str) -> Any:
    return await connect(f"ws://{address}/v1/ws", max_size=1 << 24)


async def _recv(ws: Any) -> Any:
    async with asyncio.timeout(30):
        return parse_server_message(await ws.recv())


async def _start(ws: Any) -> str:
    await ws.send('{"schema_version":"v1","type":"SessionStart"}')
    welcome = await _recv(ws)
    assert welcome.type == "Welcome"
    return str(welcome.session_id)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "bad_json"),
        ("[1, 2]", "not_an_object"),
        ('{"schema_version":"v2","type":"PlayerUtterance"}', "bad_schema_version"),
        ('{"schema_version":"v1","type":"Teleport"}', "unknown_type"),
        ('{"schema_version":"v1","type":"Welcome"}', "unexpected_type"),
        ('{"schema_version":"v1","type":"PlayerUtterance","npc_id":"marla"}', "invalid_message"),
        ("x" * 300_000, "frame_too_large"),
    ],
)
async def test_a_bad_frame_gets_a_typed_error_and_the_connection_goes_on(
    server: tuple[str, Gateway], frame: str, code: str
) -> None:
    address, _ = server
    async with await _raw(address) as ws:
        session_id = await _start(ws)
        await ws.send(frame)
        error = await _recv(ws)
        assert isinstance(error, Error) and error.code == code
        # Still served: an intent request on the same connection is answered.
        del session_id
        intent = {"type": "IntentRequest", "npc_id": "marla", "request_id": "r-1"}
        await ws.send(json.dumps({"schema_version": "v1", **intent}))
        while (answer := await _recv(ws)).type != "IntentUpdate":
            pass
        assert answer.request_id == "r-1"


async def test_routing_errors(server: tuple[str, Gateway]) -> None:
    address, _ = server
    async with await _raw(address) as ws:
        line = {"type": "PlayerUtterance", "npc_id": "marla", "turn_id": "t-1", "text": "hi"}
        await ws.send(json.dumps({"schema_version": "v1", **line, "session_id": "s-x"}))
        assert (await _recv(ws)).code == "no_session"
        session_id = await _start(ws)
        await ws.send(json.dumps({"schema_version": "v1", **line, "session_id": "s-other"}))
        assert (await _recv(ws)).code == "unknown_session"
        unknown = {**line, "npc_id": "nobody", "session_id": session_id}
        await ws.send(json.dumps({"schema_version": "v1", **unknown}))
        error = await _recv(ws)
        assert error.code == "unknown_npc" and error.turn_id == "t-1"
        # The refused line's turn still ends, so a client waiting on it is released.
        end = await _recv(ws)
        assert end.type == "LLMStreamDelta" and end.turn_id == "t-1"
        assert end.final and end.finish_reason == "error"
        ack = {"type": "Ack", "ack_of": "ToolCall", "status": "ok", "call_id": "c-nope"}
        await ws.send(json.dumps({"schema_version": "v1", **ack}))
        assert (await _recv(ws)).code == "unknown_call"
        await ws.send(json.dumps({"schema_version": "v1", "type": "SessionStart"}))
        assert (await _recv(ws)).code == "session_started"
        resume = {"type": "SessionStart", "session_id": "s-x", "resume_token": "wrong"}
        async with await _raw(address) as other:
            await other.send(json.dumps({"schema_version": "v1", **resume}))
            assert (await _recv(other)).code == "unknown_session"


async def test_a_flooding_client_is_rate_limited_then_closed_and_others_carry_on(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    async with running(
        engines,
        settings,
        chat=_chat(settings),
        server={"rate_per_s": 5.0, "rate_burst": 5, "max_violations": 20},
    ) as (address, gateway):
        async with (
            await _raw(address) as flood,
            MythicClient(f"ws://{address}/v1/ws", tool_handler=done) as good,
        ):
            await _start(flood)
            scene = json.dumps({"schema_version": "v1", "type": "SceneUpdate", "npc_id": "bran"})
            for _ in range(200):
                with contextlib.suppress(Exception):
                    await flood.send(scene)
            codes = []
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    async for frame in flood:
                        codes.append(parse_server_message(frame).code)
            assert "rate_limited" in codes and codes[-1] == "too_many_errors"
            assert codes.count("rate_limited") <= 3  # one notice per second, not one per frame
            assert flood.close_code == 1008
            async with asyncio.timeout(120):
                assert await (await good.say("bran", "Hello there.")).reply()
        assert gateway.metrics.errors["rate_limited"] >= 15


async def test_a_client_that_disconnects_mid_turn_leaves_nothing_running(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session_id = await _start(ws)
        line = {
            "type": "PlayerUtterance",
            "npc_id": "marla",
            "session_id": session_id,
            "turn_id": "t-1",
            "text": "Tell me a long story.",
        }
        await ws.send(json.dumps({"schema_version": "v1", **line}))
        while (await _recv(ws)).type != "LLMStreamDelta":
            pass
    marla = gateway.cast.actors["marla"]
    await until(lambda: not gateway.engine.metrics().running and marla.busy_session is None)
    assert gateway.cast.actors["marla"].state.value == "idle"
    assert gateway.metrics.open_connections == 0


# -- a line prepared while the player speaks -----------------------------------------------------


async def test_a_line_prepared_while_the_player_speaks_starts_from_its_kv(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """The prompt prepared from partial transcripts (memory, lore for the words so far, the
    KV of everything before the line) is the turn's: when the line comes, only the line and
    the lore it retrieves beyond the prepared lore are evaluated, and that lore is all in
    the prompt, now or in an earlier exchange. Without a warm-up the same line evaluates all
    of it when it comes."""
    talk = engines[0]
    line = "Where can I buy silver in the Bone Market?"
    partial = "Where can I buy"

    async def evaluated(say: Callable[[], Any]) -> int:
        before = talk.metrics()
        await say()
        after = talk.metrics()
        prompt = after.prompt_tokens - before.prompt_tokens
        return prompt - (after.cached_prompt_tokens - before.cached_prompt_tokens)

    # The same line twice a session: the line filter would generate a repeated answer again
    # (a second prompt, with a reminder), in one session and not the other.
    quiet = {"line_filter": False}
    async with (
        running(engines, settings, chat=_chat(settings), dialogue=quiet) as (address, gateway),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):

        async def say(session: str) -> None:
            reply = await http.post(
                "/v1/npcs/marla/say", json={"text": line, "session_id": session}
            )
            assert reply.status_code == 200 and reply.json()["text"], reply.text

        await say("warm")  # both sessions have a history, so both have KV to reuse
        await say("cold")
        actor = gateway.cast.actor("marla")
        gateway.cast.prepare("http.warm", "marla", "Where can")
        gateway.cast.prepare("http.warm", "marla", partial)  # the newest partial wins
        await until(lambda: actor.warm_ups >= 1 and actor.state.name == "IDLE")
        await until(lambda: actor.prefill.task is None or actor.prefill.task.done())
        warm_ups = actor.warm_ups
        gateway.cast.prepare("http.warm", "marla", partial)  # prepared already: no request
        await until(lambda: actor.prefill.task is None or actor.prefill.task.done())
        assert actor.warm_ups == warm_ups
        warm = await evaluated(lambda: say("warm"))
        told = "\n".join(m.content for m in actor.histories["http.warm"] if m.role == "system")
        cold = await evaluated(lambda: say("cold"))
        knowledge = gateway.cast.knowledge
        assert knowledge is not None
        # The turn's lore is retrieved with the line's intent.
        move = actor.character.classified(line)
        intent = move.intent if move is not None else None
        whole = knowledge.context("marla", Query(line, intent), scene=actor.scene.state()).lore
    assert whole is not None
    for fact in whole.splitlines()[1:]:  # every line the whole line retrieves was told
        assert fact in told, fact
    assert cold > warm, (warm, cold)
    # The lore in parts of `prepare_step_tokens`, and one more request for the head at most.
    step = 4 * settings.dialogue.prepare_step_tokens
    parts = -(-4 * (settings.knowledge.lore_tokens + settings.dialogue.more_lore_tokens) // step)
    assert 1 <= warm_ups <= parts + 1


async def test_later_partials_extend_the_prepared_prompt_not_evaluate_it_again(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """A partial of too few words prepares nothing; the first one long enough prepares the
    prompt with its lore, in parts (a `## Lore` message, then `## More Lore` ones, each at
    most `prepare_step_tokens` but for a single long line); a later one that retrieves more
    adds `## More Lore` messages after them, so the engine evaluates only those lines, not
    the lore again; the line then extends that prompt."""
    talk = engines[0]
    session = "http.grow"

    async def prepared(text: str) -> int:
        """Prompt tokens the engine evaluated (not cached) preparing `text`."""
        before = talk.metrics()
        warm_ups, task = actor.warm_ups, actor.prefill.task
        gateway.cast.prepare(session, "marla", text)
        await until(lambda: actor.prefill.task not in (None, task) and actor.prefill.task.done())
        after = talk.metrics()
        if actor.warm_ups == warm_ups:
            return 0
        prompt = after.prompt_tokens - before.prompt_tokens
        return prompt - (after.cached_prompt_tokens - before.cached_prompt_tokens)

    async with (
        running(engines, settings, chat=_chat(settings)) as (address, gateway),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):
        actor = gateway.cast.actor("marla")
        reply = await http.post("/v1/npcs/marla/say", json={"text": "Hello.", "session_id": "grow"})
        assert reply.status_code == 200, reply.text
        await until(lambda: actor.prefill.task is None or actor.prefill.task.done())  # the settle
        assert await prepared("Where is") == 0 and actor.sessions[session].prepared is None
        first = await prepared("Where is the old mill")
        base = actor.sessions[session].prepared
        assert first > 0 and base.lore and base.message is not None
        step = 4 * settings.dialogue.prepare_step_tokens
        for part in (base.message, *base.more):
            section = part.content.split("\n\n")[0]
            assert len(section) <= step or len(_facts(section)) == 1, part.content
        later = await prepared("Where is the old mill and who guards the cathedral crypt")
        grown = actor.sessions[session].prepared
        assert grown.message == base.message and grown.more[: len(base.more)] == base.more
        added = grown.more[len(base.more) :]
        assert added and all(m.content.startswith("## More Lore") for m in added), grown
        # Only the added messages are evaluated (each with its role's few template tokens),
        # not the prepared lore again.
        tokenize = talk.backend.tokenize
        new = sum(len(tokenize(m.content, add_special=False, parse_special=False)) for m in added)
        assert 0 < later <= new + 8 * len(added), (first, later, new)
        budget = settings.knowledge.lore_tokens + settings.dialogue.more_lore_tokens
        assert len(grown.lore or "") <= 4 * budget
        reply = await http.post(
            "/v1/npcs/marla/say",
            json={
                "text": "Where is the old mill and who guards the cathedral crypt?",
                "session_id": "grow",
            },
        )
        assert reply.status_code == 200, reply.text
    told = [m.content for m in actor.histories[session] if m.role == "system"]
    assert base.message is not None and base.message.content in told
    assert all(m.content in told for m in grown.more)  # the turn extended the prepared prompt


def _facts(told: str) -> list[str]:
    """The lore lines of a context message (no headers, no `From ...:` sources, no scene)."""
    lore = [s for s in told.split("\n\n") if s.startswith(("## Lore", "## More Lore"))]
    return [
        line
        for section in lore
        for line in section.splitlines()[1:]
        if not (line.startswith("From ") and line.endswith(":"))
    ]


async def test_a_spoken_line_waits_for_no_more_lore_than_more_lore_tokens(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """A spoken line with nothing prepared tells the most relevant of its lore, at most
    `more_lore_tokens` of it (all evaluated after the player stopped); the same line typed
    tells all of it. A spoken line that comes while a part of the prepared lore is being
    evaluated stops that part (its warm-up task is cancelled) rather than wait for it, and
    tells no more lore than that either (a part of 4096 tokens never finishes first): the
    first lines of the part stopped, in its order, so that its prompt begins as the part's
    did and finds what the part evaluated cached (its running step finished, not undone)."""
    line = "Where can I buy silver in the Bone Market?"
    budget = 4 * settings.dialogue.more_lore_tokens
    # The line filter off: a reply it cuts short reports no prompt tokens (they come with the
    # engine's last delta), and this test counts the cached ones.
    dialogue = {"prepare_step_tokens": 4096, "line_filter": False}
    async with running(engines, settings, chat=_chat(settings), dialogue=dialogue) as (_, gateway):
        actor = gateway.cast.actor("marla")

        def utter(session: str, turn: str, *, spoken: bool) -> None:
            said = PlayerUtterance(npc_id="marla", session_id=session, turn_id=turn, text=line)
            gateway.cast.deliver(session, said, spoken=spoken)

        async def answered(session: str, turn: str) -> str:
            """The context the turn `turn` told, once it is over (and its settle)."""
            # Bounded generously: a typed line tells all its lore (a slow machine takes a while).
            await until(
                lambda: actor.last_turn is not None and actor.last_turn.turn_id == turn, 240.0
            )
            await until(lambda: actor.prefill.task is None or actor.prefill.task.done(), 120.0)
            assert actor.last_turn is not None and actor.last_turn.finish in ("stop", "length")
            return "\n\n".join(m.content for m in actor.histories[session] if m.role == "system")

        utter("typed", "t-1", spoken=False)
        typed = _facts(await answered("typed", "t-1"))
        utter("spoken", "s-1", spoken=True)
        spoken = _facts(await answered("spoken", "s-1"))
        assert spoken and spoken[0] == typed[0] and set(spoken) < set(typed), (spoken, typed)
        assert len("\n".join(spoken)) <= budget < len("\n".join(typed))

        # Mid-preparation: the lore (one part) is being evaluated when the line comes.
        talk = engines[0]
        gateway.cast.prepare("spoken", "marla", "Where can I buy silver")
        await until(lambda: actor.prefill.part is not None and bool(talk._decoding))
        stopped = actor.prefill.part
        part = talk._active[next(iter(talk._decoding))]
        cached = gateway.cast.stats.reply_cached_tokens
        warm = actor.prefill.task
        utter("spoken", "s-2", spoken=True)
        told = await answered("spoken", "s-2")
        reused = gateway.cast.stats.reply_cached_tokens - cached
    assert warm is not None and warm.cancelled()
    assert stopped is not None and stopped.lore is not None
    new = _facts(told)[len(spoken) :]
    assert new and len("\n".join(new)) <= budget
    assert new == _facts(stopped.lore)[: len(new)]  # the part's first lines, in its order
    # Past the tokens the part found cached: its first step's, at least in part.
    assert reused >= part.cached + 16, (reused, part.cached)


async def test_the_players_pause_stops_preparing_and_the_line_starts_from_the_part(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """At the player's pause (the voice layer's `Cast.paused`) a part of lore being evaluated
    is stopped there, not when the line comes: the cores go to the final transcript. The
    line then tells the first lines of that part, in its order, as if it had stopped it."""
    line = "Where can I buy silver in the Bone Market?"
    dialogue = {"prepare_step_tokens": 4096, "line_filter": False}
    async with running(engines, settings, chat=_chat(settings), dialogue=dialogue) as (_, gateway):
        actor = gateway.cast.actor("marla")
        talk = engines[0]
        gateway.cast.prepare("spoken", "marla", "Where can I buy silver")
        await until(lambda: actor.prefill.part is not None and bool(talk._decoding))
        stopped, warm = actor.prefill.part, actor.prefill.task
        gateway.cast.paused("spoken", "marla")
        await until(lambda: warm is not None and warm.done())
        assert warm is not None and warm.cancelled()
        assert actor.prefill.stopped == ("spoken", stopped)
        said = PlayerUtterance(npc_id="marla", session_id="spoken", turn_id="s-1", text=line)
        gateway.cast.deliver("spoken", said, spoken=True)
        await until(lambda: actor.last_turn is not None and actor.last_turn.turn_id == "s-1", 240)
        told = "\n\n".join(m.content for m in actor.histories["spoken"] if m.role == "system")
    assert stopped is not None and stopped.lore is not None
    assert actor.prefill.stopped is None
    facts = _facts(told)
    assert facts and facts == _facts(stopped.lore)[: len(facts)], (facts, stopped.lore)


async def test_a_new_sessions_persona_is_evaluated_as_the_player_begins(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """A hint with no words yet (the player began speaking) to a session with no conversation
    has the engine evaluate the prompt's head, persona and memory; the first line then finds
    it cached. A session with a conversation has its KV: no hint of too few words warms it."""
    talk = engines[0]
    session = "http.head"
    async with (
        running(engines, settings, chat=_chat(settings)) as (address, gateway),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):
        actor = gateway.cast.actor("marla")
        before = talk.metrics()
        gateway.cast.prepare(session, "marla", "")
        await until(lambda: actor.warm_ups == 1)
        await until(lambda: actor.prefill.task is not None and actor.prefill.task.done())
        assert actor.sessions[session].head_prepared and actor.sessions[session].prepared is None
        headed = talk.metrics()
        head = headed.prompt_tokens - before.prompt_tokens
        assert head > 100  # the persona card, at least
        reply = await http.post("/v1/npcs/marla/say", json={"text": "Hello.", "session_id": "head"})
        assert reply.status_code == 200, reply.text
        said = talk.metrics()
        # All of the head but the few tokens that open the 1-token reply it generated.
        assert said.cached_prompt_tokens - headed.cached_prompt_tokens >= head - 8
        await until(lambda: actor.prefill.task is None or actor.prefill.task.done())  # the settle
        settled = talk.metrics()
        for text in ("", "Where is"):  # too few words, and a conversation held already
            await actor.prefill.prepare(PrepareLine(session, text))
        assert actor.warm_ups == 1
        assert talk.metrics().prompt_tokens == settled.prompt_tokens  # nothing evaluated


async def test_a_warm_up_never_delays_or_changes_a_turn_already_running(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """A partial that arrives while the NPC answers is dropped; the answer is the same."""
    async with (
        running(engines, settings, chat=_chat(settings)) as (address, gateway),
        MythicClient(f"ws://{address}/v1/ws", timeout_s=60) as client,
    ):
        actor = gateway.cast.actor("marla")
        async with asyncio.timeout(120):
            turn = await client.say("marla", "Tell me about the cellar.")
            await until(lambda: actor.busy_session is not None)
            gateway.cast.prepare(client.session_id, "marla", "And the rooms upstairs?")
            events = [event async for event in turn]
        await until(lambda: actor.state.name == "IDLE")
    assert actor.warm_ups == 0
    assert isinstance(events[-1], LLMStreamDelta) and events[-1].final


async def test_the_prompt_window_keeps_its_start_and_jumps_by_half(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """With `history_turns` 2 the prompt keeps the history from the same exchange from line
    to line (the engine evaluates only what is new) until it has more than 2 exchanges, then
    jumps to the newest one; it never slides by one exchange at every line."""
    talk = engines[0]
    chat = {"max_tokens": 8, "temperature": 0.0, "history_turns": 2}
    async with (
        running(engines, settings, chat=chat) as (address, gateway),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):
        actor = gateway.cast.actor("marla")
        firsts: list[str] = []
        cached: list[int] = []
        for n, line in enumerate(["Hello.", "A room?", "Ale?", "Stew?", "Rules?", "Bye."]):
            before = talk.metrics()
            reply = await http.post("/v1/npcs/marla/say", json={"text": line, "session_id": "w"})
            assert reply.status_code == 200, reply.text
            after = talk.metrics()
            cached.append(after.cached_prompt_tokens - before.cached_prompt_tokens)
            # The reply is settled (its next window evaluated) while the player would listen:
            # wait for that, or the next line races it and the counts depend on timing.
            for _ in range(2400):  # at most 120 s
                if actor.busy_session is None and (
                    actor.prefill.task is None or actor.prefill.task.done()
                ):
                    break
                await asyncio.sleep(0.05)
            history = actor.histories["http.w"]
            starts = actor.window.starts("http.w")
            users = [m.content for m in history[starts[0] :] if m.role == "user"]
            firsts.append(users[0])
            assert len(users) <= 2 and users[-1] == line, (n, users)
    # Windows: [Hello] [Hello, A room?] [Ale?] [Ale?, Stew?] [Rules?] [Rules?, Bye.]
    assert firsts == ["Hello.", "Hello.", "Ale?", "Ale?", "Rules?", "Rules?"]
    # A line whose window kept its start finds the exchanges before it cached; at a jump
    # only the persona is.
    assert cached[2] > cached[3] < cached[4], cached
    assert cached[4] > cached[5], cached


async def test_a_full_context_moves_the_window_by_half_not_one_exchange_a_line(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """Long lines fill the model's context within a few exchanges. Right after a reply whose
    session's next line would overflow, the window drops the older half of what fits (the
    reply is settled while the player listens), and the next line extends that prompt: its
    start, and the engine's cache of it, hold. The window never moves at two lines in a
    row, as it did dropping one exchange whenever the prompt overflowed."""
    talk = engines[0]
    places = ["mill", "bridge", "chapel", "market", "harbour", "tavern", "gate", "crypt"]
    lines = [
        f"Listen, about the {place}: "
        + " ".join(
            f"on day {d} I walked to the {place} and counted {d + 3} crows on its roof."
            for d in range(24)
        )
        for place in places
    ]
    chat = {"max_tokens": 8, "temperature": 0.0, "history_turns": 16}
    async with (
        running(engines, settings, chat=chat) as (address, gateway),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):
        actor = gateway.cast.actor("marla")
        firsts: list[str | None] = []  # the window's first line once the reply is settled
        cached: list[int] = []
        for line in lines:
            before = talk.metrics()
            reply = await http.post("/v1/npcs/marla/say", json={"text": line, "session_id": "f"})
            assert reply.status_code == 200, reply.text
            after = talk.metrics()
            cached.append(after.cached_prompt_tokens - before.cached_prompt_tokens)
            await until(lambda: actor.prefill.task is not None and actor.prefill.task.done())
            actor.prefill.task = None  # the next line's settle is waited for afresh
            history = actor.histories["http.f"]
            starts = actor.window.starts("http.f")
            users = [m.content for m in history[starts[0] :] if m.role == "user"] if starts else []
            firsts.append(users[0] if users else None)
        settled = actor.settled
    # A move drops exchanges (a window that starts with its newest line after an empty one
    # has only grown).
    moved = [n for n in range(1, len(lines)) if None is not firsts[n - 1] != firsts[n]]
    assert moved, "the lines never filled the context: make them longer"
    assert all(b - a > 1 for a, b in itertools.pairwise(moved)), (moved, cached)
    assert settled == len(lines)
    # Every line whose window kept an exchange finds it cached, beyond the persona.
    for n in range(1, len(lines)):
        if firsts[n - 1] is not None:
            assert cached[n] > cached[0], (n, firsts, cached)


async def test_a_settle_that_cannot_fit_its_room_keeps_the_window(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    """A settle asks for room for a whole line's lore; where even the persona leaves less
    (here a lore budget of 8,000 tokens), it fails and the conversation's window keeps every
    exchange: nothing the prompt held is dropped for nothing."""
    chat = {"max_tokens": 8, "temperature": 0.0}
    async with (
        running(engines, settings, chat=chat, knowledge={"lore_tokens": 8000}) as (
            address,
            gateway,
        ),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):
        actor = gateway.cast.actor("marla")
        for line in ("Hello.", "A room?", "Ale?"):
            reply = await http.post("/v1/npcs/marla/say", json={"text": line, "session_id": "s"})
            assert reply.status_code == 200, reply.text
            await until(lambda: actor.prefill.task is not None and actor.prefill.task.done())
            actor.prefill.task = None
        history = actor.histories["http.s"]
        starts = actor.window.starts("http.s")
        users = [m.content for m in history[starts[0] :] if m.role == "user"] if starts else []
    assert users == ["Hello.", "A room?", "Ale?"]
    assert actor.settled == 0
