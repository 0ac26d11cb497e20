"""`MythicSettings`: every section together, and the routes they imply."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mythic.config._archetypes import ArchetypeSettings
from mythic.config._chat import ChatSettings
from mythic.config._dialogue import DialogueSettings
from mythic.config._engine import EngineSettings
from mythic.config._jobs import JobSettings
from mythic.config._knowledge import KnowledgeSettings
from mythic.config._mcp import McpSettings
from mythic.config._memory import MemorySettings
from mythic.config._observability import ObservabilitySettings
from mythic.config._route import (
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

# The YAML file's values while `load_settings` builds the settings: they rank below the
# environment, which a plain init argument would not.
file_values: ContextVar[dict[str, Any] | None] = ContextVar("mythic_file_values", default=None)


class MythicSettings(BaseSettings):
    """All of Mythic's settings, one section per subsystem."""

    model_config = SettingsConfigDict(
        env_prefix="MYTHIC_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    engine: EngineSettings = Field(default_factory=EngineSettings)
    """The embedded model runtime."""
    chat: ChatSettings = Field(default_factory=ChatSettings)
    """Sampling and history of a conversation with one NPC."""
    dialogue: DialogueSettings = Field(default_factory=DialogueSettings)
    """NPC actors: turns, intents and tool calls."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    """`mythic serve`: the WebSocket and HTTP gateway."""
    world: WorldSettings = Field(default_factory=WorldSettings)
    """The world a server or chat loads."""
    memory: MemorySettings = Field(default_factory=MemorySettings)
    """What NPCs remember of players: hot, warm and cold tiers."""
    knowledge: KnowledgeSettings = Field(default_factory=KnowledgeSettings)
    """What NPCs know at each turn, packed into prompt sections."""
    route: RouteSettings = Field(default_factory=RouteSettings)
    """Tiers, endpoints and routing rules."""
    jobs: JobSettings = Field(default_factory=JobSettings)
    """Bronze jobs on a durable queue."""
    safety: SafetySettings = Field(default_factory=SafetySettings)
    """Content guardrails: the world's policy on players' lines, replies and tool calls."""
    scenes: SceneSettings = Field(default_factory=SceneSettings)
    """Group conversations: members, who answers, NPCs answering each other."""
    speech: SpeechSettings = Field(default_factory=SpeechSettings)
    """Speech in and out, and their worker processes."""
    archetypes: ArchetypeSettings = Field(default_factory=ArchetypeSettings)
    """Archetype chains: which adapters serve each archetype's NPCs."""
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    """Traces of each turn (OpenTelemetry), kept in memory and exported over OTLP."""
    mcp: McpSettings = Field(default_factory=McpSettings)
    """MCP servers whose tools NPCs may call."""

    @model_validator(mode="after")
    def _route_consistent(self) -> MythicSettings:
        check_route(effective_route(self))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_settings = InitSettingsSource(settings_cls, init_kwargs=file_values.get() or {})
        return (init_settings, env_settings, file_settings)


GOLD_N_CTX = 1024
"""Context of a sequence on the default gold endpoint: an intent prompt is about 200 tokens,
400 with a long scene and context."""
GOLD_SEQUENCES = 8
"""Sequences of the default gold endpoint's engine: decisions are short and many NPCs take
turns on them (SmolLM2-135M at 1024 tokens: 184 MB of KV, against 1,440 MB at the dialogue
engine's 32 x 2048)."""

DEFAULT_KIND_TIERS: dict[str, str] = {
    "intent": "gold",
    "bark": "gold",
    "tool_decision": "silver",
    "speaker": "gold",
    "dialogue": "silver",
    "tool_dialogue": "silver",
    "summary": "bronze",
    "story": "bronze",
    "lore_gen": "bronze",
    "quest": "bronze",
}


def effective_route(settings: MythicSettings) -> RouteSettings:
    """The route settings with the embedded defaults filled in: an endpoint per engine model
    and the gold, silver and bronze tiers, unless configured."""
    route = settings.route
    engine = settings.engine
    endpoints = {
        # Intents and barks: a persona and a scene (about 200 tokens) and a few JSON tokens;
        # the intent model's KV (22.5 KB a token on SmolLM2) is sized for that, not for a
        # conversation (`GOLD_N_CTX`).
        "embedded-gold": EndpointSettings(
            model=engine.intent_model, n_ctx=GOLD_N_CTX, max_sequences=GOLD_SEQUENCES
        ),
        "embedded-silver": EndpointSettings(model=engine.dialogue_model),
        "embedded-bronze": EndpointSettings(model=engine.bronze_model),
    }
    tiers = {
        "gold": TierSettings(
            endpoints=["embedded-gold"],
            max_batch=64,
            max_tokens=64,
            retrieval=False,
            # Its engine's context is GOLD_N_CTX: a longer prompt (a rule sending dialogue
            # to gold by deadline) goes to the next tier up; a quarter kept for the estimate.
            max_context_tokens=GOLD_N_CTX * 3 // 4,
        ),
        "silver": TierSettings(endpoints=["embedded-silver"], tools=True),
        "bronze": TierSettings(
            endpoints=["embedded-bronze"], fallback=["embedded-silver"], max_batch=4
        ),
    }
    endpoints.update(route.endpoints)
    tiers.update(route.tiers)
    used = {name for tier in tiers.values() for name in (*tier.endpoints, *tier.fallback)}
    endpoints = {k: v for k, v in endpoints.items() if k in used or k in route.endpoints}
    rules = [
        *route.rules,
        *(RouteRule(tier=t, kinds=[k]) for k, t in DEFAULT_KIND_TIERS.items()),
    ]
    return route.model_copy(update={"endpoints": endpoints, "tiers": tiers, "rules": rules})
