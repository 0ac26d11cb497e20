"""Errors of the speech capability."""

from __future__ import annotations

from mythic._errors import MythicError


class SpeechError(MythicError):
    """Base class of every error `mythic.speech` raises on purpose."""


class AudioFormatError(SpeechError):
    """The audio is malformed: wrong sample rate, an odd number of PCM16 bytes, too long."""


class SpeechInputError(SpeechError):
    """The text or a parameter of a request is unusable (text too long, a bad option)."""


class UnknownVoiceError(SpeechError):
    """No voice profile has this `voice_id`."""

    def __init__(self, voice_id: str, known: list[str]) -> None:
        super().__init__(
            f"unknown voice {voice_id!r}; known voices: {', '.join(sorted(known))}",
            fix="use one of the known voice ids, or register a VoiceProfile with Voices.add",
        )
        self.voice_id = voice_id


class VoiceUnavailableError(SpeechError):
    """The voice's engine or an effect's program is not installed on this machine."""


class SpeechModelError(SpeechError):
    """A speech model (Whisper, a Piper voice, the VAD) is missing or failed to load."""


class SpeechWorkerError(SpeechError):
    """A worker process died or broke while serving a request; the pool has restarted it."""

    retryable = True


class SpeechTimeoutError(SpeechWorkerError):
    """A worker did not answer in time; it was killed and restarted."""


class SpeechBusyError(SpeechError):
    """No worker was free (a partial transcript is skipped rather than queued)."""

    retryable = True


class SpeechPoolClosedError(SpeechError):
    """The worker pool was closed or never started; it accepts no requests."""
