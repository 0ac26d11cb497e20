"""What NPCs know: persona cards, lore per zone, retrieval and context packing.

A world is a folder::

    world.yaml              name, description, zones
    npcs/<npc id>.yaml      persona cards
    lore/*.md               world-wide lore (optional front matter: title, tags)
    lore/<zone id>/*.md     lore of a zone (or .yaml: title, tags, text / entries)

`Knowledge` cuts the lore into chunks, indexes them per zone (BM25 with `bm25s` and
384-dimensional all-MiniLM-L6-v2 embeddings, blended), and packs each turn's context into
`## Persona`, `## Lore`, `## Recent Memory` and `## Scene` within token budgets.
"""

from mythic.knowledge._calendar import Calendar, GameDateError, Month
from mythic.knowledge._cards import WorldLoadError, WorldProblem
from mythic.knowledge._chunks import Chunk, chunk_text
from mythic.knowledge._embed import Embedder, KnowledgeError, MiniLM, shared_embedder
from mythic.knowledge._index import Hit, Index, Query, terms
from mythic.knowledge._knowledge import Knowledge, KnowledgeStats, ReloadReport, world_chunks
from mythic.knowledge._pack import (
    ANSWER_NOTE,
    HEADERS,
    INTENTS,
    MORE_LORE,
    PROMPT_RULES,
    Budgets,
    Packed,
    SceneObject,
    SceneState,
    answer_line,
    intent_prompt,
    intent_schema,
    introduction,
    lore_beyond,
    pack,
    pack_persona,
    persona_lines,
    persona_prompt,
)
from mythic.knowledge._tokens import CHARS_PER_TOKEN, TokenCounter, approx_tokens, fit_tokens
from mythic.knowledge._world import (
    LoreDoc,
    Persona,
    TurnTaking,
    World,
    WorldCard,
    Zone,
    load_world,
)

__all__ = [
    "ANSWER_NOTE",
    "CHARS_PER_TOKEN",
    "HEADERS",
    "INTENTS",
    "MORE_LORE",
    "PROMPT_RULES",
    "Budgets",
    "Calendar",
    "Chunk",
    "Embedder",
    "GameDateError",
    "Hit",
    "Index",
    "Knowledge",
    "KnowledgeError",
    "KnowledgeStats",
    "LoreDoc",
    "MiniLM",
    "Month",
    "Packed",
    "Persona",
    "Query",
    "ReloadReport",
    "SceneObject",
    "SceneState",
    "TokenCounter",
    "TurnTaking",
    "World",
    "WorldCard",
    "WorldLoadError",
    "WorldProblem",
    "Zone",
    "answer_line",
    "approx_tokens",
    "chunk_text",
    "fit_tokens",
    "intent_prompt",
    "intent_schema",
    "introduction",
    "load_world",
    "lore_beyond",
    "pack",
    "pack_persona",
    "persona_lines",
    "persona_prompt",
    "shared_embedder",
    "terms",
    "world_chunks",
]
