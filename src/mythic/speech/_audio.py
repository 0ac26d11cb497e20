"""PCM16 checks, chunking and WAV files: plain bytes, no NumPy."""

from __future__ import annotations

import itertools
import wave
from pathlib import Path

from mythic.speech._errors import AudioFormatError

ASR_SAMPLE_RATE = 16000
"""Sample rate of everything heard: the VAD and Whisper take 16 kHz mono PCM16."""

BYTES_PER_SAMPLE = 2


def check_pcm16(pcm: bytes, sample_rate: int, *, expected_rate: int | None = None) -> None:
    """Raise `AudioFormatError` unless `pcm` is whole 16-bit samples at an accepted rate."""
    if not isinstance(pcm, bytes | bytearray | memoryview):
        raise AudioFormatError(f"PCM must be bytes, not {type(pcm).__name__}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int):
        raise AudioFormatError(f"sample_rate must be an int, not {type(sample_rate).__name__}")
    if expected_rate is not None and sample_rate != expected_rate:
        raise AudioFormatError(
            f"audio at {sample_rate} Hz; speech input must be {expected_rate} Hz mono PCM16",
            fix=f"resample to {expected_rate} Hz on the client",
        )
    if not 8000 <= sample_rate <= 48000:
        raise AudioFormatError(f"sample_rate {sample_rate} is outside 8000-48000 Hz")
    if len(pcm) % BYTES_PER_SAMPLE:
        raise AudioFormatError(
            f"PCM16 audio has an odd number of bytes ({len(pcm)}): a sample is cut in half"
        )


def duration_s(pcm: bytes, sample_rate: int) -> float:
    """Seconds of mono PCM16 audio."""
    return len(pcm) / (BYTES_PER_SAMPLE * sample_rate)


def chunk_bounds(samples: int, sample_rate: int, chunk_ms: int) -> list[tuple[int, int]]:
    """Cut `samples` into near-equal chunks of about `chunk_ms`, each within 40-80 ms.

    Every chunk is between 40 and 80 ms long when the whole is at least 40 ms; a shorter
    whole is one chunk. Returns (start, end) sample indices.
    """
    if samples <= 0:
        return []
    target = max(1, round(sample_rate * chunk_ms / 1000))
    longest = sample_rate * 80 // 1000
    count = max(1, round(samples / target))
    while samples / count > longest:
        count += 1
    while count > 1 and samples / count < sample_rate * 40 / 1000:
        count -= 1
    edges = [samples * i // count for i in range(count + 1)]
    return list(itertools.pairwise(edges))


def write_wav(path: Path, pcm: bytes, sample_rate: int) -> None:
    """Write mono PCM16 audio as a WAV file."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(BYTES_PER_SAMPLE)
        out.setframerate(sample_rate)
        out.writeframes(pcm)


def read_wav(path: Path) -> tuple[bytes, int]:
    """Read a mono PCM16 WAV file: (pcm, sample_rate)."""
    try:
        with wave.open(str(path), "rb") as src:
            if src.getnchannels() != 1 or src.getsampwidth() != BYTES_PER_SAMPLE:
                raise AudioFormatError(f"{path}: not mono 16-bit PCM")
            return src.readframes(src.getnframes()), src.getframerate()
    except (wave.Error, EOFError) as exc:
        raise AudioFormatError(f"{path}: not a WAV file ({exc})") from exc
