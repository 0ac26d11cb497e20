"""Archetype chains: per archetype the LoRA adapter of each task, its voice, face and body
profiles and the servers hosting it; where chains are served (how many servers they need is
`mythic.capacity`).

The registry (`open_registry`) is the world's `archetypes.yaml` when embedded and Redis when
several servers share it. `ChainRouter` serves the chains: the adapters each NPC request
applies, loaded on demand into the engines, with the base model as the fallback.
"""

from mythic.archetypes._registry import (
    DEFAULT_MAX_TOTAL_RANK,
    DEFAULT_PREFIX,
    MAX_HISTORY,
    REGISTRY_FILE,
    AdapterFile,
    AdapterInfo,
    AdapterTask,
    ArchetypeChain,
    ArchetypeRegistry,
    InvalidAdapterError,
    RankBudgetError,
    RedisRegistry,
    RegistryError,
    RegistryFormatError,
    RegistryProblem,
    RegistryUnavailableError,
    TrainingData,
    UnknownArchetypeError,
    YamlRegistry,
    inspect_adapter,
    open_registry,
)
from mythic.archetypes._serve import (
    ChainRouter,
    ChainStats,
    FallbackReason,
    NPCDelta,
    adapter_name,
)

__all__ = [
    "DEFAULT_MAX_TOTAL_RANK",
    "DEFAULT_PREFIX",
    "MAX_HISTORY",
    "REGISTRY_FILE",
    "AdapterFile",
    "AdapterInfo",
    "AdapterTask",
    "ArchetypeChain",
    "ArchetypeRegistry",
    "ChainRouter",
    "ChainStats",
    "FallbackReason",
    "InvalidAdapterError",
    "NPCDelta",
    "RankBudgetError",
    "RedisRegistry",
    "RegistryError",
    "RegistryFormatError",
    "RegistryProblem",
    "RegistryUnavailableError",
    "TrainingData",
    "UnknownArchetypeError",
    "YamlRegistry",
    "adapter_name",
    "inspect_adapter",
    "open_registry",
]
