"""Archetype chains: per archetype the LoRA adapter of each task and the servers hosting it;
where chains are served (how many servers they need is `mythic.capacity`). Of the seven tasks,
requests apply the `SERVED_TASKS` (dialogue style, action policy); the others' adapters are
kept, not served, and a chain's voice, face and body are reserved, not used yet.

The registry (`open_registry`) is the world's `archetypes.yaml` when embedded and Redis when
several servers share it. `ChainRouter` serves the chains: the adapters each NPC request
applies, loaded on demand into the engines, with the base model as the fallback.
"""

from mythic.archetypes._adapter_file import AdapterFile, inspect_adapter
from mythic.archetypes._chain import (
    DEFAULT_MAX_TOTAL_RANK,
    MAX_HISTORY,
    SERVED_TASKS,
    AdapterInfo,
    AdapterTask,
    ArchetypeChain,
    InvalidAdapterError,
    RankBudgetError,
    RegistryError,
    RegistryFormatError,
    RegistryProblem,
    RegistryUnavailableError,
    TrainingData,
    UnknownArchetypeError,
)
from mythic.archetypes._registry import (
    DEFAULT_PREFIX,
    REGISTRY_FILE,
    ArchetypeRegistry,
    RedisRegistry,
    YamlRegistry,
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
    "SERVED_TASKS",
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
