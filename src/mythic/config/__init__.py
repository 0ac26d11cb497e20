"""Settings: one class per subsystem, read from `mythic.yaml` and `MYTHIC_*` variables.

Precedence, highest first: values passed in code, environment variables
(`MYTHIC_ENGINE__N_CTX=2048`: a double underscore separates the section from the field), the
YAML file (`--config FILE`, `MYTHIC_CONFIG`, or `./mythic.yaml` when it exists), then the
defaults documented on each field.
"""

from mythic.config._archetypes import ArchetypeSettings, QualityGate
from mythic.config._chat import ChatSettings
from mythic.config._dialogue import DialogueSettings
from mythic.config._engine import EngineSettings
from mythic.config._jobs import JobSettings
from mythic.config._knowledge import KnowledgeSettings
from mythic.config._load import ConfigError, load_settings
from mythic.config._mcp import McpServerSettings, McpSettings
from mythic.config._memory import MemorySettings
from mythic.config._mythic import DEFAULT_KIND_TIERS, MythicSettings, effective_route
from mythic.config._observability import ObservabilitySettings
from mythic.config._paths import default_cache_dir, default_data_dir
from mythic.config._route import (
    REQUEST_KINDS,
    TOOL_KINDS,
    EndpointSettings,
    RouteRule,
    RouteSettings,
    TierSettings,
    check_route,
)
from mythic.config._safety import SafetySettings
from mythic.config._scenes import SceneSettings
from mythic.config._server import ServerSettings
from mythic.config._speech import SpeechSettings
from mythic.config._world import WorldSettings

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
    "McpServerSettings",
    "McpSettings",
    "MemorySettings",
    "MythicSettings",
    "ObservabilitySettings",
    "QualityGate",
    "RouteRule",
    "RouteSettings",
    "SafetySettings",
    "SceneSettings",
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
