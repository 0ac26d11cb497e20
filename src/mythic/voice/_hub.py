"""The voice hub: per (session, NPC) a channel that hears the player, per reply a speech that
speaks the NPC, and barge-in between them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mythic._errors import MythicError
from mythic.contracts import (
    MAX_TEXT_CHARS,
    ASRFinal,
    ASRPartial,
    AudioChunk,
    Cutoff,
    PlayerUtterance,
    ServerMessage,
    TTSChunk,
    Viseme,
    VoiceFormat,
)
from mythic.observability import current, hop_of
from mythic.voice._audio import Decimator
from mythic.voice._errors import VoiceError
from mythic.voice._trace import VoiceStats, VoiceTrace

if TYPE_CHECKING:
    from mythic.config import MythicSettings
    from mythic.dialogue import Cast, Hold
    from mythic.knowledge import TurnTaking
    from mythic.speech import ASRPool, Listener, SpeechChunk, Transcript, TTSPool, Voices

log = logging.getLogger(__name__)

Send = Callable[[str, ServerMessage], None]

_LEAD_S = 0.25
"""How far ahead of the client's playback audio is sent: a cut-off loses at most this much
already sent (the client drops it on `Cutoff`), and a network hiccup this long is bridged."""
_MAX_VISEMES = 64
_WORD = re.compile(r"[a-z']+(?:-[a-z']+)*")

BACKCHANNELS = frozenset(
    {
        "yeah", "yes", "yep", "yup", "ok", "okay", "right", "sure", "mm", "mmm", "hmm", "mhm",
        "mm-hm", "mm-hmm", "uh-huh", "uh", "huh", "ah", "oh", "aha", "i", "see", "go", "on",
        "alright", "true", "indeed", "um", "er",
    }
)  # fmt: skip
"""Words that, alone (at most three of them), are a backchannel, not a bid for the turn."""
_HUM = re.compile(r"^(?:[mh]+|[mh]+-[mh]+|u+h+(?:-h+u+h+)?|[ao]+h+|e+r+m*|u+m+)$")
"""A listener's sound as Whisper writes it: "mm", "hmm", "mhm", "MMMHM", "mm-hm", "uh-huh",
"ah", "oh", "erm", "um"."""


def is_backchannel(text: str, extra: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether `text` is only a listener's acknowledgement ("yeah", "mm-hm", "I see");
    `extra`: an NPC's own (`TurnTaking.backchannels`)."""
    words = _WORD.findall(text.lower())
    return 0 < len(words) <= 3 and all(
        w in BACKCHANNELS or w in extra or _HUM.match(w) for w in words
    )


def same_words(a: str, b: str) -> bool:
    """Whether two transcripts say the same words (case, punctuation and spacing aside)."""
    return _WORD.findall(a.lower()) == _WORD.findall(b.lower())


# -- speaking ---------------------------------------------------------------------------------


class _Speech:
    """One NPC reply being spoken to one session: phrases in, paced TTS chunks out."""

    def __init__(
        self,
        hub: VoiceHub,
        session_id: str,
        npc_id: str,
        turn_id: str,
        voice_id: str,
        trace: VoiceTrace | None,
    ) -> None:
        self.hub = hub
        self.session_id, self.npc_id, self.turn_id = session_id, npc_id, turn_id
        self.voice_id = voice_id
        self.trace = trace
        self.phrases: asyncio.Queue[str | None] = asyncio.Queue()
        self.may_send = asyncio.Event()
        self.may_send.set()
        self.client_done_at = 0.0
        """When the client will have played everything sent so far (perf_counter)."""
        self.finished = False
        self.seq = 0
        self.texts: list[str] = []
        """The phrases given to speech, in order."""
        self.marks: list[tuple[float, int, int]] = []
        """Per chunk sent: (when the client will have played it, its phrase's index, that
        phrase's words spoken whole by then)."""
        self.hop = hop_of("tts", session_id, npc_id, turn_id, voice=voice_id)
        """The reply's `tts` hop of its turn's trace: from its first phrase to its last audio."""
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"speech {npc_id}/{turn_id}"
        )

    @property
    def audible(self) -> bool:
        """The NPC is (or is about to be) heard: audio still to play or to synthesise."""
        return not self.finished or self.client_done_at > time.perf_counter()

    def heard(self, at: float) -> str:
        """The reply's words the player had heard whole by `at` (`perf_counter`): those the
        client played before then (the TTS alignments date each word's end)."""
        at = min(at, self.client_done_at)
        phrase, words = -1, 0
        for end, index, done in self.marks:
            if end > at:
                break
            phrase, words = index, done
        if phrase < 0:
            return ""
        said = [*self.texts[:phrase], " ".join(self.texts[phrase].split()[:words])]
        return " ".join(p.strip() for p in said if p.strip())

    def duck(self) -> None:
        """Stop sending (the player may be cutting in); the client's buffer runs dry."""
        self.may_send.clear()

    def resume(self) -> None:
        self.may_send.set()

    async def cancel(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def _run(self) -> None:
        held: tuple[SpeechChunk, int] | None = None
        try:
            while (text := await self.phrases.get()) is not None:
                index = len(self.texts)
                self.texts.append(text)
                try:
                    async with self.hub.tts.synthesize(text, self.voice_id) as stream:
                        async for chunk in stream:
                            if self.trace is not None and self.trace.first_tts is None:
                                self.trace.first_tts = time.perf_counter()
                            if held is not None:
                                await self._send(*held, final=False)
                            held = (chunk, index)
                except MythicError as exc:  # one phrase lost; the reply goes on
                    self.hub.stats.errors["tts_failed"] += 1
                    log.warning("speech for %s/%s failed: %s", self.npc_id, self.turn_id, exc)
            if held is not None:
                await self._send(*held, final=True)
        except asyncio.CancelledError:
            if self.hop is not None:
                self.hop.set(cut_off=True)
            raise
        finally:
            self.finished = True
            self.hub.speech_done(self)
            if self.hop is not None:
                self.hop.set(phrases=len(self.texts), chunks=self.seq)
                self.hop.end()

    async def _send(self, chunk: SpeechChunk, index: int, *, final: bool) -> None:
        while True:
            await self.may_send.wait()
            ahead = self.client_done_at - time.perf_counter()
            if ahead <= _LEAD_S:
                break
            await asyncio.sleep(ahead - _LEAD_S)
        visemes = tuple(Viseme(t=round(t, 4), p=p) for t, p in chunk.visemes[:_MAX_VISEMES])
        self.hub.send(
            self.session_id,
            TTSChunk(
                npc_id=self.npc_id,
                session_id=self.session_id,
                turn_id=self.turn_id,
                seq=self.seq,
                pcm=chunk.pcm,
                sample_rate=chunk.sample_rate,
                visemes=visemes,
                final=final,
            ),
        )
        now = time.perf_counter()
        self.client_done_at = max(self.client_done_at, now) + chunk.duration_s
        self.marks.append((self.client_done_at, index, chunk.words))
        self.seq += 1
        self.hub.stats.chunks_sent += 1
        trace = self.trace
        if self.seq == 1 and self.hop is not None:
            self.hop.event("first_audio")
        if trace is not None and trace.first_audio is None:
            trace.first_audio = now
            self.hub.traced(self.npc_id, self.turn_id, trace)


# -- hearing ----------------------------------------------------------------------------------


class _Channel:
    """One session's player talking to one NPC: the listener and its events."""

    def __init__(
        self, hub: VoiceHub, session_id: str, npc_id: str, fmt: VoiceFormat, player: str | None
    ) -> None:
        from mythic.speech import Listener

        self.hub = hub
        self.session_id, self.npc_id, self.player_id = session_id, npc_id, player
        self.fmt = fmt
        self.decimate = Decimator(fmt.input_rate)
        self.listener: Listener = Listener(hub.asr, push_to_talk=fmt.push_to_talk)
        self._pressed = False
        self._arrivals: deque[tuple[float, float]] = deque(maxlen=4096)
        """(seconds of 16 kHz audio fed, perf_counter when it arrived), to date the end of
        an utterance on the server's clock."""
        self._fed_s = 0.0
        self._client_turn: str | None = None
        self._used: deque[str] = deque(maxlen=256)
        self._turns: dict[int, str] = {}
        """The turn each utterance opens, by its number (counted from 1, as the listener's)."""
        self._utterances = 0
        self.over: _Speech | None = None
        """The NPC's speech the open utterance began over (a backchannel or a barge-in)."""
        self.ducked = False
        """`over` is paused: the player has spoken over it for `barge_in_min_ms`."""
        self.cut = False
        self._over_of: dict[int, _Speech] = {}
        """By utterance number: the speech each began over, until its final (a final can come
        after the next utterance has begun)."""
        self._cuts: set[int] = set()
        """Utterances that have cut the NPC off already."""
        self._stall: asyncio.TimerHandle | None = None
        self._audio_at = 0.0
        """When the last audio chunk arrived (the loop's clock)."""
        self._preempt: tuple[int, str, Hold] | None = None
        """A reply started from a pause's transcript: (utterance, turn_id, its gate)."""
        self._early_text = ""
        self.task = asyncio.get_running_loop().create_task(
            self._events(), name=f"listen {session_id}/{npc_id}"
        )

    def feed(self, chunk: AudioChunk) -> None:
        if chunk.sample_rate != self.fmt.input_rate:
            raise VoiceError(
                "bad_audio",
                f"AudioChunk.sample_rate is {chunk.sample_rate}; this session said "
                f"{self.fmt.input_rate} at SessionStart",
            )
        pcm = self.decimate(chunk.pcm)
        if chunk.turn_id is not None:
            self._client_turn = chunk.turn_id
        if self.fmt.push_to_talk and not self._pressed:
            self.listener.press()
            self._pressed = True
        self.listener.feed(pcm)
        self._maybe_duck()
        loop = asyncio.get_running_loop()
        self._audio_at = loop.time()
        if self._stall is None:  # one timer per stall period, not one per chunk
            self._stall = loop.call_later(self.hub.settings.stall_ms / 1000, self._stalled)
        self._fed_s += len(pcm) / 32000
        self._arrivals.append((self._fed_s, time.perf_counter()))
        if chunk.end and self.fmt.push_to_talk:
            self._pressed = False
            self.listener.release()

    def arrived_at(self, audio_s: float) -> float:
        """When the audio at `audio_s` (seconds into the stream) reached the server."""
        for fed, at in self._arrivals:
            if fed >= audio_s:
                return at
        return time.perf_counter()

    def line(self, turn_id: str, text: str) -> PlayerUtterance:
        """What the player said, as their line to the NPC."""
        return PlayerUtterance(
            npc_id=self.npc_id,
            session_id=self.session_id,
            turn_id=turn_id,
            text=text,
            player_id=self.player_id,
        )

    def _stalled(self) -> None:
        """No audio for `speech.stall_ms` while the player is in a pause: the client stopped
        streaming, so the utterance ends now rather than wait for silence never sent."""
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._audio_at
        stall_s = self.hub.settings.stall_ms / 1000
        if quiet < stall_s:  # audio came since: wait out the rest of a period from it
            self._stall = loop.call_later(stall_s - quiet, self._stalled)
            return
        self._stall = None
        endpointer = self.listener.endpointer
        if endpointer.paused and not self.fmt.push_to_talk:
            with contextlib.suppress(RuntimeError):  # the listener has ended
                self.listener.end_utterance()

    def _maybe_duck(self) -> None:
        """The player has spoken over the NPC for `barge_in_min_ms`: it pauses (the client's
        buffer runs dry); shorter sounds (a backchannel, a cough) never pause it."""
        speech = self.over
        if speech is None or self.ducked or self.cut:
            return
        if self.listener.endpointer.speech_s * 1000 >= self.hub.settings.barge_in_min_ms:
            speech.duck()
            self.ducked = True

    async def close(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
        self._drop_preempt()
        await self.listener.aclose()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def _events(self) -> None:
        from mythic.speech import (
            EarlyTranscript,
            FinalTranscript,
            PartialTranscript,
            SpeechEnded,
            SpeechPaused,
            SpeechResumed,
            SpeechStarted,
            TurnPredicted,
        )

        ended_at: float | None = None
        spoke_s = 0.0
        async for event in self.listener:
            log.debug("voice %s/%s: %r", self.session_id, self.npc_id, event)
            try:
                match event:
                    case SpeechStarted():
                        self._started()
                    case PartialTranscript(utterance=number, transcript=transcript):
                        self._partial(self._turns.get(number, ""), transcript)
                    case SpeechPaused():
                        if self.over is None:  # the player's own line, not over the NPC
                            with contextlib.suppress(MythicError):
                                self.hub.cast.paused(self.session_id, self.npc_id)
                        else:  # over the NPC: a backchannel or a barge-in ends on silence
                            self.listener.end_on_silence()
                    case SpeechEnded(at_s=at_s, started_s=started_s):
                        spoke_s = at_s - started_s
                        ended_at = self.arrived_at(at_s)
                    case TurnPredicted(complete=complete):
                        verdict = "complete" if complete else "incomplete"
                        self.hub.stats.turn_verdicts[verdict] += 1
                    case EarlyTranscript(utterance=number, transcript=transcript):
                        self._preempt_reply(number, transcript.text)
                    case SpeechResumed(utterance=number):
                        self._drop_preempt(number)
                    case FinalTranscript():
                        end = ended_at if ended_at is not None else time.perf_counter()
                        self._final(event, end, spoke_s)
                        ended_at = None
            except Exception:  # one bad event must not stop the player's microphone
                log.exception("voice event %r failed", type(event).__name__)

    def _started(self) -> None:
        self._utterances += 1
        turn_id = self._client_turn
        if turn_id is None or turn_id in self._used:
            turn_id = _new_turn_id()
        self._used.append(turn_id)
        self._turns[self._utterances] = turn_id
        speech = self.hub.speaking(self.session_id, self.npc_id)
        if speech is not None and speech.audible:
            # Over the NPC's speech: a backchannel, or a barge-in (its words, or its length,
            # will tell); the NPC goes on for now.
            self.over, self.ducked, self.cut = speech, False, False
            self._over_of[self._utterances] = speech
            self._maybe_duck()
        else:
            self.over, self.ducked, self.cut = None, False, False
            # The player begins a line: a new session's NPC evaluates its persona and memory
            # while the first words are heard (the partials then add the lore).
            with contextlib.suppress(MythicError):
                self.hub.cast.prepare(self.session_id, self.npc_id, "", player_id=self.player_id)

    def _partial(self, turn_id: str, transcript: Transcript) -> None:
        text = transcript.text
        if not text or not turn_id:
            return
        self.hub.send(
            self.session_id,
            ASRPartial(
                npc_id=self.npc_id,
                session_id=self.session_id,
                turn_id=turn_id,
                text=text[:MAX_TEXT_CHARS],
            ),
        )
        spoke_s = self.listener.endpointer.speech_s
        if (
            self.over is not None
            and not self.cut
            and spoke_s * 1000 >= self.hub.settings.barge_in_min_ms
            and self._bid(transcript, spoke_s)
        ):
            self._cut_off()
        if (self.over is None or self.cut) and not self.listener.endpointer.paused:
            # The NPC prepares its answer's prompt while the player is still speaking (a
            # partial come after a pause is stale: the prefill stopped there).
            with contextlib.suppress(MythicError):
                self.hub.cast.prepare(self.session_id, self.npc_id, text, player_id=self.player_id)

    def _backchannel(self, text: str) -> bool:
        """`text` is a backchannel that leaves this NPC speaking (its `turn_taking`)."""
        manner = self.hub.turn_taking(self.npc_id)
        return manner.ignore_backchannels and is_backchannel(text, set(manner.backchannels))

    def _bid(self, transcript: Transcript, spoke_s: float) -> bool:
        """Whether words heard over the NPC's speech are a bid for the turn: not a
        backchannel, and either recognised with confidence or long. Whisper turns a hum
        ("mm-hm") into confident-looking words ("and then make some") at a low log-probability;
        a short, unsure transcript is taken for a backchannel."""
        if self._backchannel(transcript.text):
            return False
        s = self.hub.settings
        return transcript.logprob >= s.barge_in_min_logprob or spoke_s * 1000 >= s.barge_in_sure_ms

    def _cut_off(self, speech: _Speech | None = None) -> None:
        speech, self.cut = speech or self.over, True
        self._cuts.add(self._utterances)
        if speech is not None:
            self.hub.stats.barge_ins += 1
            self.hub.barge_in(speech)

    def _preempt_reply(self, number: int, text: str) -> None:
        """The player paused and their words so far are known, their turn not yet over: the
        NPC starts its reply now (`dialogue.preempt_spoken_lines`), held until the final."""
        from mythic.dialogue import Hold

        text = text.strip()[:MAX_TEXT_CHARS]
        turn_id = self._turns.get(number)
        if (
            not self.hub.preempt
            or not text
            or turn_id is None
            or self.over is not None
            or self._preempt is not None
        ):
            return
        with contextlib.suppress(MythicError):
            if self.hub.cast.actor(self.npc_id).busy_session == self.session_id:
                return  # its last reply is still being written: this line will barge in
            hold = Hold()
            self.hub.cast.deliver(
                self.session_id,
                self.line(turn_id, text),
                player_id=self.player_id,
                spoken=True,
                hold=hold,
            )
            self._preempt, self._early_text = (number, turn_id, hold), text
            self.hub.stats.preempted += 1

    def _drop_preempt(self, number: int | None = None) -> None:
        """The preemptive reply (of utterance `number`, or any) is not the answer: dropped."""
        preempt = self._preempt
        if preempt is None or (number is not None and preempt[0] != number):
            return
        self._preempt = None
        self.hub.stats.preempt_discarded += 1
        self.hub.cast.discard(self.session_id, self.npc_id, preempt[1], preempt[2])

    def _final(self, event: Any, ended_at: float, spoke_s: float) -> None:
        text = event.transcript.text.strip()
        number = event.utterance
        turn_id = self._turns.pop(number, None) or _new_turn_id()
        # This utterance's own state: the player may have begun the next one already.
        over, cut = self._over_of.pop(number, None), number in self._cuts
        self._cuts.discard(number)
        latest = number == self._utterances
        ducked = latest and self.ducked
        if latest:
            self.over, self.ducked = None, False

        def resume(speech: _Speech) -> None:
            if self.over is not speech:  # a newer utterance over it decides for itself
                speech.resume()

        if event.error is not None:
            self.hub.stats.errors["asr_failed"] += 1
        if not text:
            self._drop_preempt()
            self.hub.stats.no_words += 1
            if over is not None and not cut:
                if self.hub.turn_taking(self.npc_id).resume_after_noise:
                    self.hub.stats.false_interruptions += ducked
                    resume(over)
                else:
                    self._cut_off(over)
            return
        if over is not None and not cut and not self._bid(event.transcript, spoke_s):
            self.hub.stats.backchannels += 1
            resume(over)
            return
        if over is not None and not cut:
            self._cut_off(over)
        trace = VoiceTrace(utterance_end=ended_at, asr_final=time.perf_counter())
        text = text[:MAX_TEXT_CHARS]
        preempt = self._preempt
        if preempt is not None and (
            preempt[0] != event.utterance or not same_words(text, self._early_text)
        ):
            self._drop_preempt()
            preempt = None
        self.hub.send(
            self.session_id,
            ASRFinal(
                npc_id=self.npc_id,
                session_id=self.session_id,
                turn_id=turn_id,
                text=text,
                lang=event.transcript.lang or None,
            ),
        )
        self.hub.stats.utterances += 1
        if preempt is not None:
            # The reply begun at the pause answers these very words: it goes out now.
            self._preempt = None
            self.hub.stats.preempt_kept += 1
            self.hub.confirmed(self, turn_id, preempt[2], trace)
        else:
            self.hub.said(self, turn_id, text, trace)


def _new_turn_id() -> str:
    return f"v-{uuid.uuid4().hex[:12]}"


def _asr_hop(channel: _Channel, turn_id: str, trace: VoiceTrace) -> None:
    """The turn's `asr` hop: from the end of the player's utterance to its final transcript."""
    asr = hop_of("asr", channel.session_id, channel.npc_id, turn_id, start=trace.utterance_end)
    if asr is not None:
        asr.end(at=trace.asr_final)


# -- the hub ----------------------------------------------------------------------------------


class VoiceHub:
    """The server's voice layer: ASR and TTS worker pools shared by every session, a channel
    per (session, NPC) that hears the player, a speech per reply that speaks the NPC.

    Runs on the server's event loop; the models run in worker processes. Implements the
    cast's `ReplySink`.
    """

    def __init__(
        self, settings: MythicSettings, send: Send, cast: Cast, *, voices: Voices | None = None
    ) -> None:
        from mythic.speech import ASRPool, SpeechSettings, TTSPool, Voices

        self.settings = SpeechSettings.model_validate(
            settings.speech.model_dump(exclude={"enabled"})
        )
        self._send = send
        self.cast = cast
        self.voices = voices if voices is not None else Voices()
        self.asr: ASRPool = ASRPool(self.settings)
        self.tts: TTSPool = TTSPool(self.settings, voices=self.voices)
        self.stats = VoiceStats()
        self.preempt = settings.dialogue.preempt_spoken_lines
        self.ready = False
        self._formats: dict[str, tuple[VoiceFormat, str | None]] = {}
        self._channels: dict[tuple[str, str], _Channel] = {}
        self._speeches: dict[tuple[str, str], _Speech] = {}
        self._by_npc: dict[tuple[str, str], _Speech] = {}
        self._traces: dict[tuple[str, str], VoiceTrace] = {}

    async def start(self) -> None:
        """Start the worker pools (model loading: seconds)."""
        await asyncio.gather(self.asr.start(), self.tts.start())
        self.ready = True

    async def aclose(self) -> None:
        self.ready = False
        for channel in list(self._channels.values()):
            await channel.close()
        for speech in list(self._speeches.values()):
            await speech.cancel()
        self._channels.clear()
        await asyncio.gather(self.asr.close(), self.tts.close(), return_exceptions=True)

    def send(self, session_id: str, message: ServerMessage) -> None:
        self._send(session_id, message)

    # -- sessions ---------------------------------------------------------------------------

    def open_session(self, session_id: str, fmt: VoiceFormat, player_id: str | None) -> None:
        self._formats[session_id] = (fmt, player_id)

    def has_voice(self, session_id: str) -> bool:
        return session_id in self._formats

    async def session_gone(self, session_id: str, *, forget: bool) -> None:
        """Stop hearing and speaking for the session; `forget`: it will not resume."""
        for key in [k for k in self._channels if k[0] == session_id]:
            await self._channels.pop(key).close()
        for key in [k for k in self._speeches if k[0] == session_id]:
            await self._speeches[key].cancel()
        if forget:
            self._formats.pop(session_id, None)
            for key in [k for k in self._traces if k[0] == session_id]:
                del self._traces[key]

    def audio(self, session_id: str, chunk: AudioChunk) -> None:
        """Feed a chunk of the player's microphone to the NPC it is addressed to.

        Raises:
            VoiceError: the session did not open with voice (`voice_off`), voice is not ready
                (`voice_starting`), or the audio does not match the session's format
                (`bad_audio`).
            UnknownNPCError: no such NPC.
        """
        opened = self._formats.get(session_id)
        if opened is None:
            raise VoiceError(
                "voice_off",
                "this session did not open with voice",
                fix="send SessionStart with voice: {input_rate: 16000}",
            )
        if not self.ready:
            raise VoiceError("voice_starting", "the speech models are still loading; retry")
        self.cast.actor(chunk.npc_id)  # UnknownNPCError for an NPC the world does not have
        key = (session_id, chunk.npc_id)
        channel = self._channels.get(key)
        if channel is None:
            fmt, player_id = opened
            channel = self._channels[key] = _Channel(self, session_id, chunk.npc_id, fmt, player_id)
        try:
            channel.feed(chunk)
        except VoiceError:
            self.stats.errors["bad_audio"] += 1
            raise
        except MythicError as exc:  # the speech package's AudioFormatError and the like
            self.stats.errors["bad_audio"] += 1
            raise VoiceError("bad_audio", exc.message) from None

    def said(self, channel: _Channel, turn_id: str, text: str, trace: VoiceTrace) -> None:
        """The player said `text` (a final transcript): it becomes their line to the NPC."""
        from mythic.dialogue import MailboxFullError

        self._traces[(channel.session_id, turn_id)] = trace
        line = channel.line(turn_id, text)
        traces = current()
        if traces is not None:
            # The spoken turn's trace starts when the player stopped speaking.
            traces.begin(
                channel.session_id,
                channel.npc_id,
                turn_id,
                start=trace.utterance_end,
                source="voice",
            )
            _asr_hop(channel, turn_id, trace)
        try:
            self.cast.deliver(channel.session_id, line, player_id=channel.player_id, spoken=True)
        except MailboxFullError as exc:
            self.stats.errors["npc_busy"] += 1
            if traces is not None:
                traces.end(channel.session_id, channel.npc_id, turn_id, error="npc_busy")
            from mythic.contracts import Error

            self.send(
                channel.session_id,
                Error(code="npc_busy", message=exc.message[:500], turn_id=turn_id, retryable=True),
            )

    def confirmed(self, channel: _Channel, turn_id: str, hold: Hold, trace: VoiceTrace) -> None:
        """The preemptive reply behind `hold` answers the player's final line: release it."""
        self._traces[(channel.session_id, turn_id)] = trace
        _asr_hop(channel, turn_id, trace)  # under the reply's actor, begun at the pause
        hold.release()

    def turn_taking(self, npc_id: str) -> TurnTaking:
        """How `npc_id` takes the player's voice over its own (its card's `turn_taking`)."""
        from mythic.knowledge import TurnTaking

        try:
            manner: TurnTaking = self.cast.world.npcs[npc_id].turn_taking
        except (AttributeError, KeyError):
            return TurnTaking()
        return manner

    def client_cutoff(self, session_id: str, npc_id: str, turn_id: str) -> None:
        """The client cut the NPC off: stop its speech for that turn at once."""
        speech = self._speeches.get((session_id, turn_id))
        if speech is not None:
            speech.task.cancel()

    def speaking(self, session_id: str, npc_id: str) -> _Speech | None:
        return self._by_npc.get((session_id, npc_id))

    def barge_in(self, speech: _Speech) -> None:
        """Cut the NPC off: no more audio, the client stops playing, the turn stops."""
        speech.task.cancel()
        cutoff = Cutoff(
            npc_id=speech.npc_id,
            session_id=speech.session_id,
            turn_id=speech.turn_id,
            reason="barge_in",
        )
        self.send(speech.session_id, cutoff)
        heard = speech.heard(time.perf_counter())
        with contextlib.suppress(MythicError):
            self.cast.deliver(speech.session_id, cutoff, heard=heard)

    def speech_done(self, speech: _Speech) -> None:
        key = (speech.session_id, speech.turn_id)
        if self._speeches.get(key) is speech:
            del self._speeches[key]
        npc_key = (speech.session_id, speech.npc_id)
        if self._by_npc.get(npc_key) is speech and not speech.audible:
            del self._by_npc[npc_key]
        self._traces.pop(key, None)

    def traced(self, npc_id: str, turn_id: str, trace: VoiceTrace) -> None:
        hops = trace.hops()
        self.stats.traces.append(hops)
        log.info(
            "voice turn %s/%s: %s",
            npc_id,
            turn_id,
            " ".join(f"{hop} {ms * 1000:.0f} ms" for hop, ms in hops.items()),
        )

    # -- the gateway's ReplyObserver and the cast's ReplySink -------------------------------

    def first_token(self, session_id: str, npc_id: str, turn_id: str) -> None:
        """The reply to `turn_id` sent its first token: the trace's `first_token` hop."""
        trace = self._traces.get((session_id, turn_id))
        if trace is not None and trace.first_token is None:
            trace.first_token = time.perf_counter()

    def phrase(self, session_id: str, npc_id: str, turn_id: str, text: str) -> None:
        if session_id not in self._formats or not self.ready:
            return
        key = (session_id, turn_id)
        speech = self._speeches.get(key)
        if speech is None:
            speech = _Speech(
                self,
                session_id,
                npc_id,
                turn_id,
                self._voice_of(npc_id),
                self._traces.get(key),
            )
            self._speeches[key] = speech
            self._by_npc[(session_id, npc_id)] = speech
        speech.phrases.put_nowait(text)

    def reply_done(self, session_id: str, npc_id: str, turn_id: str, reason: str) -> None:
        speech = self._speeches.get((session_id, turn_id))
        if speech is None:
            self._traces.pop((session_id, turn_id), None)
            return
        if reason == "cutoff":
            speech.task.cancel()
        else:
            speech.phrases.put_nowait(None)

    def _voice_of(self, npc_id: str) -> str:
        try:
            persona = self.cast.world.npcs[npc_id]
        except (AttributeError, KeyError):
            return "human"
        for voice_id in (persona.voice_id, persona.archetype):
            if voice_id and voice_id in self.voices:
                return voice_id
        return "human"
