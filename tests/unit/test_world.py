"""World folders: every malformed card is named with its file, line and field; all or nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mythic.cli._eval import load_probes
from mythic.knowledge import WorldLoadError, load_world

pytestmark = pytest.mark.unit

# Held out: checks that quality work generalises beyond Ravenmoor, never used to tune it.
HELD_OUT_WORLD = Path(__file__).resolve().parents[2] / "examples" / "worlds" / "coldiron"

WORLD_YAML = """\
name: Testholm
description: A small test town.
zones:
  square:
    name: The Square
    description: Cobbles and a well.
"""
GOOD_CARD = """\
name: "Marla, the Barkeep"
archetype: human
style: "wry, concise"
rules: ["Never reveal the tunnel"]
catchphrases: ["friend", "listen"]
voice_id: baritone_02
zone: square
"""


def make_world(root: Path, cards: dict[str, str], lore: dict[str, str] | None = None) -> Path:
    (root / "npcs").mkdir(parents=True)
    (root / "world.yaml").write_text(WORLD_YAML)
    for name, text in cards.items():
        (root / "npcs" / name).write_text(textwrap.dedent(text))
    for rel, text in (lore or {}).items():
        (root / "lore" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "lore" / rel).write_text(text)
    return root


def problems_of(root: Path) -> list[str]:
    with pytest.raises(WorldLoadError) as info:
        load_world(root)
    return [str(p) for p in info.value.problems]


def test_the_example_world_loads(example_world: Path) -> None:
    world = load_world(example_world)
    archetypes = {p.archetype for p in world.npcs.values()}
    assert {"human", "vampire", "werewolf", "zombie", "ghoul", "lich"} <= archetypes
    assert len(world.npcs) >= 6
    assert "marla" in world.npcs
    assert len(world.card.zones) >= 3
    for zone in world.card.zones:
        assert world.lore_for(zone), f"zone {zone} has no lore"
    for persona in world.npcs.values():
        assert persona.zone in world.card.zones


def test_the_held_out_world_loads_with_its_probes() -> None:
    world = load_world(HELD_OUT_WORLD)
    assert not world.skipped
    assert len(world.card.zones) >= 3
    assert len(world.npcs) >= 6
    assert len({p.archetype for p in world.npcs.values()}) >= 4
    for zone in world.card.zones:
        assert world.lore_for(zone), f"zone {zone} has no lore"
    for npc_id, persona in world.npcs.items():
        assert persona.zone in world.card.zones, npc_id
        assert persona.taboos and persona.catchphrases, npc_id
    lore = load_probes(HELD_OUT_WORLD / "probes" / "lore.yaml", "lore", world)
    style = load_probes(HELD_OUT_WORLD / "probes" / "style.yaml", "style", world)
    assert {p.npc for p in lore} == set(world.npcs) == {p.npc for p in style}


def test_a_good_world_with_lore(tmp_path: Path) -> None:
    root = make_world(
        tmp_path,
        {"marla.yaml": GOOD_CARD},
        {
            "square/well.md": "---\ntitle: The Well\ntags: [water]\n---\n# Ignored\nIt is deep.\n",
            "square/bells.md": "# The Bells\nThey ring at dusk.\n",
        },
    )
    world = load_world(root)
    assert world.npc("marla").catchphrases == ["friend", "listen"]
    docs = {d.title: d for d in world.lore_for("square")}
    assert docs["The Well"].tags == ("water",) and docs["The Well"].text.startswith("# Ignored")
    assert "The Bells" in docs
    with pytest.raises(KeyError, match="NPCs: marla"):
        world.npc("bob")


@pytest.mark.parametrize(
    ("card", "expected"),
    [
        ('name: "X"\narchetype: human\n', "x.yaml:1: style: Field required"),
        ('name: "X"\narchetype: human\nstyle: ok\ncatchphrase: ["hi"]\n', "x.yaml:4: catchphrase"),
        (
            'name: "X"\narchetype: human\nstyle: ok\nrules:\n  - fine\n  - [nested]\n',
            "x.yaml:6: rules.1",
        ),
        ('name: "X"\narchetype: Big Vampire\nstyle: ok\n', "x.yaml:2: archetype"),
        (
            'name: "X"\narchetype: human\nstyle: ok\nzone: moon\n',
            "x.yaml:4: zone: Value error, unknown zone 'moon'",
        ),
        ('name: "X"\narchetype: human\nstyle: "unclosed\n', "x.yaml:4: invalid YAML"),
        ("- just\n- a list\n", "x.yaml:1: expected a mapping of fields, got a list"),
        ("", "x.yaml:1: expected a mapping of fields, got empty"),
        (
            'name: ""\narchetype: human\nstyle: ok\n',
            "x.yaml:1: name: String should have at least 1",
        ),
    ],
)
def test_malformed_cards_name_file_line_and_field(tmp_path: Path, card: str, expected: str) -> None:
    root = make_world(tmp_path, {"x.yaml": card})
    assert any(expected in p for p in problems_of(root)), problems_of(root)


def test_nothing_loads_half_way_and_every_problem_is_listed(tmp_path: Path) -> None:
    root = make_world(
        tmp_path,
        {"marla.yaml": GOOD_CARD, "bad.yaml": "name: x\n", "Bad Id.yaml": GOOD_CARD},
        {"nowhere/x.md": "# X\ntext\n", "square/empty.md": "---\ntags: [a]\n---\n"},
    )
    problems = problems_of(root)
    assert any("bad.yaml:1: archetype: Field required" in p for p in problems)
    assert any("bad.yaml:1: style: Field required" in p for p in problems)
    assert any("NPC id 'Bad Id'" in p for p in problems)
    assert any("zone 'nowhere', which world.yaml does not declare" in p for p in problems)
    # A bad lore file is no card problem: it is skipped and reported (tests/unit/test_knowledge).
    assert not any("empty.md" in p for p in problems)


def test_missing_pieces(tmp_path: Path) -> None:
    assert any("not a folder" in p for p in problems_of(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    problems = problems_of(tmp_path / "empty")
    assert any("world.yaml: missing" in p for p in problems)
    assert any("no persona cards" in p for p in problems)


def test_hostile_files(tmp_path: Path) -> None:
    root = make_world(tmp_path, {"marla.yaml": GOOD_CARD})
    (root / "npcs" / "bin.yaml").write_bytes(b"\xff\xfe\x00name")
    (root / "npcs" / "huge.yaml").write_text("name: " + "x" * 300_000)
    (root / "npcs" / "tag.yaml").write_text("name: !!python/object:os.system ls\n")
    (root / "npcs" / "zero.yaml").symlink_to("/dev/zero")
    (root / "npcs" / "dir.yaml").mkdir()
    (root / "npcs" / "deep.yaml").write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    problems = problems_of(root)
    assert any("zero.yaml: not a regular file" in p for p in problems)
    assert any("dir.yaml: not a regular file" in p for p in problems)
    assert any("deep.yaml: invalid YAML: nested too deeply" in p for p in problems)
    assert any("bin.yaml: not UTF-8" in p for p in problems)
    assert any("huge.yaml: 300006 bytes" in p for p in problems)
    assert any("tag.yaml:1: invalid YAML" in p for p in problems)


def test_front_matter_errors(tmp_path: Path) -> None:
    root = make_world(
        tmp_path,
        {"marla.yaml": GOOD_CARD},
        {
            "square/a.md": "---\ntags: [ok]\n# never closed\n",
            "square/b.md": "---\ntags: [Not Ok]\n---\ntext\n",
        },
    )
    # Lore files are reported and skipped; the rest of the world loads.
    problems = [str(p) for p in load_world(root).skipped]
    assert any("a.md:1: front matter opened with --- never closed" in p for p in problems)
    assert any("b.md:1: front matter" in p for p in problems)


def test_a_faction_must_be_declared_by_its_cards_and_its_lore(tmp_path: Path) -> None:
    root = make_world(tmp_path / "w", {"edda.yaml": GOOD_CARD + "faction: night_watch\n"})
    (root / "factions" / "thieves").mkdir(parents=True)
    (root / "factions" / "thieves" / "den.md").write_text("The den is under the mill.\n")
    problems = problems_of(root)
    assert any("edda.yaml" in p and "unknown faction 'night_watch'" in p for p in problems)
    assert any("thieves" in p and "world.yaml does not declare" in p for p in problems)


def test_a_world_calendar_dates_the_game_and_says_how_long_ago() -> None:
    from mythic.knowledge import Calendar, GameDateError

    for world in ("ravenmoor", "coldiron"):
        calendar = load_world(HELD_OUT_WORLD.parent / world).card.calendar
        assert len(calendar.months) == 12
    coldiron = load_world(HELD_OUT_WORLD).card.calendar
    now = coldiron.minutes("11-8-9", "14:30")
    assert coldiron.say(now) == "the 9th of Ashfall, year 11 of the Strike"
    assert coldiron.minutes("11-8-10") - coldiron.minutes("11-8-9") == 1440
    ago = {
        "11-8-9": "earlier today",
        "11-8-8": "yesterday",
        "11-8-5": "4 days ago",
        "11-7-30": "last week",
        "11-7-20": "2 weeks ago",
        "11-5-1": "last summer",
        "11-7-1": "in Harvest",
        "10-8-1": "a year ago",
        "10-4-1": "last year",
        "7-8-1": "4 years ago",
        "11-8-20": "later",  # a save from before: nothing is "ago"
    }
    for date, said in ago.items():
        assert coldiron.ago(coldiron.minutes(date), now) == said, date
    # Left out: the Gregorian months, and "the 1st", "the 22nd", "the 13th".
    gregorian = Calendar()
    assert gregorian.say(gregorian.minutes("5-2-22")) == "the 22nd of February, year 5"
    assert gregorian.say(gregorian.minutes("5-2-13")) == "the 13th of February, year 5"
    for bad, match in (
        ("11-13-1", "12 months"),
        ("11-2-31", "February has 28"),
        ("11-0-1", "month 0"),
        ("eleven", "year-month-day"),
    ):
        with pytest.raises(GameDateError, match=match):
            gregorian.minutes(bad)
    with pytest.raises(GameDateError, match="HH:MM"):
        gregorian.minutes("1-1-1", "25:00")


@pytest.mark.parametrize(
    ("calendar", "expected"),
    [
        ("calendar:\n  months: []\n", "calendar.months: List should have at least 1"),
        ("calendar:\n  months:\n    - {name: Frost, days: 0}\n", "calendar.months.0.days"),
        ('calendar:\n  year: "year of the Strike"\n', "calendar.year: Value error, a year"),
        ('calendar:\n  year: "{n} {y}"\n', "no other braces"),
        ("calendar:\n  weeks: 4\n", "calendar.weeks"),
    ],
)
def test_a_malformed_calendar_names_its_field(tmp_path: Path, calendar: str, expected: str) -> None:
    root = make_world(tmp_path, {"marla.yaml": GOOD_CARD})
    (root / "world.yaml").write_text(WORLD_YAML + calendar)
    assert any(expected in p for p in problems_of(root)), problems_of(root)
