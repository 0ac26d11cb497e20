"""What every NPC knows, ready for each turn: a facade over chunking, indexes and packing.

Building and reloading embed lore (seconds on a CPU for a large world): run them off the event
loop. A reload builds a complete new state beside the old one and swaps it in one assignment,
so a turn sees either the old world or the new one, never half of each.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mythic.config import KnowledgeSettings
from mythic.knowledge._cards import WorldProblem
from mythic.knowledge._chunks import Chunk, chunk_text
from mythic.knowledge._index import Hit, Index, Query, Shard, VectorCache, build_shards
from mythic.knowledge._pack import (
    ABOUT_YOU,
    Budgets,
    Packed,
    SceneState,
    pack,
    pack_persona,
    persona_lines,
)
from mythic.knowledge._tokens import TokenCounter, approx_tokens
from mythic.knowledge._world import LORE_SUFFIXES, LoreDoc, World, load_world

if TYPE_CHECKING:
    from mythic.knowledge._embed import Embedder

log = logging.getLogger(__name__)

WORLD_SHARD = "_world"
_SAMPLES = 2048


def _rel(world: World, path: Path) -> str:
    try:
        return str(path.relative_to(world.path))
    except ValueError:
        return str(path)


def world_chunks(
    world: World,
    *,
    size: int,
    overlap: int,
    count: TokenCounter,
    extra: Sequence[LoreDoc] = (),
) -> dict[str, list[Chunk]]:
    """The world's knowledge cut into chunks, by shard: `_world` (the premise, the zones and
    the lore in `lore/` itself) and one shard per zone. `extra` lore (bronze artifacts) joins
    its zone's shard, or `_world` when the world has no such zone."""
    groups: dict[str, list[Chunk]] = {WORLD_SHARD: []}
    for zone in world.card.zones:
        groups[zone] = []
    card = world.card
    premise = [f"{card.description}"] + [f"{z.name}: {z.description}" for z in card.zones.values()]
    groups[WORLD_SHARD] += chunk_text(
        "\n\n".join(premise),
        id_prefix="world.yaml",
        title=card.name,
        source="world",
        zone=None,
        size=size,
        overlap=overlap,
        count=count,
    )
    for faction_id, faction in card.factions.items():
        # What a faction is and what its members alone know: a shard of its own, in the
        # indexes of its members only.
        groups[faction_shard(faction_id)] = chunk_text(
            f"{faction.name}: {faction.description}",
            id_prefix=f"world.yaml:factions.{faction_id}",
            title=faction.name,
            source="world",
            zone=None,
            size=size,
            overlap=overlap,
            count=count,
        )
    seen: dict[str, int] = {}
    for doc in (*world.lore, *extra):
        rel = _rel(world, doc.path)
        n = seen[rel] = seen.get(rel, -1) + 1  # a YAML file may hold several documents
        if doc.faction is not None:
            shard = faction_shard(doc.faction)
            if shard not in groups:
                continue  # a faction a reload removed: nobody knows its lore any more
        else:
            shard = doc.zone if doc.zone in groups else WORLD_SHARD
        groups[shard] += chunk_text(
            doc.text,
            id_prefix=f"{rel}:{n}" if n else rel,
            title=doc.title,
            source="lore",
            zone=doc.zone,
            tags=doc.tags,
            size=size,
            overlap=overlap,
            count=count,
        )
    return groups


def faction_shard(faction: str) -> str:
    """The shard of a faction's knowledge: only its members' indexes hold it."""
    return f"faction.{faction}"


@dataclass(slots=True)
class KnowledgeStats:
    """Counters for /metrics."""

    retrievals: int = 0
    reloads: int = 0
    reload_failures: int = 0
    last_reload_error: str | None = None
    seconds: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    """Retrieval plus packing, per turn."""


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What a build or reload did."""

    chunks: int
    shards_changed: list[str]
    embedded: int
    """Chunks embedded (not found in the cache)."""
    skipped: list[str]
    """Lore files left out, with why."""
    seconds: float


@dataclass(slots=True)
class _State:
    world: World
    shards: dict[str, Shard]
    personas: dict[str, str | None]
    indexes: dict[str, Index]
    """Per NPC."""
    files: dict[str, tuple[int, int]]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file of a world that knowledge reads."""
    found: dict[str, tuple[int, int]] = {}
    candidates = [root / "world.yaml", root / "safety.yaml"]
    for sub, suffixes in (("npcs", (".yaml", ".yml")), ("lore", LORE_SUFFIXES)):
        folder = root / sub
        if folder.is_dir():
            candidates += [p for p in folder.rglob("*") if p.suffix in suffixes]
    for path in candidates:
        try:
            st = path.stat()
        except OSError:
            continue
        found[str(path)] = (st.st_mtime_ns, st.st_size)
    return found


class Knowledge:
    """Persona, lore and context packing for every NPC of a world.

    Args:
        world: the loaded world.
        settings: budgets, retrieval mode and chunking.
        embedder: the sentence embedder; None: all-MiniLM-L6-v2, loaded when the retrieval
            mode needs it.
        count: the token counter of the budgets: the dialogue model's tokenizer when known.

    Raises:
        MissingExtraError: the rag extra (bm25s, numpy, the embedding model) is missing and
            the retrieval mode needs it.
    """

    def __init__(
        self,
        world: World,
        settings: KnowledgeSettings | None = None,
        *,
        embedder: Embedder | None = None,
        count: TokenCounter = approx_tokens,
    ) -> None:
        self.settings = settings or KnowledgeSettings()
        s = self.settings
        self.count = count
        self.budgets = Budgets(
            s.persona_tokens, s.lore_tokens, s.memory_tokens, s.scene_tokens, s.max_context_tokens
        )
        if embedder is None and s.retrieval in ("hybrid", "dense"):
            from mythic.knowledge._embed import shared_embedder

            embedder = shared_embedder()
        self.embedder = embedder if s.retrieval in ("hybrid", "dense") else None
        self._cache = VectorCache(s.cache_dir, self.embedder) if self.embedder is not None else None
        self.stats = KnowledgeStats()
        self.generation = 0
        """Goes up with each successful reload: actors refresh their personas when it moves."""
        self._reload_lock = threading.Lock()
        self._state: _State | None = None
        self._extra: dict[str, LoreDoc] = {}
        """Lore added at run time (bronze artifacts), by path; kept across reloads."""
        self.last_report = self._build(world)

    @property
    def world(self) -> World:
        assert self._state is not None
        return self._state.world

    @property
    def chunks(self) -> int:
        assert self._state is not None
        return sum(len(s.chunks) for s in self._state.shards.values())

    # -- building -----------------------------------------------------------------------------

    def _build(self, world: World) -> ReloadReport:
        start = time.perf_counter()
        s = self.settings
        embedded_before = self._cache.embedded if self._cache else 0
        files = snapshot(world.path)
        groups: dict[str, list[Chunk]] = world_chunks(
            world,
            size=s.chunk_tokens,
            overlap=s.chunk_overlap,
            count=self.count,
            extra=list(self._extra.values()),
        )
        personas: dict[str, str | None] = {}
        for npc_id, persona in world.npcs.items():
            lines = persona_lines(world, persona)
            budget = min(s.persona_tokens, s.max_context_tokens)
            text, dropped = pack_persona(lines, budget, self.count)
            personas[npc_id] = text
            if dropped:
                # What the persona budget leaves out stays findable, in the NPC's own shard.
                groups[f"npc.{npc_id}"] = chunk_text(
                    "\n".join(f"- {line}" for line in lines[len(lines) - dropped :]),
                    id_prefix=f"npcs/{npc_id}",
                    title=f"{ABOUT_YOU}, {persona.name}",
                    source="persona",
                    zone=persona.zone,
                    npc=npc_id,
                    size=s.chunk_tokens,
                    overlap=s.chunk_overlap,
                    count=self.count,
                )
        old = self._state.shards if self._state is not None else {}
        fresh: dict[str, list[Chunk]] = {}
        shards: dict[str, Shard] = {}
        for key, chunks in groups.items():
            shard = Shard(key, chunks)
            previous = old.get(key)
            if previous is not None and previous.version == shard.version:
                shards[key] = previous  # unchanged: keep its vectors
            else:
                fresh[key] = chunks
        world_key = str(world.path.resolve())
        shards.update(build_shards(fresh, cache=self._cache, world=world_key))
        indexes: dict[str, Index] = {}
        by_keys: dict[tuple[str, ...], Index] = {}
        for npc_id, persona in world.npcs.items():
            zones = persona.zones_known() if persona.zone else tuple(world.card.zones)
            faction = (faction_shard(persona.faction),) if persona.faction else ()
            keys = tuple(k for k in (WORLD_SHARD, *zones, *faction, f"npc.{npc_id}") if k in shards)
            index = by_keys.get(keys)
            if index is None:
                previous_index = (
                    self._state.indexes.get(npc_id) if self._state is not None else None
                )
                wanted = tuple(shards[k] for k in keys)
                if (
                    previous_index is not None
                    and len(previous_index.shards) == len(wanted)
                    and all(a is b for a, b in zip(previous_index.shards, wanted, strict=True))
                ):
                    index = previous_index  # none of its shards changed
                else:
                    index = Index(tuple(shards[k] for k in keys), s.retrieval, self.embedder)
                by_keys[keys] = index
            indexes[npc_id] = index
        self._state = _State(world, shards, personas, indexes, files)
        return ReloadReport(
            chunks=sum(len(sh.chunks) for sh in shards.values()),
            shards_changed=sorted(fresh),
            embedded=(self._cache.embedded if self._cache else 0) - embedded_before,
            skipped=[str(p) for p in world.skipped],
            seconds=time.perf_counter() - start,
        )

    def reload(
        self, world: World | None = None, *, check: Callable[[World], None] | None = None
    ) -> ReloadReport:
        """Load the world again from its folder (or use `world`) and swap it in; shards whose
        files did not change keep their vectors, and changed chunks are embedded once.
        `check(world)` may refuse the new world (by raising) before anything is swapped.

        Raises:
            WorldLoadError: the world's cards are broken now; the old world stays in use.
            Exception: what `check` raised; the old world stays in use.
        """
        with self._reload_lock:
            try:
                limit = self.settings.max_lore_bytes
                new = world or load_world(self.world.path, max_lore_bytes=limit)
                if check is not None:
                    check(new)
                report = self._build(new)
            except Exception as exc:
                self.stats.reload_failures += 1
                self.stats.last_reload_error = str(exc)
                raise
            self.generation += 1
            self.stats.reloads += 1
            self.stats.last_reload_error = None
            self.last_report = report
            log.info(
                "world %s reloaded: %d chunks, shards changed: %s, %d embedded, in %.2f s",
                new.name,
                report.chunks,
                ", ".join(report.shards_changed) or "none",
                report.embedded,
                report.seconds,
            )
            return report

    def add_documents(self, docs: Sequence[LoreDoc]) -> ReloadReport | None:
        """Add lore made at run time (bronze artifacts) to the indexes; a document whose path
        is already known replaces the old one, an identical one changes nothing (None). Only
        the shards they join are re-embedded. Blocking: call it in a worker thread."""
        with self._reload_lock:
            new = {str(doc.path): doc for doc in docs if self._extra.get(str(doc.path)) != doc}
            if not new:
                return None
            self._extra.update(new)
            report = self._build(self.world)
            self.generation += 1
            self.last_report = report
            log.info(
                "%d run-time lore documents added: shards changed: %s, %d embedded",
                len(new),
                ", ".join(report.shards_changed) or "none",
                report.embedded,
            )
            return report

    @property
    def added(self) -> int:
        """Run-time lore documents (bronze artifacts) in the indexes."""
        return len(self._extra)

    def changed(self) -> bool:
        """Whether a file of the world changed since the last build."""
        assert self._state is not None
        return snapshot(self._state.world.path) != self._state.files

    async def watch(
        self,
        on_reload: Callable[[ReloadReport], None] | None = None,
        *,
        check: Callable[[World], None] | None = None,
    ) -> None:
        """Reload the world whenever its files change, until cancelled. Checks and reloads run
        in a worker thread; a broken edit is logged and the old world kept."""
        interval = self.settings.watch_interval_s
        failed_at: dict[str, tuple[int, int]] | None = None
        while True:
            await asyncio.sleep(interval)
            assert self._state is not None
            files = await asyncio.to_thread(snapshot, self._state.world.path)
            if files == self._state.files or files == failed_at:
                continue
            try:
                report = await asyncio.to_thread(self.reload, check=check)
            except Exception as exc:  # noqa: BLE001 - a broken edit must not stop the watcher
                failed_at = files
                log.warning("world not reloaded, the previous one stays in use: %s", exc)
                continue
            failed_at = None
            if on_reload is not None:
                on_reload(report)

    # -- per turn -----------------------------------------------------------------------------

    def persona(self, npc_id: str) -> str | None:
        """The NPC's `## Persona` section: stable between reloads (a prefix the engine reuses).

        Raises:
            KeyError: no such NPC.
        """
        assert self._state is not None
        return self._state.personas[npc_id]

    def fit_memory(self, npc_id: str, text: str) -> str | None:
        """A `## Recent Memory` text within its budget (and within what the cap leaves beside
        the NPC's persona): lines from the end go first."""
        persona = self.persona(npc_id)
        room = self.budgets.total - (self.count(persona) if persona else 0)
        budgets = Budgets(0, 0, min(self.budgets.memory, max(0, room)), 0, self.budgets.total)
        return pack(
            persona=None,
            hits=[],
            query="",
            memory=text,
            scene=None,
            budgets=budgets,
            count=self.count,
        ).memory

    def retrieve(self, npc_id: str, query: Query, *, prefer_zone: str | None = None) -> list[Hit]:
        """The chunks the NPC knows that best match `query`.

        Raises:
            KeyError: no such NPC.
        """
        assert self._state is not None
        state = self._state
        index = state.indexes[npc_id]
        if self.settings.retrieval == "off" or not index.chunks or not query.text.strip():
            return []
        qvec = self.embedder.embed([query.text])[0] if self.embedder is not None else None
        s = self.settings
        if prefer_zone is None:
            prefer_zone = state.world.npcs[npc_id].zone
        return index.search(
            query,
            qvec=qvec,
            bm25_k=s.bm25_k,
            dense_k=s.dense_k,
            top_k=s.top_k,
            dense_weight=s.dense_weight,
            prefer_zone=prefer_zone,
            npc=npc_id,
        )

    def context(
        self,
        npc_id: str,
        query: Query,
        *,
        memory: str | None = None,
        scene: SceneState | None = None,
    ) -> Packed:
        """Retrieve for `query` and pack the NPC's four sections within their budgets.

        Raises:
            KeyError: no such NPC.
        """
        start = time.perf_counter()
        if scene is not None and scene.tags():
            query = Query(query.text, query.intent, tuple({*query.tags, *scene.tags()}))
        hits = self.retrieve(npc_id, query, prefer_zone=scene.zone if scene else None)
        packed = pack(
            persona=self.persona(npc_id),
            hits=hits,
            query=query.text,
            memory=memory,
            scene=scene,
            budgets=self.budgets,
            count=self.count,
        )
        self.stats.retrievals += 1
        self.stats.seconds.append(time.perf_counter() - start)
        return packed

    def problems(self) -> list[WorldProblem]:
        """Lore files the current world left out."""
        return list(self.world.skipped)
