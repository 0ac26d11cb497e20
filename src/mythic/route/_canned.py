"""The end of every fallback chain: a canned line in the NPC's voice, so the game never gets
silence or an exception when no model can answer."""

from __future__ import annotations

import zlib

CANNED_LINES: dict[str, tuple[str, ...]] = {
    "vampire": (
        "The night is long, mortal. Ask me again in a moment.",
        "Patience. Even the dead must gather their thoughts.",
    ),
    "zombie": ("Hnnngh... wait...", "Uuurgh. Brain... slow..."),
    "werewolf": ("Grr. Give me a moment, the moon clouds my head.", "Hold. Something stirs."),
    "ghoul": ("Heh. Not now, not now...", "Ssh. Let me think, fresh one."),
    "lich": (
        "Centuries of memory, and yet the thought escapes me. Ask again.",
        "Silence. I am consulting older powers.",
    ),
    "human": ("Sorry, friend, my mind wandered. Say that again?", "Hm? Give me a moment."),
}
DEFAULT_LINES = ("Hm. Give me a moment.", "Let me think on that.")


def canned_line(archetype: str | None, key: str = "") -> str:
    """A line in the archetype's voice; the same `key` picks the same line."""
    lines = CANNED_LINES.get(archetype or "", DEFAULT_LINES)
    return lines[zlib.crc32(key.encode()) % len(lines)]
