"""`archetypes`: archetype chains and the quality gate of their adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mythic.config._section import Section


class QualityGate(Section):
    """The quality gate of a new adapter, scored against the base model in the same run."""

    min_gain: float = Field(default=0.0, ge=-1.0, le=1.0)
    """The adapter must beat the base by more than this on each of its task's probes (0-1)."""
    min_score: float = Field(default=0.5, ge=0.0, le=1.0)
    """...and score at least this on each."""
    max_violations: int = Field(default=0, ge=0)
    """Intents an archetype never chooses (a zombie trading) that the action adapter may
    still choose in the probes."""
    max_lore_drop: float = Field(default=0.25, ge=0.0, le=1.0)
    """How far below the base the dialogue adapter may score on the world's lore probes of
    its NPCs (a regression check: it must not make them forget their facts)."""


class ArchetypeSettings(Section):
    """Archetype chains: which LoRA adapters serve each archetype's NPCs."""

    registry: str | None = None
    """The chain registry: a YAML file (or a folder holding `archetypes.yaml`) or a `redis://`
    URL. Unset: the world's `archetypes.yaml` when it has one; with no registry every NPC is
    served by the base model."""

    refresh_s: float = Field(default=30.0, ge=0, le=86400)
    """How often the server rereads the registry for newly registered adapters (0: only at
    start)."""

    provision: Literal["off", "command", "first_use"] = "command"
    """Adapters for an archetype that has none: `command`, only by `mythic archetypes
    provision`; `first_use`, also when the server first serves an NPC of that archetype (a
    separate low-priority process trains, evaluates and registers; the base model serves
    meanwhile); `off`, never."""

    provision_steps: int = Field(default=40, ge=1, le=100_000)
    """Training steps per task when provisioning on first use."""

    gate: QualityGate = Field(default_factory=lambda: QualityGate())
    """What an adapter must reach in `mythic eval archetype` to be registered."""
