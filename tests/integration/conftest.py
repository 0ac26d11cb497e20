from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mythic import MissingExtraError
from mythic.config import EngineSettings, MythicSettings
from mythic.engine import Engine, ModelError
from tests.conftest import unavailable
from tests.integration.conformance import mythic_serve, speak_clips


def load_engine(name: str, settings: MythicSettings, **overrides: Any) -> Engine:
    """An engine on a packaged model, or a skip (a failure under CI=true) when it is missing."""
    engine_settings = EngineSettings(**(settings.engine.model_dump() | overrides))
    try:
        return Engine.load(engine_settings, name)
    except (ModelError, MissingExtraError) as exc:
        unavailable(f"model {name} is not available: {exc}")
        raise


@pytest.fixture(scope="session")
def qwen(settings: MythicSettings) -> Iterator[Engine]:
    engine = load_engine("qwen2.5-coder-0.5b-instruct", settings)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def smollm(settings: MythicSettings) -> Iterator[Engine]:
    # Batch-invariant (not the default): tests compare its greedy replies across loads,
    # prefix copies and evictions, which only that mode makes exact.
    engine = load_engine("smollm2-135m-instruct", settings, batch_invariant=True)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def gemma(settings: MythicSettings) -> Iterator[Engine]:
    engine = load_engine("gemma3-270m", settings)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def conformance_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The conformance suite's server (`tests/integration/conformance.py`), one for every
    SDK's player in a test run: a server's start is a good part of a player's time."""
    with mythic_serve(tmp_path_factory.mktemp("conformance")) as url:
        yield url


@pytest.fixture(scope="session")
def conformance_audio(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the suite's audio clips (`MYTHIC_CONFORMANCE_AUDIO` for the players),
    made once per test run."""
    folder = tmp_path_factory.mktemp("conformance-audio")
    asyncio.run(speak_clips(folder))
    return folder
