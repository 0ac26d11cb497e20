"""Scenes over the real server (uvicorn on loopback) and the real embedded models: who
answers a line, who hears it, joining and leaving, barge-in, NPCs talking among themselves
(ambient lines, which never hold a player's line back), and what bad scene messages get."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mythic.config import MythicSettings
from mythic.contracts import (
    Error,
    LLMStreamDelta,
    SceneEnd,
    SceneState,
    SceneTurn,
    ServerMessage,
    parse_server_message,
)
from mythic.dialogue._session import HEARD
from mythic.engine import Engine, Priority
from mythic.server import Gateway
from tests.conftest import EXAMPLE_WORLD
from tests.integration.conftest import load_engine
from tests.integration.test_server import _raw, _start, running

pytestmark = pytest.mark.integration

WAIT = 180  # seconds: a bound on every wait, far above what any of these takes
TAVERN = ("marla", "captain_strand", "countess_isolde")


@pytest.fixture
async def server(
    smollm: Engine, qwen: Engine, settings: MythicSettings
) -> AsyncIterator[tuple[str, Gateway]]:
    # SmolLM2 talks (fast); Qwen 0.5B decides (gold: the scene's speaker selector too).
    async with running(
        (smollm, qwen),
        settings,
        chat={"max_tokens": 24, "temperature": 0.0},
        dialogue={"decide": False},
        scenes={"max_members": 4},
    ) as served:
        yield served


def frame(kind: str, **fields: Any) -> str:
    return json.dumps({"schema_version": "v1", "type": kind, **fields})


async def recv(ws: Any) -> ServerMessage:
    async with asyncio.timeout(WAIT):
        return parse_server_message(await ws.recv())


async def until_type(ws: Any, kind: type[Any]) -> Any:
    """Messages up to the first of `kind`."""
    while True:
        message = await recv(ws)
        if isinstance(message, kind):
            return message


async def replies(ws: Any, turns: int) -> tuple[list[SceneTurn], list[LLMStreamDelta]]:
    """Everything up to the final deltas of `turns` replies and the `SceneTurn` of no
    speakers that closes a line's replies (waited for: every line's replies end with one,
    left out of what is returned): the scene's turns and the deltas, in the order they
    came."""
    seen: list[SceneTurn] = []
    deltas: list[LLMStreamDelta] = []
    finals, closed = 0, False
    while finals < turns or not closed:
        message = await recv(ws)
        if isinstance(message, SceneTurn):
            if finals >= turns and not message.speakers and message.chosen_by == "nobody":
                closed = True
            else:
                seen.append(message)
        elif isinstance(message, LLMStreamDelta):
            deltas.append(message)
            finals += message.final
        elif isinstance(message, Error):
            raise AssertionError(f"unexpected error {message}")
    return seen, deltas


def heard(gateway: Gateway, npc_id: str, session_id: str) -> str:
    """Everything in the NPC's history of the session."""
    actor = gateway.cast.actors.get(npc_id)
    if actor is None:
        return ""
    return "\n".join(m.content for m in actor.histories.get(session_id, []))


async def open_scene(ws: Any, session: str, scene: str, npcs: tuple[str, ...], **more: Any) -> None:
    await ws.send(frame("SceneStart", scene_id=scene, session_id=session, npcs=list(npcs), **more))
    state = await until_type(ws, SceneState)
    assert state.npcs == npcs and state.players == (session,)


async def test_the_npc_a_line_names_answers_first_and_the_others_hear_it_in_turn(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "tavern", TAVERN, max_exchanges=0)
        line = "Captain Strand, when does the curfew begin?"
        await ws.send(
            frame("SceneLine", scene_id="tavern", session_id=session, turn_id="t-1", text=line)
        )
        turns, deltas = await replies(ws, 1)
        assert [(t.speakers, t.turn_ids, t.chosen_by) for t in turns] == [
            (("captain_strand",), ("t-1",), "name")
        ]
        # One NPC answers, alone: every delta is the captain's, of the player's turn.
        assert {(d.npc_id, d.turn_id) for d in deltas} == {("captain_strand", "t-1")}
        reply = "".join(d.delta for d in deltas).strip()
        assert reply and deltas[-1].finish_reason in ("stop", "length")
        # The others heard the line and the reply; the captain has them as its own exchange.
        for npc_id in ("marla", "countess_isolde"):
            history = heard(gateway, npc_id, session)
            assert HEARD in history and f"The player: {line}" in history
            assert f"Edda Strand: {' '.join(reply.split())}" in history
        captain = gateway.cast.actors["captain_strand"].histories[session]
        assert [m.content for m in captain if m.role == "user"] == [line]
        # An NPC of the world outside the scene heard nothing.
        assert heard(gateway, "grisk", session) == ""

        # The player faces the countess and names nobody: `to` picks her.
        await ws.send(
            frame(
                "SceneLine",
                scene_id="tavern",
                session_id=session,
                turn_id="t-2",
                text="And what brings you here tonight?",
                to="countess_isolde",
            )
        )
        turns, deltas = await replies(ws, 1)
        assert turns[0].speakers == ("countess_isolde",) and turns[0].chosen_by == "to"
        assert {d.npc_id for d in deltas} == {"countess_isolde"}


async def test_a_line_that_names_nobody_goes_to_the_selectors_pick(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "gate", TAVERN, max_exchanges=0)
        await ws.send(
            frame(
                "SceneLine",
                scene_id="gate",
                session_id=session,
                turn_id="g-1",
                text="Who keeps order in this city at night?",
            )
        )
        turns, deltas = await replies(ws, 1)
        # The gold selector (Qwen 0.5B, constrained to the scene's NPCs or nobody) decided,
        # and a question is answered by one of them.
        assert turns[0].chosen_by == "selector" and gateway.scenes.selector_failures == 0
        assert len(turns[0].speakers) == 1 and turns[0].speakers[0] in TAVERN
        assert {d.npc_id for d in deltas} == set(turns[0].speakers)


async def test_an_npc_outside_the_scene_knows_nothing_of_it(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "booth", ("marla", "captain_strand"), max_exchanges=0)
        secret = "Marla, the password for the cellar is bluefin."
        await ws.send(
            frame("SceneLine", scene_id="booth", session_id=session, turn_id="b-1", text=secret)
        )
        _, deltas = await replies(ws, 1)
        said = "".join(d.delta for d in deltas).strip()
        assert "bluefin" in heard(gateway, "captain_strand", session)
        # Grisk was never in the scene: asked about it, his prompt has none of it.
        await ws.send(
            frame(
                "PlayerUtterance",
                npc_id="grisk",
                session_id=session,
                turn_id="b-2",
                text="What is the password for the cellar Marla keeps?",
            )
        )
        while not (await until_type(ws, LLMStreamDelta)).final:
            pass
        turn = gateway.cast.actors["grisk"].last_turn
        assert turn is not None and turn.turn_id == "b-2"
        grisk = heard(gateway, "grisk", session)
        assert "bluefin" not in grisk and HEARD not in grisk
        assert said[:40] not in grisk


async def test_an_npc_named_in_a_reply_answers_it_and_the_exchanges_are_bounded(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "square", ("marla", "captain_strand"), max_exchanges=1)
        # Whatever Marla says, the selector is not needed: she is named. When her reply names
        # the captain, the captain answers her (one exchange at most), and then the scene waits.
        line = "Marla, tell me what you think of Captain Strand and the Watch."
        await ws.send(
            frame("SceneLine", scene_id="square", session_id=session, turn_id="q-1", text=line)
        )
        scene = gateway.scenes.scenes["square"]
        await until_type(ws, SceneTurn)
        assert scene.chain is not None
        async with asyncio.timeout(WAIT):
            await scene.chain  # every reply to the line has been played
        said = [r for r in scene.log if r.speaker != "player"]
        assert 1 <= len(said) <= 2  # Marla, and the captain at most once (max_exchanges 1)
        more, deltas = await replies(ws, len(said))
        assert said[0].speaker == "marla" and said[0].turn_id == "q-1"
        if len(said) == 2:  # her reply named the captain: he answered her
            assert [(t.turn_id, t.speakers, t.turn_ids, t.chosen_by) for t in more] == [
                ("q-1", ("captain_strand",), ("q-1.1",), "name")
            ]
            assert {d.turn_id for d in deltas if d.npc_id == "captain_strand"} == {"q-1.1"}
            users = [
                m.content
                for m in gateway.cast.actors["captain_strand"].histories[session]
                if m.role == "user"
            ]
            assert users == [f"Marla: {said[0].text}"]
        else:
            assert more == [] and {d.npc_id for d in deltas} == {"marla"}
        # Nothing more comes: the bound holds (no third turn within a generous wait).
        await ws.send(frame("SceneLeave", scene_id="square", session_id=session, npc_id="marla"))
        state = await until_type(ws, SceneState)
        assert state.npcs == ("captain_strand",)


async def test_an_npc_joining_mid_scene_hears_only_what_comes_after(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "cellar", ("marla", "captain_strand"), max_exchanges=0)
        before = "Marla, the heron sings at midnight."
        await ws.send(
            frame("SceneLine", scene_id="cellar", session_id=session, turn_id="c-1", text=before)
        )
        await replies(ws, 1)
        await ws.send(frame("SceneJoin", scene_id="cellar", session_id=session, npc_id="bran"))
        state = await until_type(ws, SceneState)
        assert state.npcs == ("marla", "captain_strand", "bran")
        after = "Captain, the boats are at Heron's Landing."
        await ws.send(
            frame("SceneLine", scene_id="cellar", session_id=session, turn_id="c-2", text=after)
        )
        await replies(ws, 1)
        bran = heard(gateway, "bran", session)
        assert after in bran and "heron sings" not in bran
        assert before in heard(gateway, "captain_strand", session)
        # Bran leaves; what is said next he does not hear, what he heard stays his.
        await ws.send(frame("SceneLeave", scene_id="cellar", session_id=session, npc_id="bran"))
        await until_type(ws, SceneState)
        last = "Marla, one more ale."
        await ws.send(
            frame("SceneLine", scene_id="cellar", session_id=session, turn_id="c-3", text=last)
        )
        await replies(ws, 1)
        bran = heard(gateway, "bran", session)
        assert after in bran and last not in bran
        assert last in heard(gateway, "captain_strand", session)


async def test_a_new_line_stops_the_npc_speaking_not_the_scene(
    server: tuple[str, Gateway],
) -> None:
    address, _ = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "hall", ("marla", "captain_strand"), max_exchanges=0)
        await ws.send(
            frame(
                "SceneLine",
                scene_id="hall",
                session_id=session,
                turn_id="h-1",
                text="Marla, tell me everything about this town, slowly.",
            )
        )
        first = await until_type(ws, LLMStreamDelta)  # Marla has begun
        assert first.npc_id == "marla"
        await ws.send(
            frame(
                "SceneLine",
                scene_id="hall",
                session_id=session,
                turn_id="h-2",
                text="Captain, a word?",
            )
        )
        finals: dict[str, LLMStreamDelta] = {}
        async with asyncio.timeout(WAIT):
            while "h-2" not in finals:
                message = await recv(ws)
                if isinstance(message, LLMStreamDelta) and message.final:
                    finals[message.turn_id] = message
        # Marla's reply ended (cut off, unless it had just finished); the captain answered.
        assert finals["h-1"].finish_reason in ("cutoff", "stop", "length")
        assert finals["h-2"].npc_id == "captain_strand"
        assert finals["h-2"].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("message", "code", "ref"),
    [
        (
            {"type": "SceneStart", "scene_id": "b", "npcs": ["marla", "nobody_here"]},
            "unknown_npc",
            "SceneStart.npcs",
        ),
        (
            {"type": "SceneStart", "scene_id": "b", "npcs": ["marla", "marla"]},
            "invalid_message",
            None,
        ),
        (
            {
                "type": "SceneStart",
                "scene_id": "b",
                "npcs": ["marla", "bran", "grisk", "old_tobin", "father_anselm"],
            },
            "scene_full",
            "SceneStart.npcs",
        ),
        (
            {"type": "SceneStart", "scene_id": "ok", "npcs": ["bran"]},
            "scene_exists",
            "SceneStart.scene_id",
        ),
        (
            {"type": "SceneJoin", "scene_id": "ok", "npc_id": "marla"},
            "already_in_scene",
            "SceneJoin.npc_id",
        ),
        (
            {"type": "SceneJoin", "scene_id": "ok", "npc_id": "grisk"},
            "scene_full",
            "SceneJoin.npc_id",
        ),
        (
            {"type": "SceneJoin", "scene_id": "gone", "npc_id": "bran"},
            "scene_ended",
            "SceneJoin.scene_id",
        ),
        ({"type": "SceneJoin", "scene_id": "never"}, "unknown_scene", "SceneJoin.scene_id"),
        (
            {"type": "SceneLeave", "scene_id": "ok", "npc_id": "grisk"},
            "not_in_scene",
            "SceneLeave.npc_id",
        ),
        (
            {"type": "SceneLine", "scene_id": "ok", "turn_id": "x-1", "text": "Hi", "to": "grisk"},
            "not_in_scene",
            "SceneLine.to",
        ),
        (
            {"type": "SceneLine", "scene_id": "gone", "turn_id": "x-2", "text": "Hi"},
            "scene_ended",
            "SceneLine.scene_id",
        ),
        (
            {"type": "SceneAmbient", "scene_id": "ok", "turn_id": "a-1", "opener": "grisk"},
            "not_in_scene",
            "SceneAmbient.opener",
        ),
        (
            {"type": "SceneAmbient", "scene_id": "gone", "turn_id": "a-2"},
            "scene_ended",
            "SceneAmbient.scene_id",
        ),
        (
            {"type": "SceneAmbient", "scene_id": "ok", "turn_id": "a-3", "lines": 0},
            "invalid_message",
            None,
        ),
    ],
)
async def test_bad_scene_messages_get_typed_errors_and_the_scene_goes_on(
    server: tuple[str, Gateway], message: dict[str, Any], code: str, ref: str | None
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "gone", ("bran",))
        await ws.send(frame("SceneEnd", scene_id="gone", session_id=session))
        assert isinstance(await until_type(ws, SceneEnd), SceneEnd)
        await open_scene(ws, session, "ok", ("marla", "bran", "captain_strand", "old_tobin"))
        kind = message.pop("type")
        await ws.send(frame(kind, session_id=session, **message))
        error = await until_type(ws, Error)
        assert (error.code, error.ref if ref else None) == (code, ref), error
        # The scene and its members are unharmed, and the connection goes on.
        assert gateway.scenes.scenes["ok"].npcs == ["marla", "bran", "captain_strand", "old_tobin"]
        await ws.send(
            frame("SceneLine", scene_id="ok", session_id=session, turn_id="ok-1", text="Bran?")
        )
        turns, deltas = await replies(ws, 1)
        assert turns[0].speakers == ("bran",) and deltas[-1].final


async def test_a_session_outside_the_scene_cannot_speak_in_it(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as owner, await _raw(address) as other:
        mine, theirs = await _start(owner), await _start(other)
        await open_scene(owner, mine, "private", ("marla", "bran"))
        await other.send(
            frame("SceneLine", scene_id="private", session_id=theirs, turn_id="o-1", text="Hi?")
        )
        error = await until_type(other, Error)
        assert (error.code, error.ref, error.turn_id) == (
            "not_in_scene",
            "SceneLine.session_id",
            "o-1",
        )
        assert heard(gateway, "marla", mine) == "" and heard(gateway, "marla", theirs) == ""
        # Joined, the other player is in it: both sessions are told who is there.
        await other.send(frame("SceneJoin", scene_id="private", session_id=theirs))
        for ws in (owner, other):
            state = await until_type(ws, SceneState)
            assert state.players == (mine, theirs)
        # The owner's session ends: it leaves; the scene stays for the other.
        await owner.send(frame("SessionEnd", session_id=mine))
        state = await until_type(other, SceneState)
        assert state.players == (theirs,)


FACTIONS = """
factions:
  night_watch:
    name: "the Night Watch"
    description: "The city's guard, who keep the curfew from the tenth bell of evening."
"""
WATCHWORD = (
    "# The watchword\n\nThe Night Watch's watchword this month is bluefin: a watchman who "
    "hears it opens the postern gate after curfew.\n"
)


async def test_a_faction_fact_is_known_to_its_members_and_to_nobody_else(
    smollm: Engine, qwen: Engine, settings: MythicSettings, tmp_path: Path
) -> None:
    world = tmp_path / "ravenmoor"
    shutil.copytree(EXAMPLE_WORLD, world, ignore=shutil.ignore_patterns("probes"))
    (world / "world.yaml").write_text((world / "world.yaml").read_text() + FACTIONS)
    for member in ("captain_strand", "bran"):
        card = world / "npcs" / f"{member}.yaml"
        card.write_text(card.read_text() + "\nfaction: night_watch\n")
    (world / "factions" / "night_watch").mkdir(parents=True)
    (world / "factions" / "night_watch" / "watchword.md").write_text(WATCHWORD)
    async with (
        running(
            (smollm, qwen),
            settings,
            world=world,
            chat={"max_tokens": 16, "temperature": 0.0},
            dialogue={"decide": False},
        ) as (address, gateway),
        await _raw(address) as ws,
    ):
        session = await _start(ws)
        await open_scene(ws, session, "gate", ("captain_strand", "bran", "marla"))
        question = "What is the watchword that opens the postern gate after curfew?"
        for n, npc_id in enumerate(("captain_strand", "bran", "marla")):
            await ws.send(
                frame(
                    "SceneLine",
                    scene_id="gate",
                    session_id=session,
                    turn_id=f"w-{n}",
                    text=question,
                    to=npc_id,
                )
            )
            turns, _ = await replies(ws, 1)
            assert turns[0].speakers == (npc_id,)
            context = gateway.cast.actors[npc_id].last_context
            told = context.content if context is not None else ""
            # Its members are told the faction's lore; Marla, in the same scene, is not.
            assert ("bluefin" in told) == (npc_id != "marla"), (npc_id, told)
        persona = gateway.cast.actors["bran"].system.content
        assert "You belong to the Night Watch" in persona
        assert "Night Watch" not in gateway.cast.actors["marla"].system.content


async def ambient_lines(ws: Any, base: str, count: int) -> list[tuple[SceneTurn, str, str]]:
    """The ambient lines of `base` as they come, up to `count` or the scene's stopping: per
    line, its SceneTurn, what was said and the finish reason."""
    out: list[tuple[SceneTurn, str, str]] = []
    turn: SceneTurn | None = None
    words: list[str] = []
    async with asyncio.timeout(WAIT):
        while len(out) < count:
            message = await recv(ws)
            if isinstance(message, SceneTurn) and message.chosen_by == "ambient":
                turn, words = message, []
            elif isinstance(message, LLMStreamDelta) and message.turn_id.startswith(base):
                words.append(message.delta)
                if message.final:
                    assert turn is not None and message.turn_id == turn.turn_ids[0]
                    out.append((turn, "".join(words).strip(), message.finish_reason or ""))
                    if message.finish_reason not in ("stop", "length"):
                        break
    return out


async def test_npcs_talk_among_themselves_each_line_answered_and_heard_by_the_others(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "bar", TAVERN)
        await ws.send(
            frame(
                "SceneAmbient",
                scene_id="bar",
                session_id=session,
                turn_id="amb",
                lines=4,
                opener="captain_strand",
                topic="the curfew",
            )
        )
        lines = await ambient_lines(ws, "amb", 4)
        assert len(lines) == 4
        # Over: the last line is answered by nobody (a client knows the exchange ended).
        end = await until_type(ws, SceneTurn)
        assert (end.turn_id, end.speakers, end.chosen_by) == ("amb.4", (), "nobody")
        speakers = [turn.speakers[0] for turn, _, _ in lines]
        # The opener starts; nobody answers themself; each line answers the one before.
        assert speakers[0] == "captain_strand"
        assert all(a != b for a, b in itertools.pairwise(speakers))
        assert [t.turn_ids[0] for t, _, _ in lines] == ["amb.1", "amb.2", "amb.3", "amb.4"]
        assert [t.turn_id for t, _, _ in lines] == ["amb", "amb.1", "amb.2", "amb.3"]
        assert all(said and reason in ("stop", "length") for _, said, reason in lines)
        # Each line is heard by the others of the scene, the game's cue by nobody.
        for turn, said, _ in lines:
            for npc_id in TAVERN:
                if npc_id != turn.speakers[0]:
                    assert " ".join(said.split()) in " ".join(
                        heard(gateway, npc_id, session).split()
                    ), (npc_id, said)
        # The cue (asked of the opener as if by Marla) was nobody's words: nobody heard it.
        for npc_id in ("marla", "countess_isolde"):
            assert "What do you make of the curfew?" not in heard(gateway, npc_id, session)
        assert heard(gateway, "grisk", session) == ""
        # A player's line to the scene ends the chatter and is answered.
        await ws.send(
            frame("SceneLine", scene_id="bar", session_id=session, turn_id="p-1", text="Marla?")
        )
        turns, deltas = await replies(ws, 1)
        assert turns[-1].speakers == ("marla",) and deltas[-1].turn_id == "p-1"


@pytest.fixture
def traced(settings: MythicSettings) -> Iterator[Engine]:
    # SmolLM2 as the server would load it (not batch-invariant: a prompt's step is 512
    # tokens, beside other streams 64), tracing its steps.
    engine = load_engine("smollm2-135m-instruct", settings, trace_steps=200_000)
    yield engine
    engine.close()


TOBIN = (
    # Longer than a chunk: beside streams of its own class this prompt would be evaluated 64
    # tokens a step; beside the chatter, in as few steps as alone.
    "Tobin, I rode in from the marsh road tonight, past the drowned chapel and the old toll "
    "bridge, and I saw lanterns moving between the reeds where nobody should be walking at "
    "this hour, three of them, slow, as if they were looking for something they had lost in "
    "the water long ago. The ferryman would not speak of it and the dogs at the inn would "
    "not stop howling. What did you see out there, and what should a stranger make of it?"
)


async def test_ambient_chatter_never_delays_a_players_line_in_the_engines_trace(
    traced: Engine, qwen: Engine, settings: MythicSettings
) -> None:
    # One engine serves both: a scene's NPCs talking among themselves at bronze, and another
    # player's lines to NPCs outside the scene, then to one talking in it. In the engine's
    # trace (steps, not seconds), each of the player's requests has its first token in the
    # fewest steps its prompt allows from its arrival: the chatter never took a step from it.
    trace = traced.trace
    assert trace is not None
    async with (
        running(
            (traced, qwen),
            settings,
            chat={"max_tokens": 24, "temperature": 0.0},
            dialogue={"decide": False},
            server={"warm_npcs": 0},
        ) as (address, _),
        await _raw(address) as chatter,
        await _raw(address) as player,
    ):
        scene_session, mine = await _start(chatter), await _start(player)
        await open_scene(chatter, scene_session, "square", ("marla", "bran", "grisk"))
        await chatter.send(
            frame(
                "SceneAmbient",
                scene_id="square",
                session_id=scene_session,
                turn_id="amb",
                lines=30,
                priority="bronze",
            )
        )
        first = await until_type(chatter, LLMStreamDelta)  # they are talking
        assert first.turn_id == "amb.1"
        asks = [
            ("captain_strand", "Captain, when does the curfew begin?"),
            ("old_tobin", TOBIN),
            ("grisk", "Grisk, what are you selling today?"),  # stops Grisk's chatter
        ]
        for k, (npc_id, text) in enumerate(asks):
            turn = f"p-{k}"
            await player.send(
                frame(
                    "PlayerUtterance",
                    npc_id=npc_id,
                    session_id=mine,
                    turn_id=turn,
                    text=text,
                )
            )
            final = None
            while final is None:
                message = await recv(player)
                if isinstance(message, LLMStreamDelta) and message.final:
                    final = message
            assert final.finish_reason in ("stop", "length"), final
    theirs = [r for r in trace.requests if r.session_id == mine]
    ambient = [r for r in trace.requests if r.session_id == scene_session]
    assert theirs and ambient
    assert {r.priority for r in theirs} == {Priority.SPEAKING}
    assert {r.priority for r in ambient} == {Priority.BRONZE}
    behind = {r.request_id: trace.steps_behind(r.request_id) for r in theirs}
    assert all(b is not None and b <= 1 for b in behind.values()), behind
    # Not vacuous: the chatter ran in the engine's steps beside the player's lines, and one
    # of those lines' prompts took more than a chunk there.
    beside = {r.request_id: trace.shared_with(r.request_id, {Priority.BRONZE}) for r in theirs}
    assert sum(beside.values()) >= 1, beside
    chunks = [
        c.tokens
        for step in trace.steps
        for c in step.chunks
        if beside.get(c.request_id) and c.prefill and len(step.chunks) > 1
    ]
    assert max(chunks) > settings.engine.prefill_chunk, chunks


async def test_npcs_of_a_one_npc_scene_cannot_talk_among_themselves(
    server: tuple[str, Gateway],
) -> None:
    address, gateway = server
    async with await _raw(address) as ws:
        session = await _start(ws)
        await open_scene(ws, session, "alone", ("bran",))
        await ws.send(
            frame("SceneAmbient", scene_id="alone", session_id=session, turn_id="a-1", lines=30)
        )
        error = await until_type(ws, Error)
        assert (error.code, error.ref, error.turn_id) == (
            "too_few_npcs",
            "SceneAmbient.scene_id",
            "a-1",
        )
        # The scene is unharmed: a second NPC joins, and then they talk.
        assert gateway.scenes.scenes["alone"].npcs == ["bran"]
        await ws.send(frame("SceneJoin", scene_id="alone", session_id=session, npc_id="marla"))
        await until_type(ws, SceneState)
        await ws.send(
            frame("SceneAmbient", scene_id="alone", session_id=session, turn_id="a-2", lines=1)
        )
        [(turn, _, reason)] = await ambient_lines(ws, "a-2", 1)
        assert turn.speakers == ("bran",) and reason in ("stop", "length", "")
