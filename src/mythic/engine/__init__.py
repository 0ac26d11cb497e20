"""The model runtime: packaged models, chat formats, and the embedded llama.cpp backend.

Importing this package loads neither llama.cpp nor a model; `LlamaCppModel.load` does.
"""

from mythic.engine._chat_format import ChatFormat, ChatMessage
from mythic.engine._errors import (
    ModelError,
    ModelIntegrityError,
    ModelLoadError,
    ModelNotInstalledError,
    NotAGGUFError,
    UnknownModelError,
)
from mythic.engine._gguf import GGUFInfo, read_gguf_info
from mythic.engine._llamacpp import LlamaCppModel, Sampling, load_model
from mythic.engine.models import (
    PACKAGED_MODELS,
    ModelStore,
    PackagedModel,
    ResolvedModel,
    packaged_model,
)

__all__ = [
    "PACKAGED_MODELS",
    "ChatFormat",
    "ChatMessage",
    "GGUFInfo",
    "LlamaCppModel",
    "ModelError",
    "ModelIntegrityError",
    "ModelLoadError",
    "ModelNotInstalledError",
    "ModelStore",
    "NotAGGUFError",
    "PackagedModel",
    "ResolvedModel",
    "Sampling",
    "UnknownModelError",
    "load_model",
    "packaged_model",
    "read_gguf_info",
]
