"""Knowledge retrieval plus context packing (`mythic.knowledge`): latency per turn, index build.

The latency of one `Knowledge.context` call at two corpus sizes, hybrid retrieval against BM25
alone measured in the same run, and the time to build the index.

For each size in `--sizes` (default 1,000 and 10,000 chunks) a synthetic world is generated:
one zone holding that many short markdown lore documents (shops and their prices and hours,
people, roads, bounties, rumours, history; built from templates over place/person/item/hour
vocabularies with random numbers, seeded, so the same size gives the same text every run),
each 3-6 short lines, so one document is one chunk (the table's `chunks` is `Knowledge.chunks`:
the documents plus the world's premise). One NPC lives in that zone and knows only it.

- query: `--queries` player questions (paraphrased over the documents' own places, people,
  items and roads, with and without an intent, a few about nothing in the world), each with a
  `## Recent Memory` text and a scene (zone, time, the player and a few objects). Each
  `Knowledge.context` call (query embedding, BM25, dense top-k, blended rerank with the line
  scores, packing of the four sections) is timed alone with `perf_counter`, the rows
  alternating in random order query by query, after `--warmup` untimed calls each. Rows:
  `bm25` (the baseline: no embeddings); `hybrid` (the default mode, as the server runs it:
  torch, for the query's embedding, and the BLAS under numpy, for the cosine top-k, each on
  its default threads, one per core; `--threads` to change); `hybrid-1t` (the same index,
  both on one thread for the call: threads that wait on each other at every layer or matrix
  product cost far more than they gain when the machine's other cores are busy, e.g.
  generating). Reported: p50/p95 in ms; x = against bm25; p95 against the design's 50 ms
  budget for dialogue manager + RAG; where a call's time goes (p50 of each part: the query's
  embedding, timed inside the call by a wrapper around the embedder; `Knowledge.retrieve`
  less the embedding, i.e. the search; `pack` of the same hits, timed alone); `hit@k`, the
  share of questions whose source document is among the retrieved chunks (a check that
  both modes do the work). The machine's load average around the timed calls is printed:
  on a shared machine the hybrid row moves with it.
- build: the hybrid index built once (embedding every chunk and each chunk's lines with
  all-MiniLM-L6-v2, unless the disk cache already holds them: the `embedded` column says how
  many texts were embedded; `--cold` empties this benchmark's cache first), then again from
  the disk cache, and the BM25 index (the baseline). The cache and the worlds' paths (which
  key it) live under ~/.cache/mythic/bench-knowledge, so a second run skips the embedding
  (a cold 10,000-chunk build takes minutes on 2 cores).

Writes bench/results/retrieval.json.

    .venv/bin/python bench/retrieval.py [--sizes 1000,10000] [--queries 200] [--warmup 10]
        [--threads N] [--cold] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _results import fmt, latency, pct, ratio, write_results
from mythic.config import KnowledgeSettings, default_cache_dir
from mythic.knowledge import (
    Knowledge,
    LoreDoc,
    Persona,
    Query,
    SceneObject,
    SceneState,
    World,
    WorldCard,
    pack,
    shared_embedder,
)

if TYPE_CHECKING:
    from mythic.knowledge._embed import Embedder, Vectors

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "retrieval.json"
BENCH_CACHE = default_cache_dir() / "bench-knowledge"
BUDGET_MS = 50.0
"""The design's latency budget for the dialogue manager plus RAG, per turn."""
BASELINE = "bm25"
ROW_THREADS: dict[str, int | None] = {"bm25": None, "hybrid": None, "hybrid-1t": 1}
"""What is timed: BM25 alone (the baseline), hybrid as the server runs it (torch and the BLAS
on their default threads, one per core), and hybrid with torch and the BLAS on one thread."""
ROWS = tuple(ROW_THREADS)
ZONE = "lowmarket"
NPC = "hesper"
GENERATOR = 1
"""Bump when the generated text changes, so old cached vectors are not mixed in."""

# -- vocabulary ---------------------------------------------------------------------------------


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FIRST = words(
    "Aldous Brannoc Cedric Dorrit Edda Fenn Griselda Hob Ilsa Jory Kestrel Lorne Magda Nell "
    "Osric Perrin Quill Rosalind Silas Tamsin Ulric Vesna Wendel Yorick Agnes Bertil Corra "
    "Dunstan Elsbeth Faro Gideon Hesketh Ione Jessamy Keir Linnet Mortimer Nerys Orla Piet "
    "Radegund Sabine Thaddeus Una Viggo Wilhelmina Ysolde Zeb"
)
SURNAMES = words(
    "Ashdown Blackwood Crowther Dunmore Eastlake Fairweather Greaves Holloway Ingram Jaggard "
    "Kettle Larkspur Marrow Nettlebed Oakes Pennyworth Quarrie Rookwood Saltmarsh Thorne "
    "Underhill Vane Whitlock Yarrow Ambler Birchall Coldridge Draycott Elmsworth Fenwick "
    "Gallow Hartigan Ironside Jessop Kilbride Lockyer Mallory Nightingale Orwin Pettigrew "
    "Redfern Sallow Tallis Upcott Vetch Wainwright Wrexham Yeoman"
)
ADJECTIVES = words(
    "Crooked Drowned Gilded Hollow Iron Laughing Leaning Lonely Merry Mossy Painted Red Rusty "
    "Salted Silver Sleeping Smoking Sunken Tarred Velvet Weeping White Broken Copper Crimson "
    "Dusty Golden Grey Howling Hungry Jolly Limping Muddy Old Pale Quiet Rotten Singing Tired"
)
NOUNS = words(
    "Anchor Badger Barrel Bell Boot Candle Crow Eel Ferret Fiddle Gallows Goat Hammer Heron "
    "Kettle Key Lamb Lantern Mermaid Needle Oar Owl Pike Raven Saddle Sparrow Stag Swan Thimble "
    "Toad Wheel Wolf Compass Lamprey Mitre Otter Plough Rook Spindle Tankard"
)
KINDS = (
    "tavern",
    "inn",
    "smithy",
    "apothecary",
    "chandlery",
    "bakery",
    "pawnshop",
    "bathhouse",
    "tannery",
    "cooperage",
    "fishmonger's",
    "cobbler's",
    "tailor's",
    "ropewalk",
    "brewery",
    "bookbinder's",
    "gambling den",
    "herbalist's",
    "candlemaker's",
    "butcher's",
)
STREETS = (
    "Tallow Lane",
    "Gallows Row",
    "Fishgate Street",
    "Cinder Alley",
    "Bellfounders' Yard",
    "Mudlark Steps",
    "Netmenders' Walk",
    "Saltpan Road",
    "Chapel Wynd",
    "Tanner's Cut",
    "Lamplighters' Court",
    "the Old Quay",
    "Ropemakers' Row",
    "Widow's Bridge",
    "Coppergate",
    "the Shambles",
    "Cutpurse Corner",
    "Harbour Stair",
    "Drum Lane",
    "Ferrymen's Hythe",
)
ITEMS = (
    "lantern oil",
    "a tallow candle",
    "a pint of black ale",
    "a bowl of eel stew",
    "a silver-tipped bolt",
    "wolfsbane tea",
    "a flask of holy water",
    "a coil of hemp rope",
    "a night's bed",
    "a hot bath",
    "a pair of hobnailed boots",
    "a wool cloak",
    "a loaf of rye bread",
    "a wheel of salt cheese",
    "a pound of salt",
    "a hunting knife",
    "a mended net",
    "a bottle of plum brandy",
    "a vial of nightshade",
    "a bundle of yew arrows",
    "a tin whistle",
    "a map of the sewers",
    "a pot of grease paint",
    "a leather satchel",
    "a dozen iron nails",
    "a sack of oats",
    "a garlic braid",
    "a jar of leeches",
    "a blank ledger",
    "a brass compass",
    "a smoked herring",
    "a sprig of rosemary",
)
ROLES = (
    "fence",
    "night watchman",
    "ferryman",
    "midwife",
    "gravedigger",
    "lamplighter",
    "moneylender",
    "rat-catcher",
    "priest",
    "smuggler",
    "herb-wife",
    "bell-ringer",
    "sell-sword",
    "scribe",
    "dockhand",
    "fortune-teller",
    "bone-setter",
    "tax collector",
)
MONSTERS = (
    "grey wolf",
    "ghoul",
    "marsh hag",
    "barrow wight",
    "giant eel",
    "bone hound",
    "river troll",
    "plague rat swarm",
    "headless rider",
    "shrieking bat",
    "drowned bride",
    "mire serpent",
)
WEAKNESSES = (
    "fire",
    "silver",
    "salt",
    "running water",
    "church bells",
    "daylight",
    "iron nails",
    "garlic smoke",
    "its own name spoken aloud",
)
LANDMARKS = (
    "the Drowned Chapel",
    "Gibbet Hill",
    "the Salt Causeway",
    "the Weeping Stones",
    "Crowfoot Ford",
    "the Lime Kilns",
    "the Hangman's Oak",
    "the Sunken Mill",
    "Blackwater Lock",
    "the Old Lighthouse",
    "the Plague Pits",
    "Miller's Weir",
)
GATES = ("Eastgate", "Fishgate", "Watergate", "Northgate", "Bonegate", "Marsh Gate")
EVENTS = (
    "Great Flood",
    "Fire of Tallow Lane",
    "Red Winter",
    "Bread Riot",
    "Night of Bells",
    "Pestilence",
    "Siege of the Watergate",
    "Drowning Fair",
)
ORDINALS = (
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
)
SMALL_TALK = (
    "Nice weather for it, isn't it?",
    "Do you ever get tired of standing here all day?",
    "I think I'll just have a look around.",
    "Sorry, I was looking for someone else.",
)


# -- the synthetic world ------------------------------------------------------------------------


class Doc:
    """A generated lore document and the questions a player might ask about it."""

    def __init__(
        self, title: str, lines: list[str], tags: tuple[str, ...], asks: list[Query]
    ) -> None:
        self.title = title
        self.text = f"# {title}\n\n" + "\n".join(lines)
        self.tags = tags
        self.asks = asks


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(SURNAMES)}"


def place(rng: random.Random) -> str:
    return f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"


def price(rng: random.Random) -> str:
    n = rng.randint(1, 40)
    return f"{n} {rng.choice(('copper', 'copper', 'silver'))} crown{'s' if n > 1 else ''}"


def bell(rng: random.Random, lo: int = 0, hi: int = 11) -> str:
    return f"the {ORDINALS[rng.randint(lo, hi)]} bell"


def shop_doc(rng: random.Random) -> Doc:
    name, owner, kind, street = place(rng), person(rng), rng.choice(KINDS), rng.choice(STREETS)
    goods = rng.sample(ITEMS, rng.randint(2, 3))
    lines = [
        f"{name} is a {kind} on {street}, kept by {owner}.",
        f"It opens at {bell(rng, 0, 5)} of the morning and shuts at {bell(rng, 6, 11)} of "
        "the evening, and never on a burial day.",
        "",
        *(f"- {item.capitalize()}: {price(rng)}" for item in goods),
    ]
    item = rng.choice(goods)
    asks = [
        Query(f"How much does {name.lower()} charge for {item}?", "trade"),
        Query(f"What's {item} going for these days?", "trade"),
        Query(f"When does {name} open its doors?", None),
        Query(f"Who keeps {name}, the {kind} on {street}?", None),
        Query(f"Where could I buy {item} around here?", "navigation"),
    ]
    return Doc(name, lines, ("shop", "prices", "trade"), asks)


def person_doc(rng: random.Random) -> Doc:
    who, other, role = person(rng), person(rng), rng.choice(ROLES)
    first = who.split()[0]
    pronoun = rng.choice(("He", "She"))
    haunt = place(rng)
    lines = [
        f"{who} is a {role} of {rng.choice(STREETS)}, {rng.randint(19, 71)} years old.",
        f"{pronoun} owes {price(rng)} to {other} and has not paid since the {rng.choice(EVENTS)}.",
        f"{pronoun} drinks at {haunt} most nights after {bell(rng, 6, 11)}.",
        f"- Known for: {rng.choice(('a scarred lip', 'a limp', 'a gold tooth', 'a red scarf'))}",
    ]
    asks = [
        Query(f"Who is {who}?", None),
        Query(f"Any idea where I might find {first} {who.split()[1]} after dark?", "navigation"),
        Query(f"Does {first} owe money to anyone?", None),
        Query(f"Is it true the {role} {who} drinks at {haunt}?", None),
    ]
    return Doc(who, lines, ("people",), asks)


def road_doc(rng: random.Random) -> Doc:
    a, b = rng.sample(LANDMARKS, 2)
    gate = rng.choice(GATES)
    monster = rng.choice(MONSTERS)
    lines = [
        f"The road from {a} to {b} runs {rng.randint(2, 30)} miles along the dykes.",
        f"On foot it takes {rng.randint(1, 9)} hours; a cart takes twice as long after rain.",
        f"The {gate} is shut at {bell(rng, 6, 11)} and opened again at dawn.",
        f"- Danger: a {monster} has been seen on it {rng.randint(2, 14)} nights running.",
    ]
    asks = [
        Query(f"How long is the walk from {a} to {b}?", "navigation"),
        Query(f"Is the way to {b} safe once it's dark?", "combat"),
        Query(f"When do they close the {gate}?", None),
    ]
    return Doc(f"The road from {a} to {b} ({gate})", lines, ("routes", "ways"), asks)


def bounty_doc(rng: random.Random) -> Doc:
    monster, where, payer = rng.choice(MONSTERS), rng.choice(LANDMARKS), person(rng)
    weakness = rng.choice(WEAKNESSES)
    lines = [
        f"{payer} pays {rng.randint(5, 120)} silver crowns for proof that the {monster} of "
        f"{where} is dead.",
        f"It was last seen {rng.randint(1, 20)} nights ago near {place(rng)}.",
        f"It is said to fear {weakness}.",
        f"- Reward paid at {rng.choice(STREETS)}, {bell(rng)}",
    ]
    asks = [
        Query(f"Is anybody paying to be rid of the {monster} at {where}?", "quest"),
        Query(f"What's the reward for killing the {monster} near {where}?", "quest"),
        Query(f"What is the {monster} of {where} afraid of?", "combat"),
    ]
    return Doc(f"Bounty: the {monster} of {where}", lines, ("quest", "bounty", "danger"), asks)


def rumour_doc(rng: random.Random) -> Doc:
    spot, who = place(rng), person(rng)
    lines = [
        f"People whisper that {who} hides {rng.choice(ITEMS)} under the floor of {spot}.",
        f"The watch searched it {rng.randint(2, 9)} times and found nothing.",
        f"A {rng.choice(ROLES)} swears there is a tunnel from its cellar to "
        f"{rng.choice(LANDMARKS)}.",
    ]
    asks = [
        Query(f"Heard any gossip about {spot}?", "hint"),
        Query(f"What are people saying about {who}?", "hint"),
        Query(f"Is there really a tunnel under {spot}?", "hint"),
    ]
    return Doc(f"Rumours of {spot}", lines, ("rumours", "secrets"), asks)


def history_doc(rng: random.Random) -> Doc:
    event, year = rng.choice(EVENTS), rng.randint(380, 640)
    lines = [
        f"The {event} struck in the year {year} of the Drowning.",
        f"{rng.randint(12, 900)} souls died and {rng.choice(STREETS)} burned to the waterline.",
        f"{person(rng)}, then burgomaster, was hanged at {rng.choice(LANDMARKS)} for it.",
        f"The bells still ring {rng.randint(3, 12)} times on its night each year.",
    ]
    asks = [
        Query(f"What happened back in the year {year}?", None),
        Query(f"Tell me about the {event} of {year}.", None),
        Query(f"Why do the bells ring for the {event}?", None),
    ]
    return Doc(f"The {event} of {year}", lines, ("history",), asks)


KINDS_OF_DOC: tuple[tuple[Callable[[random.Random], Doc], int], ...] = (
    (shop_doc, 4),
    (person_doc, 3),
    (road_doc, 1),
    (bounty_doc, 1),
    (rumour_doc, 2),
    (history_doc, 1),
)


def make_docs(n: int) -> list[Doc]:
    rng = random.Random(f"docs-{GENERATOR}-{n}")
    makers = [m for m, weight in KINDS_OF_DOC for _ in range(weight)]
    return [rng.choice(makers)(rng) for _ in range(n)]


def make_world(n: int) -> tuple[World, list[Doc]]:
    """A world of one zone holding `n` lore documents, and one NPC there. Its path is fixed
    per size: the vector cache is keyed by it."""
    path = BENCH_CACHE / "worlds" / f"g{GENERATOR}-n{n}"
    path.mkdir(parents=True, exist_ok=True)
    card = WorldCard(
        name="Saltmere",
        description="A drowned harbour city of fog, bells and smugglers, ruled by a burgomaster "
        "who fears the dead more than the living.",
        zones={
            ZONE: {
                "name": "the Lowmarket",
                "description": "The crowded market streets between the fish quay and the "
                "Bonegate: stalls, taverns, fences and a watch that looks the other way.",
            }
        },
    )
    persona = Persona(
        name="Hesper, the Lamplighter",
        archetype="human",
        style="dry, quick, fond of gossip",
        zone=ZONE,
        rules=["Answers about the Lowmarket as someone who walks every street of it nightly."],
        catchphrases=["mind the wick"],
    )
    docs = make_docs(n)
    lore = tuple(
        LoreDoc(
            ZONE,
            d.title,
            d.text,
            path / "lore" / ZONE / f"{i:05d}.md",
            d.tags,
        )
        for i, d in enumerate(docs)
    )
    return World(path=path, card=card, npcs={NPC: persona}, lore=lore), docs


MEMORY_LINES = (
    "- The player asked about the lights on the marsh last night.",
    "- The player paid two copper crowns for a tallow candle.",
    "- The player said they are looking for their brother.",
    "- You warned the player about the watch on Gallows Row.",
    "- The player promised to bring you salt from the quay.",
    "- The player laughed at your joke about the burgomaster.",
)
NEARBY = ("guard_1", "guard_2", "cat", "lantern_post", "beggar", "cart_3", "crow")


def make_queries(docs: list[Doc], count: int) -> list[tuple[Query, str, SceneState, str | None]]:
    """`count` (query, memory, scene, the title of the document that answers it or None)."""
    rng = random.Random(f"queries-{GENERATOR}-{len(docs)}-{count}")
    out = []
    for i in range(count):
        if i % 25 == 24:
            query, title = Query(rng.choice(SMALL_TALK)), None
        else:
            doc = rng.choice(docs)
            query, title = rng.choice(doc.asks), doc.title
        memory = "## Recent Memory\n" + "\n".join(rng.sample(MEMORY_LINES, rng.randint(2, 6)))
        others = rng.sample(NEARBY, rng.randint(1, 4))
        objects = (
            SceneObject("player", round(rng.uniform(0.8, 3.0), 1)),
            *(SceneObject(o, round(rng.uniform(2.0, 30.0), 1)) for o in others),
        )
        scene = SceneState(ZONE, f"{rng.randint(18, 23)}:{rng.randint(0, 59):02d}", objects)
        out.append((query, memory, scene, title))
    return out


# -- numbers ------------------------------------------------------------------------------------


# -- measuring ----------------------------------------------------------------------------------


class TimedEmbedder:
    """The shared MiniLM, with the time of its last `embed` call: the query's embedding inside
    a `Knowledge.context` call. Same name and size as the model, so it shares the cache."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.last = 0.0

    def embed(self, texts: list[str]) -> Vectors:
        t0 = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.last = time.perf_counter() - t0


class Threads:
    """The threads of torch (the embedding) and of the BLAS under numpy (the cosine top-k):
    by default one per core each; `limit(n)` sets both around a call (outside its timing)."""

    def __init__(self, threads: int | None) -> None:
        import torch

        self._torch = torch
        try:
            from threadpoolctl import ThreadpoolController

            self._blas: Any = ThreadpoolController()
        except ImportError:  # the BLAS then keeps its threads
            self._blas = None
        self._pinned: Any = None
        if threads is not None:
            torch.set_num_threads(threads)
            if self._blas is not None:
                self._pinned = self._blas.limit(limits=threads, user_api="blas")
        self.torch = torch.get_num_threads()
        self.blas = self.blas_threads()

    def blas_threads(self) -> int | None:
        if self._blas is None:
            return None
        found = [lib.num_threads for lib in self._blas.select(user_api="blas").lib_controllers]
        return max(found, default=None)

    @contextlib.contextmanager
    def limit(self, n: int | None) -> Iterator[None]:
        if n is None:
            yield
            return
        self._torch.set_num_threads(n)
        blas = self._blas.limit(limits=n, user_api="blas") if self._blas else None
        try:
            yield
        finally:
            if blas is not None:
                blas.restore_original_limits()
            self._torch.set_num_threads(self.torch)


def settings_of(mode: str) -> KnowledgeSettings:
    return KnowledgeSettings(retrieval=mode, cache_dir=BENCH_CACHE / "index", watch=False)


def build(world: World, mode: str, embedder: TimedEmbedder) -> tuple[Knowledge, dict[str, Any]]:
    t0 = time.perf_counter()
    k = Knowledge(world, settings_of(mode), embedder=embedder if mode != "bm25" else None)
    wall = time.perf_counter() - t0
    report = k.last_report
    return k, {
        "mode": mode,
        "seconds": wall,
        "report_seconds": report.seconds,
        "chunks": k.chunks,
        "embedded": report.embedded,
        "embedded_per_s": report.embedded / wall if report.embedded else None,
    }


def bench_size(
    n: int,
    embedder: TimedEmbedder,
    threads: Threads,
    n_queries: int,
    warmup: int,
) -> dict[str, Any]:
    world, docs = make_world(n)
    builds = []
    print(
        f"  {n} docs: building the hybrid index (embeds what the cache lacks, "
        f"{threads.torch} torch threads) ...",
        flush=True,
    )
    first, b = build(world, "hybrid", embedder)
    builds.append({**b, "build": "first"})
    print(f"    first: {b['seconds']:.1f} s, {b['embedded']} texts embedded", flush=True)
    del first
    hybrid, b = build(world, "hybrid", embedder)
    builds.append({**b, "build": "cached"})
    print(f"    from the cache: {b['seconds']:.2f} s, {b['embedded']} embedded", flush=True)
    bm25, b = build(world, "bm25", embedder)
    builds.append({**b, "build": "first"})
    print(f"    bm25: {b['seconds']:.2f} s", flush=True)
    knowledge = {"bm25": bm25, "hybrid": hybrid, "hybrid-1t": hybrid}
    chunks = hybrid.chunks

    queries = make_queries(docs, n_queries)
    rng = random.Random(f"order-{n}")
    for mode in ROWS:  # warm up: the model's first calls, numpy's and bm25s's first paths
        for query, memory, scene, _ in queries[:warmup]:
            with threads.limit(ROW_THREADS[mode]):
                knowledge[mode].context(NPC, query, memory=memory, scene=scene)

    load_before = os.getloadavg()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    total: dict[str, list[float]] = {m: [] for m in ROWS}
    embed: dict[str, list[float]] = {m: [] for m in ROWS}
    found: dict[str, int] = {m: 0 for m in ROWS}
    answerable = sum(1 for q in queries if q[3] is not None)
    tokens: dict[str, list[int]] = {m: [] for m in ROWS}
    for query, memory, scene, title in queries:
        for mode in rng.sample(ROWS, len(ROWS)):
            k = knowledge[mode]
            embedder.last = 0.0
            with threads.limit(ROW_THREADS[mode]):
                t0 = time.perf_counter()
                packed = k.context(NPC, query, memory=memory, scene=scene)
                total[mode].append(time.perf_counter() - t0)
            if k.embedder is not None:
                embed[mode].append(embedder.last)
            tokens[mode].append(packed.total)
            if title is not None and any(h.chunk.title == title for h in packed.hits):
                found[mode] += 1
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    load_after = os.getloadavg()

    # Where a call's time goes: retrieve (embedding + search) and pack, each timed alone.
    search: dict[str, list[float]] = {m: [] for m in ROWS}
    packing: dict[str, list[float]] = {m: [] for m in ROWS}
    for query, memory, scene, _ in queries:
        for mode in rng.sample(ROWS, len(ROWS)):
            k = knowledge[mode]
            q = Query(query.text, query.intent, tuple({*query.tags, *scene.tags()}))
            embedder.last = 0.0
            with threads.limit(ROW_THREADS[mode]):
                t0 = time.perf_counter()
                hits = k.retrieve(NPC, q, prefer_zone=scene.zone)
                search[mode].append(time.perf_counter() - t0 - embedder.last)
                t0 = time.perf_counter()
                pack(
                    persona=k.persona(NPC),
                    hits=hits,
                    query=q.text,
                    memory=memory,
                    scene=scene,
                    budgets=k.budgets,
                    count=k.count,
                )
                packing[mode].append(time.perf_counter() - t0)

    rows = []
    for mode in ROWS:
        rows.append(
            {
                "mode": mode,
                "threads": ROW_THREADS[mode] or {"torch": threads.torch, "blas": threads.blas},
                "ms": latency(total[mode], 1e3),
                "embed_ms": latency(embed[mode], 1e3) if embed[mode] else None,
                "search_ms": latency(search[mode], 1e3),
                "pack_ms": latency(packing[mode], 1e3),
                "hit_at_k": found[mode] / answerable if answerable else None,
                "context_tokens_p50": pct([float(t) for t in tokens[mode]], 0.5),
            }
        )
    base = rows[0]
    for row in rows:
        row["x_p50"] = ratio(row["ms"]["p50"], base["ms"]["p50"])
        row["x_p95"] = ratio(row["ms"]["p95"], base["ms"]["p95"])
        row["p95_vs_budget"] = ratio(row["ms"]["p95"], BUDGET_MS)
    return {
        "docs": n,
        "chunks": chunks,
        "queries": len(queries),
        "answerable": answerable,
        "top_k": hybrid.settings.top_k,
        "warmup": warmup,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "process_cpu_per_wall": cpu / wall if wall else None,
        "builds": builds,
        "rows": rows,
    }


def print_query(results: list[dict[str, Any]], threads: Threads) -> None:
    print()
    r0 = results[0]
    print(
        f"Knowledge.context latency: {r0['queries']} questions per size, one NPC, one zone, "
        f"top {r0['top_k']}, the modes alternating"
    )
    header = (
        f"{'docs':>6} {'chunks':>6} {'mode':9} {'p50 ms':>7} {'p95 ms':>7} {'x p50':>6} "
        f"{'x p95':>6} {'p95/50ms':>8} {'embed':>6} {'search':>7} {'pack':>6} {'hit@k':>6}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        for r in result["rows"]:
            embed = r["embed_ms"]["p50"] if r["embed_ms"] else None
            print(
                f"{result['docs']:>6} {result['chunks']:>6} {r['mode']:9} "
                f"{r['ms']['p50']:>7.2f} {r['ms']['p95']:>7.2f} {fmt(r['x_p50'], '.2f'):>6} "
                f"{fmt(r['x_p95'], '.2f'):>6} {fmt(r['p95_vs_budget'], '.3f'):>8} "
                f"{fmt(embed, '.2f'):>6} {r['search_ms']['p50']:>7.2f} "
                f"{r['pack_ms']['p50']:>6.2f} {fmt(r['hit_at_k'], '.2f'):>6}"
            )
    print(
        f"(x = against {BASELINE} in the same run; p95/50ms: p95 against the design's "
        f"{BUDGET_MS:.0f} ms budget for dialogue manager + RAG; embed, search, pack: p50 ms of "
        "the query's embedding, of retrieve less the embedding, of pack alone; hit@k: share "
        "of answerable questions whose source document was retrieved; hybrid: as the server "
        f"runs it, {threads.torch} torch threads (the embedding) and {fmt(threads.blas, 'd')} "
        "BLAS threads (the cosine top-k); hybrid-1t: the same index, one thread each)"
    )
    for result in results:
        before, after = result["load_avg_before"][0], result["load_avg_after"][0]
        print(
            f"({result['docs']} docs: load average {before:.2f} before the timed calls, "
            f"{after:.2f} after, on {os.cpu_count()} cores; this process used "
            f"{result['process_cpu_per_wall']:.2f} CPU seconds per second meanwhile)"
        )


def print_build(results: list[dict[str, Any]]) -> None:
    print()
    print("index build (one NPC's index: the zone's chunks and the world's premise)")
    header = (
        f"{'docs':>6} {'chunks':>6} {'mode':6} {'build':6} {'seconds':>8} {'embedded':>8} "
        f"{'texts/s':>8} {'x':>7}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        builds = result["builds"]
        base = next(b for b in builds if b["mode"] == BASELINE)
        for b in sorted(builds, key=lambda b: b["mode"] != BASELINE):
            print(
                f"{result['docs']:>6} {b['chunks']:>6} {b['mode']:6} {b['build']:6} "
                f"{b['seconds']:>8.2f} {b['embedded']:>8} "
                f"{fmt(b['embedded_per_s'], ',.0f'):>8} "
                f"{fmt(ratio(b['seconds'], base['seconds']), ',.1f'):>7}"
            )
    print(
        f"(embedded: texts embedded, each chunk and each of its lines, 0 when the disk cache "
        f"held them; x = against the {BASELINE} build; cache: {BENCH_CACHE / 'index'})"
    )


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="lore documents (about chunks)")
    parser.add_argument("--queries", type=int, default=200, help="questions timed per size")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per mode first")
    parser.add_argument("--cold", action="store_true", help="empty the vector cache first")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch and BLAS threads of the builds and the hybrid row (default: every core)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300 docs, 50 queries")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.queries = "300", 50
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error(f"--sizes: integers separated by commas, not {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.queries < 1:
        parser.error("--sizes and --queries must be positive")

    start = time.perf_counter()
    t0 = time.perf_counter()
    model = shared_embedder()
    model.embed(["warm up the model"])
    load_s = time.perf_counter() - t0
    threads = Threads(args.threads)
    print(
        f"embedding model loaded in {load_s:.1f} s; threads: torch {threads.torch}, "
        f"BLAS {fmt(threads.blas, 'd')}"
    )
    embedder = TimedEmbedder(model)
    if args.cold:
        shutil.rmtree(BENCH_CACHE / "index", ignore_errors=True)
    results = []
    for n in sizes:
        results.append(bench_size(n, embedder, threads, args.queries, args.warmup))
    print_build(results)
    print_query(results, threads)
    print(f"({time.perf_counter() - start:.0f} s in all)")
    write_results(
        RESULTS,
        ROOT,
        results={"sizes": results, "model_load_s": load_s},
        benchmark="retrieval",
        baseline={
            "query": f"Knowledge.context with retrieval={BASELINE} (no embeddings), same "
            "questions, same run",
            "build": f"the {BASELINE} index build",
        },
        quick=args.quick,
        cold=args.cold,
        threads={"torch": threads.torch, "blas": threads.blas},
        target={"p95_ms": BUDGET_MS},
    )


if __name__ == "__main__":
    main()
