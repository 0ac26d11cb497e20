"""Serving archetype adapters on the real engine (SmolLM2-135M, llama.cpp): loading and
unloading while requests run, the resident-adapter LRU under a tiny budget, the fallback to the
base model, and NPCs getting their archetype's adapter through a real server on loopback.

The adapters are small random GGUF LoRAs (`tests/loras.py`): what matters is that they change
greedy output, so "applied" and "not applied" can be told apart.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mythic.archetypes import (
    AdapterInfo,
    ArchetypeChain,
    ChainRouter,
    YamlRegistry,
    adapter_name,
)
from mythic.client import MythicClient
from mythic.config import MythicSettings
from mythic.engine import (
    AdapterError,
    AdapterInUseError,
    ChatMessage,
    Completion,
    Engine,
    GenerationRequest,
    LlamaCppBackend,
    ResidentAdapters,
    Sampling,
    UnknownAdapterError,
)
from mythic.knowledge import load_world
from mythic.route import local_router
from mythic.server import Gateway, serving
from tests.conftest import EXAMPLE_WORLD, unavailable
from tests.integration.conftest import load_engine
from tests.loras import write_lora

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
WAIT = 240  # seconds: a bound on every wait, far above what any of these takes
SMALL = {"max_sequences": 8, "n_ctx": 1024}
"""Engines of these tests hold few sequences: less memory, same outputs."""

SYSTEM = ChatMessage(
    "system",
    "You are playing a character in a video game set in Ravenmoor, a fog-bound city of "
    "vampires, ghouls and tired barkeeps. Stay in character and answer in one sentence.",
)
QUESTIONS = ["Describe the night outside.", "Who rules this city?", "What do you sell?"]


def ask(npc: str, question: str, max_tokens: int = 24, **kwargs: object) -> GenerationRequest:
    return GenerationRequest(
        npc_id=npc,
        messages=[SYSTEM, ChatMessage("user", question)],
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0),
        **kwargs,  # type: ignore[arg-type]
    )


async def run(engine: Engine, request: GenerationRequest) -> Completion:
    async with asyncio.timeout(WAIT):
        return await engine.submit(request).collect()


@pytest.fixture(scope="module")
def engine(settings: MythicSettings) -> Iterator[Engine]:
    """The engine adapters come and go on (each test unloads what it loaded)."""
    engine = load_engine(MODEL, settings, **SMALL)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> dict[str, Path]:
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        unavailable(f"the gguf package writes the test adapters (dev extra): {exc}")
    assert isinstance(engine.backend, LlamaCppBackend)
    base = engine.backend.resolved.path
    folder = tmp_path_factory.mktemp("loras")
    return {
        name: write_lora(base, folder / f"{name}.gguf", seed=seed, scale=0.08)
        for seed, name in enumerate(("vampire", "werewolf", "zombie"), start=1)
    }


@pytest.fixture(scope="module")
def reference(settings: MythicSettings, loras: dict[str, Path]) -> Iterator[Engine]:
    """An engine started with the adapters in its settings: what runtime loading must match."""
    engine = load_engine(MODEL, settings, adapters=loras, **SMALL)
    yield engine
    engine.close()


@pytest.fixture
def clean(engine: Engine) -> Iterator[Engine]:
    """`engine`, with the adapters a test loaded unloaded after it."""
    before = engine.adapters
    yield engine
    for name in engine.adapters - before:
        engine.unload_adapter(name)


# -- the engine ----------------------------------------------------------------------------------


async def test_an_adapter_loaded_while_requests_run_matches_one_loaded_at_start(
    clean: Engine, reference: Engine, loras: dict[str, Path]
) -> None:
    engine = clean
    base = [(await run(engine, ask(f"b{i}", q, 48))).text for i, q in enumerate(QUESTIONS)]
    expected = (await run(reference, ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))).text
    assert expected != (await run(reference, ask("b", QUESTIONS[0]))).text, "no visible effect"
    async with asyncio.timeout(WAIT):
        # Base streams keep running while the adapter is loaded between two of their steps.
        talking = [engine.submit(ask(f"t{i}", q, 48)) for i, q in enumerate(QUESTIONS)]
        first = await anext(talking[0])
        await engine.aload_adapter("vampire", loras["vampire"])
        assert "vampire" in engine.adapters
        vampire = engine.submit(ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))
        # Queued with it: the unload is refused rather than pulled from under the request.
        with pytest.raises(AdapterInUseError):
            await engine.aunload_adapter("vampire")
        assert engine.adapters_in_use() == {"vampire"}
        got = await vampire.collect()
        rest = [await stream.collect() for stream in talking]
    assert got.text == expected
    assert [first.text + rest[0].text, *(c.text for c in rest[1:])] == base
    # Nothing uses it now: it goes, and requests naming it are refused.
    assert engine.adapters_in_use() == frozenset()
    await engine.aunload_adapter("vampire")
    assert "vampire" not in engine.adapters
    with pytest.raises(UnknownAdapterError):
        engine.submit(ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))
    with pytest.raises(AdapterError):
        await engine.aunload_adapter("vampire")
    # Loaded again under the same name, the same session reuses nothing computed before.
    await asyncio.to_thread(engine.load_adapter, "vampire", loras["vampire"])  # blocking form
    again = await run(engine, ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))
    assert again.text == expected
    after = await run(engine, ask("b0", QUESTIONS[0], 48))
    assert after.text == base[0]
    metrics = engine.metrics()
    assert metrics.adapter_loads >= 2 and metrics.adapter_unloads >= 1
    assert metrics.adapter_requests["vampire"] >= 2


async def test_a_missing_adapter_file_is_a_typed_error_and_the_engine_goes_on(
    clean: Engine, tmp_path: Path
) -> None:
    with pytest.raises(AdapterError):
        await clean.aload_adapter("ghost", tmp_path / "ghost.gguf")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF not really")
    with pytest.raises(AdapterError):
        await clean.aload_adapter("bogus", bogus)
    assert "ghost" not in clean.adapters and "bogus" not in clean.adapters
    assert (await run(clean, ask("x", QUESTIONS[1]))).text.strip()


async def test_the_least_recently_used_adapter_is_evicted_under_a_tiny_budget(
    clean: Engine, reference: Engine, loras: dict[str, Path]
) -> None:
    size = loras["vampire"].stat().st_size
    resident = ResidentAdapters.for_engine(clean, budget_bytes=size * 2 + size // 2)
    async with asyncio.timeout(WAIT):
        await resident.ensure("vampire", loras["vampire"])
        await resident.ensure("werewolf", loras["werewolf"])
        resident.touch("vampire")  # werewolf is now the least recently used
        await resident.ensure("zombie", loras["zombie"])
        assert resident.names == ["vampire", "zombie"]
        assert clean.adapters >= {"vampire", "zombie"} and "werewolf" not in clean.adapters
        assert resident.used_bytes <= resident.budget_bytes
        # A request holds vampire (the least recently used now): zombie goes instead.
        holding = clean.submit(ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))
        await resident.ensure("werewolf", loras["werewolf"])
        assert resident.names == ["vampire", "werewolf"]
        held = await holding.collect()
        wolf = await run(clean, ask("w", QUESTIONS[0], adapters={"werewolf": 1.0}))
    assert (
        held.text == (await run(reference, ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))).text
    )
    assert (
        wolf.text == (await run(reference, ask("w", QUESTIONS[0], adapters={"werewolf": 1.0}))).text
    )
    assert (resident.stats.loads, resident.stats.evictions) == (4, 2)


# -- the chain router ----------------------------------------------------------------------------


def lora_info(path: Path, task: str = "dialogue_style", base: str = MODEL) -> AdapterInfo:
    return AdapterInfo.model_validate(
        {
            "task": task,
            "path": str(path),
            "format": "gguf",
            "base_model": base,
            "rank": 4,
            "size_bytes": path.stat().st_size,
        }
    )


async def test_the_base_model_serves_when_the_registry_has_no_adapter(
    clean: Engine, reference: Engine, loras: dict[str, Path], tmp_path: Path
) -> None:
    registry = YamlRegistry(tmp_path / "archetypes.yaml")
    await registry.put(ArchetypeChain(archetype="zombie"))
    vampire = await registry.register_adapter("vampire", lora_info(loras["vampire"]))
    await registry.register_adapter(
        "werewolf", lora_info(loras["werewolf"], base="qwen2.5-coder-0.5b-instruct")
    )
    base = (await run(clean, ask("b", QUESTIONS[0]))).text
    wanted = (await run(reference, ask("v", QUESTIONS[0], adapters={"vampire": 1.0}))).text
    resident = ResidentAdapters.for_engine(clean, budget_bytes=64 * 1024 * 1024)
    async with ChainRouter(registry, [resident]) as chains:
        await chains.refresh()

        async def reply(archetype: str, npc: str) -> str:
            request = ask(npc, QUESTIONS[0])
            request.adapters = chains.adapters_for(archetype, "dialogue_style", base_model=MODEL)
            return (await run(clean, request)).text

        # No adapter for zombies, none at all for ghouls, the werewolf's is for another model.
        assert await reply("zombie", "z") == base
        assert await reply("ghoul", "g") == base
        assert await reply("werewolf", "w") == base
        # The vampire's is registered: the base model serves while it loads...
        assert await reply("vampire", "v1") == base
        async with asyncio.timeout(WAIT):
            await chains.settle()
        # ...and the next request has it, exactly as an engine started with it.
        assert await reply("vampire", "v2") == wanted
    assert adapter_name("vampire", vampire) in clean.adapters
    assert chains.stats.fallbacks == {
        ("zombie", "dialogue_style", "unregistered"): 1,
        ("ghoul", "dialogue_style", "unregistered"): 1,
        ("werewolf", "dialogue_style", "other_base"): 1,
        ("vampire", "dialogue_style", "not_resident"): 1,
    }
    assert chains.stats.served == {("vampire", "dialogue_style"): 1}


# -- through the server --------------------------------------------------------------------------


@pytest.fixture
def server_engine(settings: MythicSettings) -> Iterator[Engine]:
    """The server's own engine: its adapters are the server's business."""
    engine = load_engine(MODEL, settings, **SMALL)
    yield engine
    engine.close()


async def test_an_npc_gets_its_archetypes_adapter_through_the_server(
    server_engine: Engine, settings: MythicSettings, loras: dict[str, Path], tmp_path: Path
) -> None:
    world = tmp_path / "ravenmoor"
    shutil.copytree(EXAMPLE_WORLD, world)
    registry = YamlRegistry(world)  # the world's archetypes.yaml: found without a setting
    style = await registry.register_adapter("vampire", lora_info(loras["vampire"]))
    policy = await registry.register_adapter(
        "vampire", lora_info(loras["zombie"], task="action_policy")
    )
    effective = settings.model_copy(
        update={
            "chat": settings.chat.model_copy(update={"max_tokens": 16, "temperature": 0.0}),
            # One request per line: a reply the line filter generates again would be a
            # second use of the adapter (which of them the filter catches depends on what
            # the shared engine's cache holds from earlier tests).
            "dialogue": settings.dialogue.model_copy(
                update={"decide": False, "line_filter": False}
            ),
        }
    )
    gateway = Gateway(effective, load_world(world), router=local_router(effective, server_engine))
    assert gateway.chains is not None
    style_name, policy_name = adapter_name("vampire", style), adapter_name("vampire", policy)

    def uses() -> dict[str, int]:
        return server_engine.metrics().adapter_requests

    async with (
        serving(gateway) as (host, port),
        httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=WAIT) as http,
    ):
        assert sorted(gateway.chains.chains) == [
            "ghoul",
            "human",
            "lich",
            "vampire",
            "werewolf",
            "zombie",
        ]
        # The countess's first line finds her adapter not loaded yet: the base model answers
        # while it loads; from her next line on, her replies have it.
        first = await http.post("/v1/npcs/countess_isolde/say", json={"text": "Good evening."})
        assert first.status_code == 200 and first.json()["text"]
        async with asyncio.timeout(WAIT):
            await gateway.chains.settle()
        assert style_name in server_engine.adapters
        assert uses().get(style_name, 0) == 0
        second = await http.post("/v1/npcs/countess_isolde/say", json={"text": "Who are you?"})
        assert second.status_code == 200 and second.json()["text"]
        assert uses()[style_name] == 1
        # Marla is human: no adapter, the base model.
        before = uses()
        marla = await http.post("/v1/npcs/marla/say", json={"text": "Good evening."})
        assert marla.status_code == 200 and marla.json()["text"]
        assert uses() == before
        # Intent decisions apply the action_policy adapter.
        async with MythicClient(f"ws://{host}:{port}/v1/ws") as client, asyncio.timeout(WAIT):
            await client.intent("countess_isolde", context="the player bows")
            await gateway.chains.settle()
            await client.intent("countess_isolde", context="the player bows again")
        assert uses()[policy_name] == 1
        metrics = (await http.get("/metrics")).text
        # Unloaded after the router chose it (here: behind its back), the adapter is refused
        # by the engine: the base model answers the line, and the next one loads it again.
        await server_engine.aunload_adapter(style_name)
        third = await http.post("/v1/npcs/countess_isolde/say", json={"text": "Farewell."})
        assert third.status_code == 200 and third.json()["text"]
        assert gateway.chains.stats.fallbacks[("vampire", "dialogue_style", "refused")] == 1
        assert style_name not in gateway.chains.residents[MODEL]
    assert 'mythic_adapter_served_total{archetype="vampire",task="dialogue_style"} 1.0' in metrics
    assert 'mythic_adapter_served_total{archetype="vampire",task="action_policy"} 1.0' in metrics
    assert (
        'mythic_adapter_fallbacks_total{archetype="human",reason="unregistered",'
        'task="dialogue_style"} 1.0' in metrics
    )
    assert f'mythic_adapters_resident{{model="{MODEL}"}} 2.0' in metrics
    assert f'mythic_engine_adapter_requests_total{{adapter="{style_name}",' in metrics
