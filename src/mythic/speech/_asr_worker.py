"""The ASR worker process: faster-whisper (CTranslate2) on the CPU.

Imported by name inside worker processes only (`WorkerPool`), never by the server process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from mythic._extras import require
from mythic.speech._errors import SpeechModelError


def load(config: dict[str, Any]) -> Recognizer:
    """Load the Whisper model named by the pool's config."""
    return Recognizer(config["model_dir"], threads=config["threads"], language=config["language"])


class Recognizer:
    """One Whisper model (int8 on the CPU), transcribing one utterance at a time."""

    def __init__(self, model_dir: str, *, threads: int, language: str) -> None:
        started = time.perf_counter()
        whisper = require("faster_whisper", package="faster-whisper", extra="speech")
        self._np: Any = require("numpy", package="numpy", extra="speech")
        self.language = language
        try:
            self._model = whisper.WhisperModel(
                model_dir,
                device="cpu",
                compute_type="int8",
                cpu_threads=threads,
                num_workers=1,
                local_files_only=True,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise SpeechModelError(f"cannot load the Whisper model in {model_dir}: {exc}") from exc
        # The first call allocates the buffers; pay for it now, not on the player's first line.
        self._transcribe(self._np.zeros(8000, dtype=self._np.float32), beam_size=1)
        self.info: dict[str, Any] = {
            "pid": os.getpid(),
            "model": model_dir,
            "load_s": time.perf_counter() - started,
        }

    def run(self, payload: dict[str, Any], cancelled: Callable[[], bool]) -> Iterator[Any]:
        """Transcribe one utterance: yields one dict (text, lang, duration_s, took_s)."""
        started = time.perf_counter()
        np = self._np
        audio = np.frombuffer(payload["pcm"], dtype="<i2").astype(np.float32) / 32768.0
        text, lang, duration = self._transcribe(audio, beam_size=payload["beam_size"])
        yield {
            "text": text,
            "lang": lang,
            "duration_s": duration,
            "took_s": time.perf_counter() - started,
        }

    def _transcribe(self, audio: Any, *, beam_size: int) -> tuple[str, str, float]:
        segments, info = self._model.transcribe(
            audio,
            language=self.language,
            beam_size=beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        text = "".join(segment.text for segment in segments).strip()
        return text, str(info.language), float(info.duration)
