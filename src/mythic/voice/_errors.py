"""The voice layer's error."""

from __future__ import annotations

from mythic._errors import MythicError


class VoiceError(MythicError):
    """Voice input the server refuses; `code` is the wire `Error` code."""

    def __init__(self, code: str, message: str, *, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.code = code
