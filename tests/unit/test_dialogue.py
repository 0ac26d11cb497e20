"""The dialogue layer's model-free parts: mailbox lanes, the state machine, phrase buffering,
tool validation and the decision schema."""

from __future__ import annotations

import asyncio
import json

import pytest

from mythic.dialogue import (
    INTENTS,
    TOOLS,
    TOOLS_BY_INTENT,
    TRANSITIONS,
    DialogueState,
    DialogueStateMachine,
    IllegalTransitionError,
    Lane,
    Mailbox,
    MailboxClosedError,
    MailboxFullError,
    PhraseBuffer,
    ToolArgumentError,
    decision_schema,
    npc_tools,
    validate_call,
)
from mythic.dialogue._phrases import sentences_end

pytestmark = pytest.mark.unit


# -- mailbox --------------------------------------------------------------------------------


async def test_system_events_come_first_then_speech_then_data() -> None:
    box: Mailbox[str] = Mailbox()
    box.put("intent", Lane.DATA)
    box.put("line 1", Lane.SPEECH)
    box.put("cutoff", Lane.SYSTEM)
    box.put("line 2", Lane.SPEECH)
    got = [await box.get() for _ in range(4)]
    assert got == ["cutoff", "line 1", "line 2", "intent"]


async def test_barge_in_drops_speech_and_data_never_system() -> None:
    box: Mailbox[str] = Mailbox()
    for lane, event in [
        (Lane.SPEECH, "a"),
        (Lane.SYSTEM, "scene"),
        (Lane.DATA, "b"),
        (Lane.SYSTEM, "end"),
    ]:
        box.put(event, lane)
    assert box.drop() == ["a", "b"]
    assert len(box) == 2
    assert [await box.get(), await box.get()] == ["scene", "end"]
    with pytest.raises(ValueError, match="never dropped"):
        box.drop(Lane.SYSTEM)


async def test_a_barge_in_drops_only_the_events_it_picks_and_keeps_the_others_in_order() -> None:
    box: Mailbox[str] = Mailbox()
    for event in ["alice 1", "bob 1", "alice 2", "bob 2"]:
        box.put(event, Lane.SPEECH)
    assert box.drop(Lane.SPEECH, where=lambda e: e.startswith("alice")) == ["alice 1", "alice 2"]
    assert [await box.get(), await box.get()] == ["bob 1", "bob 2"]
    assert len(box) == 0


async def test_speech_and_data_are_bounded_system_is_not() -> None:
    box: Mailbox[int] = Mailbox(max_pending=2)
    box.put(1, Lane.SPEECH)
    box.put(2, Lane.SPEECH)
    with pytest.raises(MailboxFullError) as caught:
        box.put(3, Lane.SPEECH)
    assert caught.value.retryable
    box.put(4, Lane.DATA)
    for i in range(100):
        box.put(i, Lane.SYSTEM)
    assert len(box) == 103


async def test_get_waits_for_an_event_and_close_drains_then_stops() -> None:
    box: Mailbox[str] = Mailbox()
    waiter = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    box.put("hello", Lane.SPEECH)
    async with asyncio.timeout(5):
        assert await waiter == "hello"
    box.put("last", Lane.SYSTEM)
    box.close()
    with pytest.raises(MailboxClosedError):
        box.put("late", Lane.SYSTEM)
    assert await box.get() == "last"
    with pytest.raises(MailboxClosedError):
        await box.get()


# -- state machine --------------------------------------------------------------------------


def test_a_whole_turn_and_a_barge_in_follow_the_design() -> None:
    seen: list[DialogueState] = []
    machine = DialogueStateMachine(seen.append)
    for state in ("listening", "thinking", "speaking", "thinking", "speaking", "idle"):
        machine.to(DialogueState(state))
    for state in ("listening", "thinking", "speaking", "barge_in", "listening"):
        machine.to(DialogueState(state))
    machine.to(DialogueState.LISTENING)  # staying put is not a change
    assert [s.value for s in seen] == [
        "listening",
        "thinking",
        "speaking",
        "thinking",
        "speaking",
        "idle",
        "listening",
        "thinking",
        "speaking",
        "barge_in",
        "listening",
    ]


@pytest.mark.parametrize(
    ("start", "to"),
    [("idle", "speaking"), ("idle", "thinking"), ("barge_in", "speaking"), ("idle", "barge_in")],
)
def test_moves_outside_the_design_are_refused(start: str, to: str) -> None:
    machine = DialogueStateMachine()
    machine.state = DialogueState(start)
    with pytest.raises(IllegalTransitionError):
        machine.to(DialogueState(to))
    assert machine.state is DialogueState(start)


def test_every_state_can_get_back_to_idle() -> None:
    for state in DialogueState:
        reachable, frontier = {state}, [state]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in reachable:
                    reachable.add(nxt)
                    frontier.append(nxt)
        assert DialogueState.IDLE in reachable


# -- phrase buffer --------------------------------------------------------------------------


def _feed(buffer: PhraseBuffer, pieces: list[tuple[str, float]]) -> list[str]:
    out: list[str] = []
    for text, now in pieces:
        out += buffer.push(text, now)
    rest = buffer.flush()
    return [*out, rest] if rest else out


def test_a_short_first_sentence_goes_out_at_once() -> None:
    buffer = PhraseBuffer()
    assert buffer.push("Mm-hm. ", 0.0) == ["Mm-hm."]


def test_the_first_phrase_goes_at_its_first_clause_or_sentence() -> None:
    buffer = PhraseBuffer(min_s=0.2, max_s=0.4)
    assert buffer.push("Well, ", 0.0) == []  # one word is no phrase
    assert buffer.push("the tavern opens at dusk, ", 0.01) == ["Well, the tavern opens at dusk,"]
    # Later phrases wait as before: a clause only after max_s.
    assert buffer.push("and the cellar, ", 0.02) == []
    assert buffer.push("never. ", 0.03) == []
    assert buffer.push("Pay ", 0.30) == ["and the cellar, never."]
    assert buffer.flush() == "Pay"
    assert PhraseBuffer().push("The tavern opens at the sixth bell. ", 0.0) == [
        "The tavern opens at the sixth bell."
    ]


def test_a_long_first_sentence_is_cut_after_first_words_where_a_phrase_can_end() -> None:
    text = "Aye the tavern is open tonight and every night until the sixth bell rings. Come "
    # Streamed token by token: nothing goes out while a word may still be growing.
    buffer = PhraseBuffer(first_words=6)
    out: list[str] = []
    sent_at = None
    for i in range(0, len(text), 2):
        out += buffer.push(text[i : i + 2], i * 0.001)
        sent_at = sent_at if sent_at is not None or not out else i + 2
    # It goes once the word after the six is whole (the space after it arrived), not before.
    whole = len("Aye the tavern is open tonight and ")
    assert sent_at is not None and whole <= sent_at < whole + 2
    assert out[0] == "Aye the tavern is open tonight"  # before "and", not after it
    assert out[1:] == []  # the rest is a later phrase: it waits min_s as before
    assert buffer.flush() == "and every night until the sixth bell rings. Come"
    # No clause-opening word: the phrase ends after a word it can end on, never on "the".
    buffer = PhraseBuffer(first_words=6)
    assert buffer.push("The old mill stands beyond the broad river ", 0.0) == [
        "The old mill stands beyond"
    ]
    assert buffer.push("of Ravenmoor. ", 0.05) == []  # later phrases wait as before
    assert buffer.flush() == "the broad river of Ravenmoor."
    # Nothing a phrase can end on: cut at first_words words anyway.
    buffer = PhraseBuffer(first_words=3)
    assert buffer.push("in the of the a ", 0.0) == ["in the of"]
    # A comma or full stop within the words wins, as before; a one-word clause does not.
    assert PhraseBuffer(first_words=6).push("The old mill, past the river bend and ", 0.0) == [
        "The old mill,"
    ]
    assert PhraseBuffer(first_words=6).push("Listen, the marsh at night is no place ", 0.0) == [
        "Listen, the marsh at night"
    ]
    # A whole line pushed at once (a tool's template line) goes whole; a short first
    # sentence goes alone, as before; quotes and dashes do not hide a clause-opening word.
    buffer = PhraseBuffer(first_words=6)
    assert buffer.push("There: follow the mark to The Cathedral Quarter.", 0.0) == []
    assert buffer.flush() == "There: follow the mark to The Cathedral Quarter."
    assert PhraseBuffer(first_words=6).push(
        "Aye. I know the old man who lives by the river ", 0.0
    ) == ["Aye."]
    assert PhraseBuffer(first_words=6).push(
        "I heard the bells ring twice \u201cand then the dead walked ", 0.0
    ) == ["I heard the bells ring twice"]
    # Off (0): the first phrase waits for its first boundary.
    buffer = PhraseBuffer(first_words=0)
    assert buffer.push("Aye the tavern is open tonight and every night until ", 0.0) == []
    # Only the first phrase is cut by words; the text comes out whole and in order.
    words = "one two three four five six seven eight nine ten eleven twelve"
    phrases = _feed(PhraseBuffer(first_words=4), [(words + " ", 0.0), (words + ".", 0.1)])
    assert phrases[0] == "one two three four"
    assert " ".join(phrases).split() == (words + " " + words + ".").split()
    with pytest.raises(ValueError, match="first_words"):
        PhraseBuffer(first_words=2)


def test_sentences_are_held_for_min_s_and_coalesced_two_at_most() -> None:
    buffer = PhraseBuffer(min_s=0.2, max_s=0.4, eager_first=False)
    assert buffer.push("The tavern opens at the sixth bell. ", 0.00) == []
    # Within min_s, a second sentence completes: both go out together.
    assert buffer.push("Curfew falls at ten. Pay ", 0.10) == [
        "The tavern opens at the sixth bell. Curfew falls at ten."
    ]
    assert buffer.push("first, friend. ", 0.35) == ["Pay first, friend."]
    assert buffer.flush() is None


def test_a_long_clause_is_cut_at_a_comma_after_max_s() -> None:
    buffer = PhraseBuffer(min_s=0.2, max_s=0.4)
    assert buffer.push("Listen, the marsh at night is no place for ", 0.0) == []
    assert buffer.push("you, not ", 0.5) == ["Listen, the marsh at night is no place for you,"]
    assert buffer.flush() == "not"


def test_a_sentence_ends_once_the_text_goes_on_after_it() -> None:
    text = "Aye. The road's bad, worse at night! Wolves... Pay"
    assert sentences_end(text, 1) == len("Aye.")
    assert sentences_end(text, 2) == len("Aye. The road's bad, worse at night!")
    assert sentences_end(text, 3) == len("Aye. The road's bad, worse at night! Wolves...")
    assert sentences_end(text, 4) is None  # "Pay" has not ended
    assert sentences_end("Aye.", 1) is None  # nothing after the stop yet: maybe "Aye.."
    assert sentences_end('He said "go." Then ', 1) == len('He said "go."')
    assert sentences_end(text, 0) is None


def test_text_without_punctuation_is_cut_at_max_chars_on_a_space() -> None:
    buffer = PhraseBuffer(max_chars=20)
    phrases = _feed(buffer, [("one two three four five six seven", 0.0)])
    assert phrases[0] == "one two three four"
    assert " ".join(phrases) == "one two three four five six seven"


def test_no_text_is_lost_or_reordered() -> None:
    text = "Aye. The road's bad, worse at night: wolves. Pay three crowns; no more. Go!"
    pieces = [(text[i : i + 3], i * 0.02) for i in range(0, len(text), 3)]
    phrases = _feed(PhraseBuffer(), pieces)
    assert " ".join(phrases).split() == text.split()


# -- tools ----------------------------------------------------------------------------------


def test_the_minimum_tools_exist() -> None:
    assert set(TOOLS) >= {
        "give_item",
        "set_waypoint",
        "open_dialog",
        "play_emote",
        "set_focus",
        "set_marker",
    }


def test_arguments_are_validated_cleaned_and_capped() -> None:
    args = validate_call(
        "give_item", {"item": "  rusty\x00 key\u200b\n of\tthe  cellar ", "to": "p1"}
    )
    assert args == {"item": "rusty key of the cellar", "quantity": 1, "to": "p1"}
    long = validate_call("give_item", {"item": "x" * 200})
    assert len(long["item"]) == 64
    assert validate_call("set_waypoint", {"x": 12.4, "y": 0, "z": -3.1}) == {
        "x": 12.4,
        "y": 0.0,
        "z": -3.1,
    }
    assert validate_call("set_waypoint", {"target": "old_town"}) == {"target": "old_town"}


@pytest.mark.parametrize(
    ("name", "args", "match"),
    [
        ("cast_fireball", {}, "no tool"),
        ("give_item", "key", "JSON object"),
        ("give_item", {}, "item"),
        ("give_item", {"item": "\x00\x01"}, "empty"),
        ("give_item", {"item": "key", "quantity": 1000}, "quantity"),
        ("give_item", {"item": "key", "quantity": "2"}, "quantity"),
        ("give_item", {"item": "key", "gold": 5}, "gold"),
        ("set_waypoint", {}, "target or all of x, y and z"),
        ("set_waypoint", {"x": 1.0, "y": 2.0}, "all of x, y and z"),
        ("set_waypoint", {"x": float("nan"), "y": 0, "z": 0}, "x"),
        ("set_waypoint", {"x": 1e300, "y": 0, "z": 0}, "x"),
        ("set_focus", {"target": "guard 3; DROP TABLE"}, "target"),
        ("play_emote", {"emote": "explode"}, "emote"),
        ("set_marker", {"location": ""}, "location"),
    ],
)
def test_invalid_calls_get_a_typed_error(name: str, args: object, match: str) -> None:
    with pytest.raises(ToolArgumentError, match=match):
        validate_call(name, args)


def test_a_tool_the_npc_does_not_have_is_refused() -> None:
    with pytest.raises(ToolArgumentError, match="no tool"):
        validate_call("give_item", {"item": "key"}, allowed=["play_emote"])


def test_the_decision_schema_exposes_tools_by_intent_with_known_places_only() -> None:
    schema = decision_schema(
        ["set_waypoint", "play_emote", "give_item"],
        places=["old_town", "blackfen_marsh"],
        targets=["player"],
    )
    branches = {b["properties"]["intent"]["const"]: b for b in schema["anyOf"]}
    assert list(branches) == list(INTENTS)
    # Small talk exposes no tool: the model cannot reach for one on "thank you".
    assert branches["chitchat"]["properties"]["action"] == {"type": "null"}
    navigation = branches["navigation"]["properties"]["action"]["anyOf"]
    assert navigation[0] == {"type": "null"}
    assert [c["properties"]["name"]["const"] for c in navigation[1:]] == ["set_waypoint"]
    waypoint = navigation[1]["properties"]["args"]
    assert waypoint["properties"]["target"]["enum"] == ["old_town", "blackfen_marsh"]
    trade = branches["trade"]["properties"]["action"]["anyOf"]
    assert [c["properties"]["name"]["const"] for c in trade[1:]] == ["give_item"]
    for intent, tools in TOOLS_BY_INTENT.items():
        assert set(tools) <= set(TOOLS), intent
    json.dumps(schema)  # plain JSON, for the grammar converter
    # Whatever the schema admits, validation accepts.
    assert validate_call("set_waypoint", {"target": "blackfen_marsh"})
    assert validate_call("give_item", {"item": "key", "quantity": 9})


def test_a_persona_card_chooses_its_tools() -> None:
    assert npc_tools("marla", None) == list(TOOLS)
    assert npc_tools("marla", []) == []
    assert npc_tools("marla", ["set_marker", "give_item"]) == ["give_item", "set_marker"]
    with pytest.raises(ToolArgumentError, match="unknown tools: cast_fireball") as caught:
        npc_tools("marla", ["give_item", "cast_fireball"])
    assert caught.value.fix is not None and "set_waypoint" in caught.value.fix


# -- a spoken line's lore when the player stopped during a prepared part ----------------------


def test_a_stopped_parts_cut_is_a_prefix_of_its_lore_in_its_order() -> None:
    """The cut keeps the part's lines in order while they fit, then stops (a shorter line
    after a long one is not taken: the prompt must begin as the part's did); a source whose
    lines are all cut goes too; a first line too long alone leaves no cut (the line then
    waits for no more lore than `more_lore_tokens` either way)."""
    from mythic.dialogue._context import context_of, stopped_cut
    from mythic.knowledge import lore_beyond

    def _lines_cut(section: str, max_chars: int) -> str:
        first = section.splitlines()[0]
        return lore_beyond(None, section, max_chars=max_chars, header=first, in_order=True) or ""

    long = "| " + "x" * 300
    section = "\n".join(
        ["## Lore", "From Tavern:", "| a cup of ale", long, "| short", "From Mill:", "| wheel"]
    )
    assert _lines_cut(section, 40) == "## Lore\nFrom Tavern:\n| a cup of ale"
    assert _lines_cut(section, 10_000) == section
    assert _lines_cut("## Lore\nFrom Tavern:\n" + long, 40) == ""
    assert stopped_cut(None, context_of("## Lore\nFrom Tavern:\n" + long, None), 40) is None
    assert stopped_cut(None, context_of(section, None), 0) is None
    cut = _lines_cut("## Lore\nFrom Tavern:\n| a\nFrom Mill:\n| a wheel turning", 30)
    assert cut == "## Lore\nFrom Tavern:\n| a"  # no "From Mill:" left without its line

    stopped = context_of(section, "## Scene\nNight.")
    first = stopped_cut(None, stopped, 40)
    assert first is not None and first.scene == stopped.scene
    assert first.lore == "## Lore\nFrom Tavern:\n| a cup of ale"
    assert first.message is not None and stopped.message is not None
    assert stopped.message.content.startswith(first.message.content.split("\n\n")[0])

    # A part extending the finished ones: those, then the first lines of its new lore.
    prepared = context_of("## Lore\nFrom Tavern:\n| a cup of ale", None)
    extension = prepared.extended("## More Lore\nFrom Mill:\n| wheel\n| " + "y" * 80)
    cut_more = stopped_cut(prepared, extension, 40)
    assert cut_more is not None
    assert cut_more.messages[:-1] == prepared.messages
    assert cut_more.messages[-1].content == "## More Lore\nFrom Mill:\n| wheel"
    # Not an extension of what is prepared (another first part): no cut.
    assert stopped_cut(prepared, context_of("## Lore\nFrom Mill:\n| wheel", None), 40) is None
    assert stopped_cut(None, extension, 40) is None
