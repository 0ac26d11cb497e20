"""What the voice layer measures: each voice turn's latency trace and the layer's counters."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

HOPS = ("asr_final", "first_token", "first_tts", "first_audio")
"""The hops of a voice turn's trace, each in seconds since the utterance ended."""


@dataclass(slots=True)
class VoiceTrace:
    """When each step of a voice turn happened (`time.perf_counter()`)."""

    utterance_end: float
    asr_final: float | None = None
    first_token: float | None = None
    first_tts: float | None = None
    first_audio: float | None = None

    def hops(self) -> dict[str, float]:
        """Seconds from the utterance's end to each step reached so far."""
        marks = {h: getattr(self, h) for h in HOPS}
        return {h: round(t - self.utterance_end, 4) for h, t in marks.items() if t is not None}


@dataclass(slots=True)
class VoiceStats:
    """What the voice layer did since the server started."""

    utterances: int = 0
    """Finals with words that became a player line."""
    no_words: int = 0
    """Utterances with no words recognised (noise, a cough): ignored."""
    backchannels: int = 0
    """Backchannels heard while the NPC spoke: it went on."""
    barge_ins: int = 0
    """NPC speech cut off by the player's."""
    false_interruptions: int = 0
    """NPC speech paused by sound that turned out not to be words: resumed."""
    chunks_sent: int = 0
    """TTS chunks sent."""
    turn_verdicts: Counter[str] = field(default_factory=Counter)
    """The turn model's verdicts at the players' pauses: `complete`, `incomplete`."""
    preempted: int = 0
    """Replies started from a pause's transcript before the player's turn had ended."""
    preempt_kept: int = 0
    """Preemptive replies the final transcript confirmed (sent on at once)."""
    preempt_discarded: int = 0
    """Preemptive replies dropped: the player went on speaking, or the final differed."""
    errors: Counter[str] = field(default_factory=Counter)
    """Voice errors by code (bad audio, ASR or TTS failures)."""
    traces: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=512))
    """The hops of recent voice turns that reached their first audio."""
