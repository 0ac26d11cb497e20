from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mythic._errors import MythicError

DEFAULT_CONFIG_FILE = Path("mythic.yaml")
_file_values: ContextVar[dict[str, Any] | None] = ContextVar("mythic_file_values", default=None)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mythic"


class ConfigError(MythicError):
    """The configuration file or an environment variable holds an invalid value."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class EngineSettings(_Section):
    """The embedded model runtime."""

    models_dir: Path = Field(default_factory=lambda: default_cache_dir() / "models")
    """Where packaged models are assembled and their verification records kept."""

    dialogue_model: str = "qwen2.5-coder-0.5b-instruct"
    """Model for NPC dialogue: a packaged model name (`mythic models list`) or a path to a GGUF."""

    intent_model: str = "smollm2-135m-instruct"
    """Model for short intents and barks: a packaged model name or a path to a GGUF."""

    chat_format: Literal["chatml", "llama-3", "gemma"] | None = None
    """Chat template for a GGUF path whose template is not recognised (chatml, llama-3, gemma)."""

    n_ctx: int = Field(default=2048, ge=256, le=131072)
    """Context window of one NPC sequence, in tokens; capped at the model's own. KV memory for
    `n_ctx * max_sequences` cells is reserved at load."""

    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for generation; default: all cores."""

    n_gpu_layers: int = Field(default=0, ge=-1)
    """Layers to offload to a GPU in CUDA/Metal builds of llama.cpp (-1: all)."""

    seed: int = Field(default=-1, ge=-1)
    """Sampling seed; -1 picks a random one."""

    max_sequences: int = Field(default=32, ge=2, le=256)
    """Sequences held in the shared KV memory: active NPC sessions plus cached prefixes."""

    n_batch: int = Field(default=512, ge=32, le=8192)
    """Tokens evaluated per model step, all sequences together."""

    prefill_chunk: int = Field(default=64, ge=1)
    """Prompt tokens a non-gold request evaluates per step, so long prompts cannot stall
    the other streams."""

    burst_tokens: int = Field(default=48, ge=1)
    """Tokens an NPC generates per turn before it competes for its batch slot again."""

    max_waiting: int = Field(default=256, ge=1)
    """Requests queued for admission; one more is refused with `Overloaded`."""

    overflow: Literal["error", "truncate"] = "error"
    """A prompt longer than the context: `error` refuses it with `ContextOverflowError`;
    `truncate` drops the oldest non-system messages (or the start of a raw prompt)."""

    prefix_min_tokens: int = Field(default=32, ge=1)
    """Shortest system prefix worth caching and sharing between NPCs' sequences."""

    batch_invariant: bool = True
    """Make each NPC's output independent of which other NPCs share its batch (greedy replies
    are then reproducible), at some cost in speed; off lets llama.cpp use its fastest kernels."""

    gold_preempts: bool = True
    """A gold request (the player's current partner, intents) stops a model step already
    running for other NPCs, runs first, and the stopped step is redone. Gold then never waits
    for a whole step; the redone step costs the others a little time, and at a near-tie a
    redone step can pick another token than it would have."""

    adapters: dict[str, Path] = Field(default_factory=dict)
    """LoRA adapters (GGUF) to load at start, by the name requests use: {vampire: path}."""


class ChatSettings(_Section):
    """Sampling and history for a conversation with one NPC."""

    max_tokens: int = Field(default=200, ge=1, le=4096)
    """Longest reply, in tokens."""

    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy."""

    top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    """Nucleus sampling threshold."""

    top_k: int = Field(default=40, ge=0)
    """Sample among the k most likely tokens (0: no limit)."""

    repeat_penalty: float = Field(default=1.1, ge=1.0, le=2.0)
    """Penalty on recently generated tokens."""

    history_turns: int = Field(default=16, ge=0, le=200)
    """Player/NPC exchanges kept in the prompt (older ones drop first when the context fills)."""


class WorldSettings(_Section):
    """The world an NPC server or chat loads."""

    path: Path | None = None
    """World folder: `world.yaml`, persona cards in `npcs/`, lore in `lore/<zone>/`."""


class MythicSettings(BaseSettings):
    """All of Mythic's settings, one section per subsystem."""

    model_config = SettingsConfigDict(
        env_prefix="MYTHIC_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    engine: EngineSettings = Field(default_factory=EngineSettings)
    chat: ChatSettings = Field(default_factory=ChatSettings)
    world: WorldSettings = Field(default_factory=WorldSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_settings = InitSettingsSource(settings_cls, init_kwargs=_file_values.get() or {})
        return (init_settings, env_settings, file_settings)


def _resolve_config_file(config_file: str | Path | None) -> Path | None:
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"configuration file {path} does not exist")
        return path
    env = os.environ.get("MYTHIC_CONFIG")
    if env:
        return _resolve_config_file(env)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (engine:, chat:, world:), "
            f"got a {type(data).__name__}"
        )
    return data


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> MythicSettings:
    """Build the effective settings.

    Args:
        config_file: a YAML file; default `MYTHIC_CONFIG`, else `./mythic.yaml` if present.
        **overrides: section values that win over everything else.

    Raises:
        ConfigError: the file is not valid YAML or a value is invalid; the message names the
            file and the setting.
    """
    path = _resolve_config_file(config_file)
    where = f"{path}" if path else "environment"
    token = _file_values.set(_read_yaml(path) if path else {})
    try:
        return MythicSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration ({where}): {problems}") from exc
    finally:
        _file_values.reset(token)
