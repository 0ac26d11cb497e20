"""Knowledge without the embedding model: chunking, token budgets (property-based over random
cards and lore), the drop policy, BM25 retrieval, lore files that cannot be used, probes."""

from __future__ import annotations

import itertools
import string
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mythic.cli._eval import ProbeFileError, load_probes, lore_correct, style_checks
from mythic.config import KnowledgeSettings
from mythic.knowledge import (
    HEADERS,
    Budgets,
    Knowledge,
    LoreDoc,
    Persona,
    Query,
    SceneObject,
    SceneState,
    World,
    WorldCard,
    WorldLoadError,
    answer_line,
    approx_tokens,
    chunk_text,
    fit_tokens,
    load_world,
    lore_beyond,
    pack,
)
from tests.unit.test_world import GOOD_CARD, make_world

pytestmark = pytest.mark.unit


def bm25(tmp_path: Path, **changes: object) -> KnowledgeSettings:
    return KnowledgeSettings(retrieval="bm25", cache_dir=tmp_path / "cache", watch=False, **changes)


def chars(text: str) -> int:
    """A second token counter, unlike approx_tokens: one token per 3 characters."""
    return (len(text) + 2) // 3


# -- tokens and chunks --------------------------------------------------------------------------


def test_fit_tokens_cuts_at_a_space_within_the_budget() -> None:
    text = "The Drowned Lantern opens at the sixth bell of evening and closes late."
    assert fit_tokens(text, 1000, approx_tokens) == text
    cut = fit_tokens(text, 8, approx_tokens)
    assert cut.endswith("...") and approx_tokens(cut) <= 8 and text.startswith(cut[:-3])
    assert fit_tokens(text, 0, approx_tokens) == ""


def test_chunks_respect_size_overlap_and_keep_their_title(tmp_path: Path) -> None:
    body = "\n\n".join(
        f"## Part {i}\n\n" + " ".join(f"Fact {i}.{j} about the marsh road." for j in range(12))
        for i in range(6)
    )
    chunks = chunk_text(
        body, id_prefix="lore/x.md", title="Marsh", source="lore", zone="m", size=64, overlap=16
    )
    assert len(chunks) > 4
    assert [c.id for c in chunks] == [f"lore/x.md#{i}" for i in range(len(chunks))]
    for chunk in chunks:
        assert chunk.lines[0] == "# Marsh"
        assert approx_tokens(chunk.text) <= 64 + 12  # one unit may overshoot by its header
    # Neighbours share their boundary lines (the overlap), and nothing is lost.
    for a, b in itertools.pairwise(chunks):
        assert set(a.lines[1:]) & set(b.lines[1:])
    every = {line for c in chunks for line in c.lines}
    for i in range(6):
        for j in range(12):
            assert any(f"Fact {i}.{j} " in line for line in every)


def test_a_paragraph_is_cut_into_sentences_but_not_at_a_titles_abbreviation() -> None:
    body = (
        "Anselm Crane has been Prior of St. Veyra's Cathedral since 598. Mr. Blackwood owns "
        "the No. 9 drift. It pays 2.5 stakes a ton."
    )
    chunks = chunk_text(body, id_prefix="x.md", title="T", source="lore", zone=None, size=256)
    assert chunks[0].lines[1:] == [
        "Anselm Crane has been Prior of St. Veyra's Cathedral since 598.",
        "Mr. Blackwood owns the No. 9 drift.",
        "It pays 2.5 stakes a ton.",
    ]


def test_a_table_row_says_its_columns_and_a_numbered_item_keeps_its_number() -> None:
    body = (
        "## Prices\n\n| Item | Price | Note |\n|---|:--:|---|\n| A mug of ale | 3 coppers | |\n"
        "| A room | 2 silver | with bread | paid first |\n\nThe rooms are upstairs.\n\n"
        "1. Blades stay at the bar. They are given back at the door.\n"
        "| Loose | row |\n"
    )
    chunks = chunk_text(body, id_prefix="x.md", title="T", source="lore", zone=None, size=256)
    # A small model read the wrong row's number off bare "| ... |" rows.
    assert chunks[0].lines[1:] == [
        "## Prices",
        "A mug of ale, price: 3 coppers",
        "A room, price: 2 silver, note: with bread, paid first",  # a cell past the header
        "The rooms are upstairs.",
        "1. Blades stay at the bar.",
        "They are given back at the door.",
        "| Loose | row |",  # no header above it: left as it is
    ]


# -- packing: budgets are never exceeded ----------------------------------------------------------

words = st.text(alphabet=string.ascii_letters + "  .,'-0123456789", min_size=1, max_size=60)
sentence = st.lists(words, min_size=1, max_size=12).map(" ".join).filter(lambda s: s.strip())


@st.composite
def worlds(draw: st.DrawFn, root: Path) -> World:
    zones = draw(st.lists(st.sampled_from(["dock", "keep", "mire"]), unique=True, max_size=3))
    npcs = {}
    for i in range(draw(st.integers(1, 3))):
        npcs[f"npc{i}"] = Persona(
            name=f"Npc {i}",
            archetype="human",
            style=draw(sentence)[:400] or "plain",
            rules=[r[:400] for r in draw(st.lists(sentence, max_size=8))],
            taboos=[t[:400] for t in draw(st.lists(sentence, max_size=4))],
            catchphrases=[c[:100] for c in draw(st.lists(sentence, max_size=3))],
            backstory=(draw(sentence) * draw(st.integers(1, 5)))[:3900] or None,
            zone=draw(st.sampled_from(zones)) if zones and draw(st.booleans()) else None,
        )
    lore = tuple(
        LoreDoc(
            draw(st.sampled_from([None, *zones])),
            f"Doc {n}",
            "\n\n".join(draw(st.lists(sentence, min_size=1, max_size=30))),
            root / f"doc{n}.md",
            tuple(draw(st.lists(st.sampled_from(["prices", "hours", "npc0"]), max_size=2))),
        )
        for n in range(draw(st.integers(0, 8)))
    )
    card = WorldCard(
        name="Randomholm",
        description="A random place.",
        zones={z: {"name": z.title(), "description": f"The {z}."} for z in zones},
    )
    return World(path=root, card=card, npcs=npcs, lore=lore)


budget = st.integers(0, 300)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_budgets_are_never_exceeded(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("w")
    world = data.draw(worlds(root))
    count = data.draw(st.sampled_from([approx_tokens, chars]))
    s = bm25(
        root,
        persona_tokens=data.draw(budget),
        lore_tokens=data.draw(budget),
        memory_tokens=data.draw(budget),
        scene_tokens=data.draw(budget),
        max_context_tokens=data.draw(st.integers(0, 800)),
        chunk_tokens=data.draw(st.integers(32, 300)),
        chunk_overlap=data.draw(st.integers(0, 31)),
    )
    knowledge = Knowledge(world, s, count=count)
    memory = "## Recent Memory\n" + "\n".join(
        f"- {m}" for m in data.draw(st.lists(sentence, max_size=10))
    )
    scene = SceneState(
        data.draw(st.sampled_from([None, "dock"])),
        data.draw(st.sampled_from([None, "21:10"])),
        tuple(
            SceneObject(f"thing_{i}", d)
            for i, d in enumerate(data.draw(st.lists(st.floats(0, 500), max_size=40)))
        ),
    )
    for npc_id in world.npcs:
        told = knowledge.fit_memory(npc_id, memory)
        packed = knowledge.context(
            npc_id, Query(data.draw(sentence), "trade"), memory=told, scene=scene
        )
        limits = {
            "persona": s.persona_tokens,
            "lore": s.lore_tokens,
            "memory": s.memory_tokens,
            "scene": s.scene_tokens,
        }
        for name, limit in limits.items():
            text = getattr(packed, name)
            assert packed.tokens.get(name, 0) <= limit
            if text is not None:
                assert count(text) <= limit, (name, text)
                assert text.startswith(HEADERS[name])
        assert packed.total <= s.max_context_tokens
        persona = knowledge.persona(npc_id)
        assert persona is None or count(persona) <= min(s.persona_tokens, s.max_context_tokens)
        if told is not None:
            assert count(told) <= s.memory_tokens


def test_over_the_cap_scene_objects_go_first_then_lore(tmp_path: Path) -> None:
    world = load_world(make_world(tmp_path / "w", {"marla.yaml": GOOD_CARD}, LORE))
    scene = SceneState(
        "square", "21:10", tuple(SceneObject(f"guard_{i}", float(i + 1)) for i in range(20))
    )
    roomy = Knowledge(world, bm25(tmp_path, scene_tokens=1000, max_context_tokens=5000))
    full = roomy.context("marla", Query("When does the tavern open?"), scene=scene)
    assert full.dropped["scene"] == 0 and full.lore is not None
    cap = full.total - 40
    tight = Knowledge(world, bm25(tmp_path, scene_tokens=1000, max_context_tokens=cap))
    packed = tight.context("marla", Query("When does the tavern open?"), scene=scene)
    assert packed.total <= cap
    assert packed.dropped["scene"] > 0
    assert packed.tokens["lore"] == full.tokens["lore"]  # lore untouched while scene can give
    # The nearest objects stay; the farthest went first.
    assert packed.scene is not None and "guard_0 (1 away)" in packed.scene
    assert "guard_19" not in packed.scene
    # Tighter: the whole scene goes before any lore does.
    cap = full.tokens["persona"] + 40
    tighter = Knowledge(world, bm25(tmp_path, scene_tokens=1000, max_context_tokens=cap))
    packed = tighter.context("marla", Query("When does the tavern open?"), scene=scene)
    assert packed.total <= cap
    assert packed.scene is None and packed.dropped["scene"] == 20
    assert packed.tokens["lore"] == full.tokens["lore"] and packed.dropped["lore"] == 0
    assert packed.lore is not None and "sixth bell" in packed.lore
    # Tighter still: the lore is trimmed to the lines that fit (here: not its long first one).
    cap = full.tokens["persona"] + 25
    tightest = Knowledge(world, bm25(tmp_path, scene_tokens=1000, max_context_tokens=cap))
    packed = tightest.context("marla", Query("When does the tavern open?"), scene=scene)
    assert packed.total <= cap and packed.scene is None
    assert 0 < packed.tokens["lore"] < full.tokens["lore"] and packed.dropped["lore"] > 0


def test_pack_with_nothing_to_pack() -> None:
    packed = pack(
        persona=None,
        hits=[],
        query="hello",
        memory=None,
        scene=None,
        budgets=Budgets(),
        count=approx_tokens,
    )
    assert packed.total == 0 and packed.text() == ""


# -- BM25 retrieval and lore files ----------------------------------------------------------------

LORE = {
    "square/tavern.md": (
        "---\ntitle: The Tipsy Well\ntags: [tavern, hours, marla]\n---\n# The Tipsy Well\n\n"
        "## Hours\n\n- The Tipsy Well opens at the sixth bell and closes at midnight.\n\n"
        "## Prices\n\n| Item | Price |\n|---|---|\n| Ale | 3 copper |\n"
    ),
    "square/well.md": "# The old well\n\nThe well in the square is forty feet deep and dry.\n",
    "town.md": "# Coins\n\nTwelve copper crowns make one silver crown.\n",
}


def test_a_world_with_no_lore_still_works(tmp_path: Path) -> None:
    world = load_world(make_world(tmp_path / "w", {"marla.yaml": GOOD_CARD}))
    knowledge = Knowledge(world, bm25(tmp_path))
    packed = knowledge.context("marla", Query("Where is the tunnel?"))
    assert packed.persona is not None and "Never reveal the tunnel" in packed.persona
    # The world's premise is lore too, so a world without lore files still answers from it.
    assert packed.lore is None or "small test town" in packed.lore


def test_bm25_finds_the_right_document_and_zone(tmp_path: Path) -> None:
    world = load_world(make_world(tmp_path / "w", {"marla.yaml": GOOD_CARD}, LORE))
    assert {d.zone for d in world.lore} == {"square", None}  # lore/town.md is world-wide
    knowledge = Knowledge(world, bm25(tmp_path))
    hits = knowledge.retrieve("marla", Query("How deep is the well?"))
    assert hits[0].chunk.id == "lore/square/well.md#0"
    hits = knowledge.retrieve("marla", Query("silver crown in copper?"))
    assert hits[0].chunk.id == "lore/town.md#0" and hits[0].chunk.zone is None
    packed = knowledge.context("marla", Query("When do you open?"))
    assert packed.lore is not None and "sixth bell" in packed.lore


def test_the_answer_line_is_the_packed_lore_s_most_relevant_line(tmp_path: Path) -> None:
    world = load_world(make_world(tmp_path / "w", {"marla.yaml": GOOD_CARD}, LORE))
    knowledge = Knowledge(world, bm25(tmp_path))
    packed = knowledge.context("marla", Query("How deep is the well?"))
    assert (
        answer_line(packed.lore, "How deep is the well?")
        == "The well in the square is forty feet deep and dry."
    )
    asked = "When does the Tipsy Well close?"
    packed = knowledge.context("marla", Query(asked))
    # Its list mark is not said: the line is told as a sentence.
    assert (
        answer_line(packed.lore, asked)
        == "The Tipsy Well opens at the sixth bell and closes at midnight."
    )
    # Small talk shares no word with the lore that came first: nothing to answer.
    assert (
        answer_line(knowledge.context("marla", Query("How are you?")).lore, "How are you?") is None
    )
    assert answer_line(None, asked) is None and answer_line("## Lore\nFrom Coins:", asked) is None
    assert (
        answer_line("## Lore\nFrom Rules:\n3. **The fine.** Ten crowns.", "The fine?")
        == "The fine. Ten crowns."
    )
    # A card's own lines retrieved as lore are instructions to the NPC, not the answer.
    card = "## Lore\nFrom About you, Marla:\n- Never reveal the tunnel.\nFrom Coins:\n- Ten bits."
    assert answer_line(card, "How many bits for the tunnel?") == "Ten bits."


def test_bm25_without_bm25s_is_a_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from mythic._errors import MissingExtraError
    from mythic.knowledge._index import _bm25s

    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    with pytest.raises(MissingExtraError, match="bm25s"):
        _bm25s()


def test_bm25_leaves_jax_and_numba_unimported_and_importable(tmp_path: Path) -> None:
    # bm25s imports JAX and Numba when they are installed and runs a JAX operation at
    # import: on an H200 that crashed a server with the CUDA llama.cpp loaded, even with JAX
    # kept on the CPU. Here stand-ins are installed that record their import; a fresh
    # interpreter builds a BM25 index, scores a query, and only then imports them itself.
    for name, extra in (("jax", "from . import lax\n"), ("numba", "def njit(f): return f\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"import pathlib\npathlib.Path({str(tmp_path / (name + '.imported'))!r}).touch()\n"
            + extra
        )
    (tmp_path / "jax" / "lax.py").write_text("def top_k(x, k): return x, k\n")
    script = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from pathlib import Path
from mythic.knowledge._index import _bm25s
bm25s = _bm25s()
model = bm25s.BM25()
model.index([["silver", "crown"], ["copper", "mug"]], show_progress=False)
assert model.get_scores(["crown"])[0] > 0
imported = sorted(p.stem for p in Path({str(tmp_path)!r}).glob("*.imported"))
assert imported == [], imported
assert not bm25s.selection.JAX_IS_AVAILABLE and not bm25s.NUMBA_AVAILABLE
import jax, numba  # the game's own imports still work
assert jax.lax.top_k(1, 1) == (1, 1) and numba.njit(len) is len
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_yaml_lore_and_unusable_files_are_skipped_with_their_name(tmp_path: Path) -> None:
    root = make_world(
        tmp_path / "w",
        {"marla.yaml": GOOD_CARD},
        {
            **LORE,
            "square/guards.yaml": (
                "title: The guard\ntags: [guards]\ntext: Two guards walk the square at night.\n"
                "entries:\n  - title: Patrols\n    text: They pass the well every five minutes.\n"
            ),
            "square/empty.md": "---\ntags: [a]\n---\n",
            "square/bad.yaml": "entries: [{nope: 1}]\n",
        },
    )
    (root / "lore" / "square" / "huge.md").write_text("# Huge\n\n" + "word " * 5000)
    (root / "lore" / "square" / "binary.md").write_bytes(b"\xff\xfe\x00\x01")
    (root / "lore" / "square" / "dir.md").mkdir()
    world = load_world(root, max_lore_bytes=16 * 1024)
    skipped = [str(p) for p in world.skipped]
    assert any("huge.md" in p and "the limit is 16384 bytes" in p for p in skipped), skipped
    assert any("binary.md" in p and "not UTF-8" in p for p in skipped)
    assert any("empty.md" in p and "no text" in p for p in skipped)
    assert any("bad.yaml" in p and "entries" in p for p in skipped)
    titles = {d.title for d in world.lore}
    assert {"The guard", "Patrols", "The Tipsy Well", "The old well"} <= titles
    # The rest of the world loaded, and the YAML lore is searchable.
    knowledge = Knowledge(world, bm25(tmp_path))
    hits = knowledge.retrieve("marla", Query("how often do the guards pass the well"))
    assert any("five minutes" in h.chunk.text for h in hits)


def test_reload_swaps_the_world_and_a_broken_card_keeps_the_old_one(tmp_path: Path) -> None:
    root = make_world(tmp_path / "w", {"marla.yaml": GOOD_CARD}, LORE)
    knowledge = Knowledge(load_world(root), bm25(tmp_path))
    assert not knowledge.changed()
    tavern = root / "lore" / "square" / "tavern.md"
    tavern.write_text(tavern.read_text().replace("sixth bell", "ninth bell"))
    assert knowledge.changed()
    report = knowledge.reload()
    assert report.shards_changed == ["square"] and knowledge.generation == 1
    packed = knowledge.context("marla", Query("When do you open?"))
    assert packed.lore is not None and "ninth bell" in packed.lore
    (root / "npcs" / "marla.yaml").write_text("name: [broken\n")
    with pytest.raises(WorldLoadError, match=r"marla\.yaml"):
        knowledge.reload()
    assert knowledge.generation == 1 and knowledge.stats.reload_failures == 1
    assert "ninth bell" in (knowledge.context("marla", Query("When do you open?")).lore or "")


# -- probes -------------------------------------------------------------------------------------


def test_probe_files_are_validated_with_clear_errors(tmp_path: Path, example_world: Path) -> None:
    world = load_world(example_world)
    lore = load_probes(example_world / "probes" / "lore.yaml", "lore", world)
    style = load_probes(example_world / "probes" / "style.yaml", "style", world)
    assert len(lore) == 50 and len(style) == 20
    bad = tmp_path / "bad.yaml"
    bad.write_text("probes:\n  - npc: marla\n    question: hi\n  - npc: marla\n    expect: []\n")
    with pytest.raises(ProbeFileError) as caught:
        load_probes(bad, "lore", world)
    text = str(caught.value)
    assert "probe 1: expect: Field required" in text and "probe 2: question" in text
    bad.write_text('probes:\n  - {npc: nobody, question: hi, expect: ["x"]}\n')
    with pytest.raises(ProbeFileError, match="nobody"):
        load_probes(bad, "lore", world)
    bad.write_text('probes:\n  - {npc: marla, question: hi, expect: ["re:(unclosed"]}\n')
    with pytest.raises(ProbeFileError, match="bad regex"):
        load_probes(bad, "lore", world)
    bad.write_text("probes: [unclosed\n")
    with pytest.raises(ProbeFileError, match="not valid YAML"):
        load_probes(bad, "lore", world)
    with pytest.raises(ProbeFileError, match="cannot read"):
        load_probes(tmp_path / "missing.yaml", "lore", world)


def test_probe_matching() -> None:
    from mythic.cli._eval import LoreProbe, StyleProbe

    probe = LoreProbe(npc="marla", question="q", expect=[["third", "3"], "re:\\bbell"])
    assert lore_correct(probe, "We close at the Third bell.")
    assert not lore_correct(probe, "We close at three.")
    style = StyleProbe(npc="marla", question="q", forbid=["jory"], catchphrase=True, max_words=5)
    assert style_checks(style, "Listen, friend.", ["friend"]) == {
        "taboo_kept": True,
        "length_kept": True,
        "catchphrase_used": True,
    }
    assert not style_checks(style, "Jory Quill, friend, is the one you want.", ["friend"])[
        "taboo_kept"
    ]


def test_lore_beyond_keeps_only_the_new_lines_under_their_sources() -> None:
    prepared = "## Lore\nFrom Old Town:\nThe tavern is old.\nFrom The Mill:\nIt burned."
    whole = (
        "## Lore\nFrom The Mill:\nIt burned.\nThe miller fled.\n"
        "From Old Town:\nThe tavern is old.\nFrom The Market:\nSilver is sold at dawn."
    )
    assert lore_beyond(prepared, whole) == (
        "## More Lore\nFrom The Mill:\nThe miller fled.\nFrom The Market:\nSilver is sold at dawn."
    )
    assert lore_beyond(whole, prepared) is None  # nothing new
    assert lore_beyond(prepared, None) is None
    assert lore_beyond(None, "## Lore\nA fact.") == "## More Lore\nA fact."


def test_lore_beyond_keeps_the_most_relevant_new_lines_within_max_chars() -> None:
    whole = (
        "## Lore\nFrom The Market:\nSilver is sold at dawn.\n"
        "A very long line about the market's history that does not fit in the budget.\n"
        "Guards watch.\nFrom The Mill:\nIt burned."
    )
    first = "## More Lore\nFrom The Market:\nSilver is sold at dawn."
    assert lore_beyond(None, whole, max_chars=len(first)) == first
    # A line too long is skipped for shorter ones after it, each under its source.
    room = len(first) + len("\nGuards watch.\nFrom The Mill:\nIt burned.")
    assert lore_beyond(None, whole, max_chars=room) == (
        first + "\nGuards watch.\nFrom The Mill:\nIt burned."
    )
    assert lore_beyond(None, whole, max_chars=10) is None  # not even one line fits
    assert lore_beyond(None, whole, max_chars=10_000) == lore_beyond(None, whole)


def test_lore_told_in_parts_gives_every_line_once_in_order() -> None:
    """The parts a prepared prompt evaluates its lore in: the first under `## Lore`, the next
    ones `## More Lore`, each within its budget but for one line longer than the budget
    (never left out of every part); together every line once, in order of relevance."""
    long = "A very long line about the market's history that does not fit in any part at all."
    whole = (
        f"## Lore\nFrom The Market:\nSilver is sold at dawn.\n{long}\n"
        "Guards watch.\nFrom The Mill:\nIt burned.\nThe miller fled."
    )
    budget = 50
    parts = [lore_beyond(None, whole, max_chars=budget, header="## Lore", at_least_one=True)]
    told = parts[0]
    while (more := lore_beyond(told, whole, max_chars=budget, at_least_one=True)) is not None:
        parts.append(more)
        told = f"{told}\n{more}"
        assert len(parts) < 10
    assert parts[0] == "## Lore\nFrom The Market:\nSilver is sold at dawn."
    assert all(p.startswith("## More Lore\n") for p in parts[1:])
    assert any(long in p and len(p) > budget for p in parts)
    assert all(len(p) <= budget for p in parts if long not in p)
    facts = [
        line
        for p in parts
        for line in p.splitlines()[1:]
        if not line.startswith("From ") and not line.startswith("##")
    ]
    assert facts == [
        "Silver is sold at dawn.",
        long,
        "Guards watch.",
        "It burned.",
        "The miller fled.",
    ]


FACTION_WORLD = """\
name: Testholm
description: A small test town.
zones:
  square:
    name: The Square
    description: Cobbles and a well.
factions:
  night_watch:
    name: the Night Watch
    description: The town's guards, who walk the walls from dusk to dawn.
"""


def test_a_factions_lore_is_known_to_its_members_alone(tmp_path: Path) -> None:
    root = make_world(
        tmp_path / "w",
        {
            "marla.yaml": GOOD_CARD,
            "edda.yaml": GOOD_CARD.replace("Marla, the Barkeep", "Edda") + "faction: night_watch\n",
            "rolf.yaml": GOOD_CARD.replace("Marla, the Barkeep", "Rolf") + "faction: night_watch\n",
        },
        LORE,
    )
    (root / "world.yaml").write_text(FACTION_WORLD)
    (root / "factions" / "night_watch").mkdir(parents=True)
    (root / "factions" / "night_watch" / "orders.md").write_text(
        "# Standing orders\n\nThe watchword this month is bluefin, and the postern gate opens "
        "to it after curfew.\n"
    )
    world = load_world(root)
    assert [d.faction for d in world.lore if d.faction] == ["night_watch"]
    assert all(d.faction is None for z in (None, "square") for d in world.lore_for(z))
    knowledge = Knowledge(world, bm25(tmp_path))
    question = Query("What is the watchword for the postern gate?")
    for member in ("edda", "rolf"):
        packed = knowledge.context(member, question)
        assert packed.lore is not None and "bluefin" in packed.lore, member
        assert packed.persona is not None and "You belong to the Night Watch" in packed.persona
    outsider = knowledge.context("marla", question)
    assert "bluefin" not in (outsider.lore or "") and "Night Watch" not in (outsider.lore or "")
    assert all("bluefin" not in h.chunk.text for h in knowledge.retrieve("marla", question))
