"""Settings: one class per subsystem, read from `mythic.yaml` and `MYTHIC_*` variables.

Precedence, highest first: values passed in code, environment variables
(`MYTHIC_ENGINE__N_CTX=2048`: a double underscore separates the section from the field), the
YAML file (`--config FILE`, `MYTHIC_CONFIG`, or `./mythic.yaml` when it exists), then the
defaults documented on each field.
"""

from mythic.config._settings import (
    DEFAULT_KIND_TIERS,
    REQUEST_KINDS,
    TOOL_KINDS,
    ArchetypeSettings,
    ChatSettings,
    ConfigError,
    DialogueSettings,
    EndpointSettings,
    EngineSettings,
    JobSettings,
    KnowledgeSettings,
    MemorySettings,
    MythicSettings,
    QualityGate,
    RouteRule,
    RouteSettings,
    ServerSettings,
    SpeechSettings,
    TierSettings,
    WorldSettings,
    check_route,
    default_cache_dir,
    default_data_dir,
    effective_route,
    load_settings,
)

__all__ = [
    "DEFAULT_KIND_TIERS",
    "REQUEST_KINDS",
    "TOOL_KINDS",
    "ArchetypeSettings",
    "ChatSettings",
    "ConfigError",
    "DialogueSettings",
    "EndpointSettings",
    "EngineSettings",
    "JobSettings",
    "KnowledgeSettings",
    "MemorySettings",
    "MythicSettings",
    "QualityGate",
    "RouteRule",
    "RouteSettings",
    "ServerSettings",
    "SpeechSettings",
    "TierSettings",
    "WorldSettings",
    "check_route",
    "default_cache_dir",
    "default_data_dir",
    "effective_route",
    "load_settings",
]
