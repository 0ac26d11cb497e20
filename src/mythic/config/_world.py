"""`world`: the world a server or chat loads."""

from __future__ import annotations

from pathlib import Path

from mythic.config._section import Section


class WorldSettings(Section):
    """The world an NPC server or chat loads."""

    path: Path | None = None
    """World folder: `world.yaml`, persona cards in `npcs/`, lore in `lore/<zone>/`."""
