"""What NPCs know: their persona cards and their world's lore.

A world is a folder::

    world.yaml            name, description, zones
    npcs/<npc id>.yaml    persona cards
    lore/<zone id>/*.md   lore documents (optional front matter: title, tags)
"""

from mythic.knowledge._cards import WorldLoadError, WorldProblem
from mythic.knowledge._world import LoreDoc, Persona, World, WorldCard, Zone, load_world

__all__ = [
    "LoreDoc",
    "Persona",
    "World",
    "WorldCard",
    "WorldLoadError",
    "WorldProblem",
    "Zone",
    "load_world",
]
