"""Settings of the speech capability: they live in `mythic.config` (the `speech` section of
`MythicSettings`), so one class serves the server's configuration and the speech pools."""

from __future__ import annotations

from mythic.config import SpeechSettings

__all__ = ["SpeechSettings"]
