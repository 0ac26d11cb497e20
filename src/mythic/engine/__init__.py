"""The model runtime: packaged models, chat formats, the embedded llama.cpp backend and the
transformers + PEFT backend.

Importing this package loads neither llama.cpp, torch nor a model; `Engine.load` does.
"""

from mythic.engine._backend import (
    Backend,
    BackendError,
    DecodeInterrupted,
    KVCacheFullError,
    Sampling,
    SequenceChunk,
)
from mythic.engine._chat_format import ChatFormat, ChatMessage
from mythic.engine._config import EngineConfig
from mythic.engine._engine import Engine, EngineMetrics
from mythic.engine._errors import (
    AdapterBudgetError,
    AdapterError,
    AdapterInUseError,
    ContextOverflowError,
    DeadlineExceeded,
    EngineClosedError,
    EngineError,
    GrammarError,
    InvalidRequestError,
    ModelError,
    ModelIntegrityError,
    ModelLoadError,
    ModelNotInstalledError,
    NotAGGUFError,
    Overloaded,
    RequestCancelled,
    RequestError,
    UnknownAdapterError,
    UnknownModelError,
)
from mythic.engine._gguf import GGUFInfo, read_gguf_info
from mythic.engine._llamacpp import LlamaCppBackend, load_backend
from mythic.engine._request import (
    Completion,
    Delta,
    FinishReason,
    GenerationRequest,
    RequestStream,
    SyncRequestStream,
    Timing,
)
from mythic.engine._resident import AdapterHost, ResidentAdapters, ResidentStats
from mythic.engine._scheduler import (
    AdapterKey,
    Priority,
    ScheduledBatch,
    ScheduledChunk,
    ScheduledEntry,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from mythic.engine._trace import EngineTrace, TracedChunk, TracedRequest, TracedStep
from mythic.engine._transformers import TransformersBackend, load_transformers_backend
from mythic.engine.models import (
    PACKAGED_MODELS,
    ModelStore,
    PackagedModel,
    ResolvedModel,
    packaged_model,
)

__all__ = [
    "PACKAGED_MODELS",
    "AdapterBudgetError",
    "AdapterError",
    "AdapterHost",
    "AdapterInUseError",
    "AdapterKey",
    "Backend",
    "BackendError",
    "ChatFormat",
    "ChatMessage",
    "Completion",
    "ContextOverflowError",
    "DeadlineExceeded",
    "DecodeInterrupted",
    "Delta",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineError",
    "EngineMetrics",
    "EngineTrace",
    "FinishReason",
    "GGUFInfo",
    "GenerationRequest",
    "GrammarError",
    "InvalidRequestError",
    "KVCacheFullError",
    "LlamaCppBackend",
    "ModelError",
    "ModelIntegrityError",
    "ModelLoadError",
    "ModelNotInstalledError",
    "ModelStore",
    "NotAGGUFError",
    "Overloaded",
    "PackagedModel",
    "Priority",
    "RequestCancelled",
    "RequestError",
    "RequestStream",
    "ResidentAdapters",
    "ResidentStats",
    "ResolvedModel",
    "Sampling",
    "ScheduledBatch",
    "ScheduledChunk",
    "ScheduledEntry",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SequenceChunk",
    "SyncRequestStream",
    "Timing",
    "TracedChunk",
    "TracedRequest",
    "TracedStep",
    "TransformersBackend",
    "UnknownAdapterError",
    "UnknownModelError",
    "load_backend",
    "load_transformers_backend",
    "packaged_model",
    "read_gguf_info",
]
