from __future__ import annotations

import importlib.util

import pytest

from mythic.config import MythicSettings
from mythic.engine import PACKAGED_MODELS, ModelError, ModelStore
from tests.conftest import unavailable


@pytest.fixture(scope="session", autouse=True)
def _real_models(settings: MythicSettings) -> None:
    """The CLI is driven against the real packaged models: they must be fetched."""
    if importlib.util.find_spec("llama_cpp") is None:
        unavailable("llama-cpp-python is not installed (pip install 'mythic[llm]')")
    store = ModelStore(settings.engine.models_dir)
    for spec in PACKAGED_MODELS:
        if spec.optional:
            continue
        try:
            store.resolve(spec.name)
        except ModelError as exc:
            unavailable(f"{spec.name} is not available: {exc}")
