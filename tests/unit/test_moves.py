"""Which place a player's line names, for the tool a way-asking line calls."""

from __future__ import annotations

import pytest

from mythic.dialogue._moves import EXAMPLES, MOVES, place_named, zone_named

pytestmark = pytest.mark.unit

PLACES = {
    "old_town": "Old Town",
    "blackfen_marsh": "Blackfen Marsh",
    "lucky_widow": "The Lucky Widow Mine",
    "hangmans_pass": "Hangman's Pass",
    "cathedral_quarter": "The Cathedral Quarter",
    "the_catacombs": "The Catacombs",
}


@pytest.mark.parametrize(
    ("line", "place"),
    [
        ("Which way to Blackfen Marsh?", "blackfen_marsh"),
        ("How far is hangmans pass from here?", "hangmans_pass"),  # no apostrophe typed
        ("Show me the Lucky Widow.", "lucky_widow"),  # by its id, without "Mine"
        ("Where is the Old Town gate?", "old_town"),
        ("Which way to Black Fen Marsh?", "blackfen_marsh"),  # split by speech recognition
        ("Which way to black than marsh?", "blackfen_marsh"),  # misheard, long name
        ("Take me to the catacomb.", "the_catacombs"),
        ("Where is the cathedral?", "cathedral_quarter"),  # a word only its name has
        ("Which way is the old tower?", None),  # near "Old Town", but a short name
        ("I like blackberries and marshmallows.", None),
        ("Is it far?", None),
        ("", None),
    ],
)
def test_the_place_a_line_names(line: str, place: str | None) -> None:
    assert place_named(line, PLACES) == place


def test_the_longest_name_wins() -> None:
    places = {"town": "Town", "old_town": "Old Town"}
    assert place_named("Lead me to the old town.", places) == "old_town"
    assert place_named("Lead me to town.", places) == "town"


def test_every_move_has_examples_and_a_known_intent() -> None:
    from mythic.dialogue import INTENTS

    assert set(EXAMPLES) == set(MOVES)
    assert all(len(lines) >= 10 for lines in EXAMPLES.values())
    assert {move.intent for move in MOVES.values()} <= set(INTENTS)
    lines = [line.lower() for lines in EXAMPLES.values() for line in lines]
    assert len(lines) == len(set(lines))  # no example under two moves


def test_a_place_in_a_very_long_line_is_still_found_by_name() -> None:
    line = "word " * 2000 + "Blackfen Marsh"
    assert place_named(line, PLACES) == "blackfen_marsh"
    assert place_named("\x00\ufffd" * 500, PLACES) is None


TITLES = [
    ("old_town", "The Drowned Lantern tavern"),
    ("old_town", "Bells, coin and the Night Watch"),
    ("the_catacombs", "The Bone Market"),
    ("cathedral_quarter", "Morvaine House and the Countess"),
]


@pytest.mark.parametrize(
    ("line", "zone"),
    [
        ("Which way to the tavern?", "old_town"),  # a word only one title has
        ("How do I find the Bone Market?", "the_catacombs"),
        ("Take me to Morvaine House.", "cathedral_quarter"),
        ("Where does the Countess live?", "cathedral_quarter"),
        ("Which way to Blackfen Marsh, past the tavern?", "blackfen_marsh"),  # a zone first
        ("Where is the mill?", None),
    ],
)
def test_a_place_in_the_lore_leads_to_its_zone(line: str, zone: str | None) -> None:
    assert zone_named(line, PLACES, TITLES) == zone
    assert zone_named(line, PLACES) == place_named(line, PLACES)
