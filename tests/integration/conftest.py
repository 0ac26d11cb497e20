from __future__ import annotations

from collections.abc import Iterator

import pytest

from mythic import MissingExtraError
from mythic.config import MythicSettings
from mythic.engine import LlamaCppModel, ModelError, load_model
from tests.conftest import unavailable


def _load(name: str, settings: MythicSettings) -> LlamaCppModel:
    try:
        return load_model(name, settings.engine)
    except (ModelError, MissingExtraError) as exc:
        unavailable(f"model {name} is not available: {exc}")
        raise


@pytest.fixture(scope="session")
def qwen(settings: MythicSettings) -> Iterator[LlamaCppModel]:
    model = _load("qwen2.5-coder-0.5b-instruct", settings)
    yield model
    model.close()


@pytest.fixture(scope="session")
def smollm(settings: MythicSettings) -> Iterator[LlamaCppModel]:
    model = _load("smollm2-135m-instruct", settings)
    yield model
    model.close()


@pytest.fixture(scope="session")
def gemma(settings: MythicSettings) -> Iterator[LlamaCppModel]:
    model = _load("gemma3-270m", settings)
    yield model
    model.close()
