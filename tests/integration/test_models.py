"""Each packaged model, loaded for real by llama.cpp, generates text."""

from __future__ import annotations

from pathlib import Path

import pytest

from mythic.config import EngineSettings, MythicSettings
from mythic.engine import (
    PACKAGED_MODELS,
    ChatMessage,
    LlamaCppModel,
    ModelLoadError,
    ModelStore,
    NotAGGUFError,
    PackagedModel,
    Sampling,
    load_model,
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
    model: LlamaCppModel = request.getfixturevalue(fixture)
    fmt = model.resolved.chat_format
    assert fmt is not None
    prompt = fmt.render(
        [
            ChatMessage("system", "You are a helpful innkeeper."),
            ChatMessage("user", "Name one drink you sell."),
        ]
    )
    sampling = Sampling(max_tokens=24, temperature=0.0, stop=fmt.stop_strings)
    first = "".join(model.stream(prompt, sampling))
    assert first.strip(), "the model produced no text"
    assert "<|im_end|>" not in first and "<|im_start|>" not in first
    assert "".join(model.stream(prompt, sampling)) == first  # greedy decoding is repeatable


def test_base_model_completes_raw_text(gemma: LlamaCppModel) -> None:
    assert gemma.resolved.chat_format is None
    assert "".join(gemma.stream("The capital of France is", GREEDY)).strip()


def test_a_non_gguf_path_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is not a model")
    with pytest.raises(NotAGGUFError, match="not a GGUF model file"):
        load_model(str(bogus), EngineSettings())


def test_a_truncated_gguf_is_refused_without_a_crash(
    settings: MythicSettings, tmp_path: Path, smollm: LlamaCppModel
) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm.resolved.path.open("rb") as fh:
        cut.write_bytes(fh.read(8 * 1024 * 1024))
    with pytest.raises((ModelLoadError, NotAGGUFError)):
        load_model(str(cut), settings.engine)


def test_a_local_gguf_path_loads_with_its_detected_format(
    settings: MythicSettings, smollm: LlamaCppModel
) -> None:
    model = load_model(str(smollm.resolved.path), settings.engine)
    try:
        assert model.resolved.spec is None
        assert model.resolved.chat_format is smollm.resolved.chat_format
        assert model.count_tokens("hello there") > 0
    finally:
        model.close()
