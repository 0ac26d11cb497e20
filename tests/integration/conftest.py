from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mythic import MissingExtraError
from mythic.config import EngineSettings, MythicSettings
from mythic.engine import Engine, ModelError
from tests.conftest import unavailable


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
    engine = load_engine("smollm2-135m-instruct", settings)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def gemma(settings: MythicSettings) -> Iterator[Engine]:
    engine = load_engine("gemma3-270m", settings)
    yield engine
    engine.close()
