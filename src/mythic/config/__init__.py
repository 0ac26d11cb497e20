"""Settings: one class per subsystem, read from `mythic.yaml` and `MYTHIC_*` variables.

Precedence, highest first: values passed in code, environment variables
(`MYTHIC_ENGINE__N_CTX=2048`: a double underscore separates the section from the field), the
YAML file (`--config FILE`, `MYTHIC_CONFIG`, or `./mythic.yaml` when it exists), then the
defaults documented on each field.
"""

from mythic.config._settings import (
    ChatSettings,
    ConfigError,
    DialogueSettings,
    EngineSettings,
    KnowledgeSettings,
    MemorySettings,
    MythicSettings,
    ServerSettings,
    WorldSettings,
    default_cache_dir,
    default_data_dir,
    load_settings,
)

__all__ = [
    "ChatSettings",
    "ConfigError",
    "DialogueSettings",
    "EngineSettings",
    "KnowledgeSettings",
    "MemorySettings",
    "MythicSettings",
    "ServerSettings",
    "WorldSettings",
    "default_cache_dir",
    "default_data_dir",
    "load_settings",
]
