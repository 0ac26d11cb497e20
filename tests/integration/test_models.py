"""Each packaged model, loaded for real by llama.cpp, generates text."""

from __future__ import annotations

from pathlib import Path

import pytest

from mythic.config import EngineSettings, MythicSettings
from mythic.engine import (
    PACKAGED_MODELS,
    ChatMessage,
    Engine,
    GenerationRequest,
    LlamaCppBackend,
    ModelLoadError,
    ModelStore,
    NotAGGUFError,
    PackagedModel,
    Sampling,
    load_backend,
)
from tests.conftest import unavailable

pytestmark = pytest.mark.integration

GREEDY = Sampling(max_tokens=24, temperature=0.0, seed=7)


@pytest.mark.parametrize(
    "spec", [m for m in PACKAGED_MODELS if not m.optional], ids=lambda m: m.name
)
def test_packaged_model_verifies(settings: MythicSettings, spec: PackagedModel) -> None:
    store = ModelStore(settings.engine.models_dir)
    if not store.location(spec).exists():
        unavailable(f"{spec.name} is not fetched (mythic models fetch)")
    report = store.verify(spec)
    assert report.ok, report.problem


@pytest.mark.parametrize("fixture", ["smollm", "qwen"])
def test_chat_models_generate_text(fixture: str, request: pytest.FixtureRequest) -> None:
    engine: Engine = request.getfixturevalue(fixture)
    messages = [
        ChatMessage("system", "You are a helpful innkeeper."),
        ChatMessage("user", "Name one drink you sell."),
    ]
    sampling = Sampling(max_tokens=24, temperature=0.0)

    def ask() -> str:
        req = GenerationRequest(npc_id="innkeeper", messages=messages, sampling=sampling)
        return engine.submit_sync(req).collect().text

    first = ask()
    assert first.strip(), "the model produced no text"
    assert "<|im_end|>" not in first and "<|im_start|>" not in first
    second = ask()  # now from the cached prefix
    assert ask() == second  # greedy decoding is repeatable from the same cache state
    if fixture == "smollm":
        # SmolLM2's kernels are batch-invariant: a prefix evaluated fresh or reused from the
        # cache gives the same text. Qwen 0.5B's are not (README, known limits).
        assert second == first


def test_base_model_completes_raw_text(gemma: Engine) -> None:
    assert gemma.backend.chat_format is None
    req = GenerationRequest(npc_id="narrator", prompt="The capital of France is", sampling=GREEDY)
    assert gemma.submit_sync(req).collect().text.strip()


def test_a_non_gguf_path_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is not a model")
    with pytest.raises(NotAGGUFError, match="not a GGUF model file"):
        load_backend(str(bogus), EngineSettings())


def test_a_truncated_gguf_is_refused_without_a_crash(
    settings: MythicSettings, tmp_path: Path, smollm: Engine
) -> None:
    cut = tmp_path / "cut.gguf"
    assert isinstance(smollm.backend, LlamaCppBackend)
    with smollm.backend.resolved.path.open("rb") as fh:
        cut.write_bytes(fh.read(8 * 1024 * 1024))
    with pytest.raises((ModelLoadError, NotAGGUFError)):
        load_backend(str(cut), settings.engine)


def test_a_local_gguf_path_loads_with_its_detected_format(
    settings: MythicSettings, smollm: Engine
) -> None:
    assert isinstance(smollm.backend, LlamaCppBackend)
    backend = load_backend(str(smollm.backend.resolved.path), settings.engine, n_seq_max=4)
    try:
        assert backend.resolved.spec is None
        assert backend.chat_format is smollm.backend.chat_format
        assert backend.tokenize("hello there", add_special=False, parse_special=False)
    finally:
        backend.close()
