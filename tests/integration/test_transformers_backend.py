"""The transformers + PEFT backend under the shared engine, on CPU.

A tiny random Qwen2 model (SmolLM2's tokenizer, read from its packaged GGUF) with two real PEFT
LoRA adapters saved to disk: a batch that mixes the base model, each adapter and a stacked set
gives every row exactly what that row gets alone, and what PEFT itself generates for it.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mythic import MissingExtraError
from mythic.config import EngineSettings, MythicSettings
from mythic.engine import (
    AdapterError,
    ChatFormat,
    ChatMessage,
    Engine,
    EngineConfig,
    GenerationRequest,
    GrammarError,
    ModelError,
    Sampling,
    UnknownAdapterError,
)
from tests.conftest import unavailable

pytestmark = pytest.mark.integration

PROMPT = "The vampire lord raised his goblet and said"
GREEDY = Sampling(max_tokens=12, temperature=0.0, repeat_penalty=1.0)


def _need(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        unavailable(f"{module} is not installed (the train extra)")
        raise


@pytest.fixture(scope="module")
def tokenizer(settings: MythicSettings) -> Any:
    transformers = _need("transformers")
    _need("peft")
    from mythic.engine import ModelStore

    try:
        resolved = ModelStore(settings.engine.models_dir).resolve("smollm2-135m-instruct")
    except (ModelError, MissingExtraError) as exc:
        unavailable(f"smollm2-135m-instruct is not available: {exc}")
        raise
    return transformers.AutoTokenizer.from_pretrained(
        str(resolved.path.parent), gguf_file=resolved.path.name
    )


@pytest.fixture(scope="module")
def tiny_config(tokenizer: Any) -> Any:
    transformers = _need("transformers")
    return transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )


@pytest.fixture(scope="module")
def lora_dirs(tiny_config: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two LoRA adapters of random (non-zero) weights, saved as PEFT saves them."""
    torch = _need("torch")
    peft = _need("peft")
    transformers = _need("transformers")
    root = tmp_path_factory.mktemp("loras")
    dirs = {}
    for seed, (name, modules) in enumerate(
        [("vampire", ["q_proj", "v_proj", "o_proj"]), ("zombie", ["q_proj", "k_proj", "up_proj"])]
    ):
        torch.manual_seed(100 + seed)
        base = transformers.AutoModelForCausalLM.from_config(tiny_config)
        config = peft.LoraConfig(
            r=8, lora_alpha=16, target_modules=modules, init_lora_weights=False
        )
        model = peft.get_peft_model(base, config)
        dirs[name] = root / name
        model.save_pretrained(str(dirs[name]))
    return dirs


def _backend(tiny_config: Any, tokenizer: Any, lora_dirs: dict[str, Path]) -> Any:
    from mythic.engine import TransformersBackend

    backend = TransformersBackend.from_config(
        tiny_config,
        tokenizer,
        name="tiny-qwen2",
        chat_format=ChatFormat.CHATML,
        seed=7,
        device="cpu",
        n_ctx=512,
        n_seq_max=16,
        n_batch=256,
    )
    for name, path in lora_dirs.items():
        backend.load_adapter(name, str(path))
    return backend


@pytest.fixture(scope="module")
def engine(tiny_config: Any, tokenizer: Any, lora_dirs: dict[str, Path]) -> Iterator[Engine]:
    backend = _backend(tiny_config, tokenizer, lora_dirs)
    engine = Engine(backend, EngineConfig.for_backend(backend, EngineSettings(seed=1)))
    yield engine
    engine.close()


def _request(npc: str, adapters: dict[str, float], **kwargs: Any) -> GenerationRequest:
    kwargs.setdefault("prompt", PROMPT)
    return GenerationRequest(npc_id=npc, adapters=adapters, sampling=GREEDY, **kwargs)


SETS: dict[str, dict[str, float]] = {
    "base": {},
    "vampire": {"vampire": 1.0},
    "zombie": {"zombie": 1.0},
    "both": {"vampire": 1.0, "zombie": 1.0},
}


async def test_a_mixed_adapter_batch_equals_each_adapter_alone(engine: Engine) -> None:
    alone = {}
    for name, adapters in SETS.items():
        alone[name] = (await engine.submit(_request(f"{name}-alone", adapters)).collect()).text
    calls_before = engine.metrics().decode_calls
    streams = {n: engine.submit(_request(f"{n}-mixed", a)) for n, a in SETS.items()}
    mixed = dict(
        zip(streams, await asyncio.gather(*(s.collect() for s in streams.values())), strict=True)
    )
    assert {n: c.text for n, c in mixed.items()} == alone
    # The four requests shared decode calls: ~13 calls (one per token), not 4 x 13.
    calls = engine.metrics().decode_calls - calls_before
    assert calls <= GREEDY.max_tokens + 2


def test_mixed_rows_have_each_adapters_own_logits(
    tiny_config: Any, tokenizer: Any, lora_dirs: dict[str, Path]
) -> None:
    """Below the engine: one forward pass of four rows of different lengths and positions
    (padding on both sides) gives each row the logits it gets alone; and each adapter set
    changes them, so the comparison compares something."""
    torch = _need("torch")
    from mythic.engine import SequenceChunk

    backend = _backend(tiny_config, tokenizer, lora_dirs)
    try:
        keys = [tuple(sorted(a.items())) for a in SETS.values()]
        prompts = [
            backend.tokenize(PROMPT * (i + 1), add_special=True, parse_special=True)
            for i in range(len(keys))
        ]

        def run(rows: list[int], seq_base: int) -> list[Any]:
            # Prefill all but the last 3 tokens, then evaluate those three together.
            for r in rows:
                backend.decode([SequenceChunk(seq_base + r, prompts[r][:-3], 0, False, keys[r])])
            chunks = [
                SequenceChunk(seq_base + r, prompts[r][-3:], len(prompts[r]) - 3, True, keys[r])
                for r in rows
            ]
            outputs = backend.decode(chunks)
            return [backend._logits[i].clone() for i in outputs]

        alone = [run([r], 10 * (r + 1))[0] for r in range(len(keys))]
        mixed = run(list(range(len(keys))), 100)
        for r, key in enumerate(keys):
            torch.testing.assert_close(mixed[r], alone[r], rtol=1e-4, atol=1e-4, msg=str(key))
        same = [backend.tokenize(PROMPT, add_special=True, parse_special=True)] * len(keys)
        prompts[:] = same
        by_key = run(list(range(len(keys))), 200)
        for r in range(1, len(keys)):
            assert (by_key[r] - by_key[0]).abs().max() > 1e-3, keys[r]
    finally:
        backend.close()


async def test_each_row_matches_what_peft_generates(engine: Engine, tokenizer: Any) -> None:
    torch = _need("torch")
    backend: Any = engine.backend
    model = backend.model
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    for name, adapters in SETS.items():
        got = await engine.submit(_request(f"{name}-ref", adapters)).collect()
        if len(adapters) > 1:
            # PEFT's own reference for a stacked set: both adapters active at once.
            model.base_model.set_adapter(list(adapters))
            try:
                out = model.generate(ids, max_new_tokens=GREEDY.max_tokens, do_sample=False)
            finally:
                model.base_model.set_adapter("vampire")
        else:
            out = model.generate(
                ids,
                max_new_tokens=GREEDY.max_tokens,
                do_sample=False,
                adapter_names=[next(iter(adapters), "__base__")],
            )
        reference = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert got.text == reference, name


async def test_chat_sessions_and_shared_prefixes_change_nothing(engine: Engine) -> None:
    system = ChatMessage("system", "You are Marla, a barkeep at the Crooked Lantern. " * 6)
    turn = [system, ChatMessage("user", "What do you pour tonight?")]
    first = await engine.submit(
        GenerationRequest(npc_id="marla", messages=turn, sampling=GREEDY, session_id="s1")
    ).collect()
    # The second NPC reuses the cached system prefix (a sequence copy); the text is the same.
    second = await engine.submit(
        GenerationRequest(npc_id="other", messages=turn, sampling=GREEDY, session_id="s2")
    ).collect()
    assert first.text == second.text
    assert engine.metrics().cached_prompt_tokens > 0


async def test_adapters_are_loaded_and_unloaded_while_the_engine_runs(
    engine: Engine, tiny_config: Any, tokenizer: Any, lora_dirs: dict[str, Path]
) -> None:
    expected = {}
    for name, adapters in SETS.items():
        expected[name] = (await engine.submit(_request(f"{name}-x", adapters)).collect()).text
    backend = _backend(tiny_config, tokenizer, {})  # the same weights, no adapter yet
    runtime = Engine(backend, EngineConfig.for_backend(backend, EngineSettings(seed=1)))

    async def text(name: str) -> str:
        return (await runtime.submit(_request(f"{name}-rt", SETS[name])).collect()).text

    try:
        async with asyncio.timeout(120):
            for name, path in lora_dirs.items():
                await runtime.aload_adapter(name, path)
            assert {name: await text(name) for name in SETS} == expected
            # Unloading one (PEFT's active one) drops the stacked set built from it; the
            # others are unchanged.
            await runtime.aunload_adapter("vampire")
            assert runtime.adapters == {"zombie"}
            assert backend._combined == {}
            with pytest.raises(UnknownAdapterError):
                runtime.submit(_request("v", SETS["vampire"]))
            assert await text("zombie") == expected["zombie"]
            assert await text("base") == expected["base"]
            await runtime.aunload_adapter("zombie")  # the last one
            assert await text("base") == expected["base"]
            await runtime.aload_adapter("vampire", lora_dirs["vampire"])
            assert await text("vampire") == expected["vampire"]
    finally:
        await runtime.aclose()


async def test_bad_requests_get_typed_errors_and_the_engine_goes_on(
    engine: Engine, tmp_path: Path
) -> None:
    with pytest.raises(GrammarError, match="transformers backend"):
        engine.submit(_request("g", {}, json_schema={"type": "object"}))
    with pytest.raises(UnknownAdapterError):
        engine.submit(_request("u", {"werewolf": 1.0}))
    with pytest.raises(AdapterError, match=r"adapter_config\.json"):
        engine.backend.load_adapter("broken", str(tmp_path))
    done = await engine.submit(_request("after", {"zombie": 1.0})).collect()
    assert done.text


async def test_a_packaged_gguf_model_talks_on_the_transformers_backend(
    settings: MythicSettings,
) -> None:
    _need("transformers")
    engine_settings = EngineSettings(
        **(settings.engine.model_dump() | {"backend": "transformers", "device": "cpu"})
    )
    try:
        engine = Engine.load(engine_settings, "smollm2-135m-instruct")
    except (ModelError, MissingExtraError) as exc:
        unavailable(f"smollm2 on transformers is not available: {exc}")
        raise
    try:
        reply = await engine.submit(
            GenerationRequest(
                npc_id="marla",
                messages=[ChatMessage("user", "What is the capital of France?")],
                sampling=Sampling(max_tokens=24, temperature=0.0),
            )
        ).collect()
    finally:
        engine.close()
    assert "Paris" in reply.text
    assert reply.finish_reason in {"stop", "length"}
