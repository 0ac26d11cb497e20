"""`safety`: the content guardrails (`mythic.safety`). What is blocked is the world's policy
(`safety.yaml`) and each NPC's card; these switch the guard on and off for a server."""

from __future__ import annotations

from mythic.config._section import Section


class SafetySettings(Section):
    """Guardrails on players' lines, replies and tool calls."""

    enabled: bool = True
    """Check every player's line, reply phrase and tool call against the world's policy; off,
    nothing is checked (an evaluation's baseline)."""
    classifier: bool = True
    """Use the packaged classifier where a world's policy does; off, the rules alone (a
    server without the `safety` extra)."""
