"""Speech: hearing players and giving NPCs voices.

Speech in: `Listener` runs Silero VAD on a 16 kHz microphone stream (`Endpointer`: start after
`min_speech_ms` of speech, end after `trailing_silence_ms` of silence, or push-to-talk), asks
an `ASRPool` of Whisper worker processes for partial transcripts while the player speaks and
a final transcript at the endpoint (started early, at a pause of `early_final_ms`, where a
turn model, Smart Turn v3.2, also says whether the player has finished). Speech
out: `TTSPool` speaks a phrase clause by clause in a `VoiceProfile` (Piper or espeak-ng, rate,
pitch, a sox effect chain) and streams 40-80 ms PCM chunks with a viseme track (`VISEMES`, the
Oculus/Meta set) for lip-sync.

Models and GPL-licensed engines (Piper, espeak-ng) run only in worker processes; importing
this package loads neither NumPy nor any model. Install with `pip install 'mythic[speech]'`
plus the `espeak-ng` and `sox` programs (`make setup` does both).

    from mythic.speech import ASRPool, FinalTranscript, Listener, SpeechSettings, TTSPool

    settings = SpeechSettings()
    async with ASRPool(settings) as asr, TTSPool(settings) as tts:
        async with Listener(asr) as listener:
            listener.feed(pcm_16khz)  # as audio arrives (sync, cheap)
            listener.end()            # no more audio: the events end after the last final
            async for event in listener:  # SpeechStarted, PartialTranscript*, SpeechPaused*,
                if isinstance(event, FinalTranscript):  # SpeechEnded, FinalTranscript
                    print(event.transcript.text)
        async with tts.synthesize("Where is the old mill?", "vampire") as speech:
            async for chunk in speech:  # SpeechChunk: pcm, sample_rate, visemes, final...
                play(chunk.pcm, chunk.visemes)  # leaving the block early cancels

    await write_preview("lich", "Who disturbs my rest?", "lich.wav")  # a voice to listen to
"""

from mythic.speech._asr import (
    ASRPool,
    EarlyTranscript,
    FinalTranscript,
    HeardEvent,
    Listener,
    PartialTranscript,
    SpeechResumed,
    Transcript,
    TurnPredicted,
    whisper_model_dir,
)
from mythic.speech._audio import ASR_SAMPLE_RATE, read_wav, write_wav
from mythic.speech._errors import (
    AudioFormatError,
    SpeechBusyError,
    SpeechError,
    SpeechInputError,
    SpeechModelError,
    SpeechPoolClosedError,
    SpeechTimeoutError,
    SpeechWorkerError,
    UnknownVoiceError,
    VoiceUnavailableError,
)
from mythic.speech._settings import SpeechSettings
from mythic.speech._text import split_clauses
from mythic.speech._tts import SpeechChunk, SpeechStream, TTSPool, piper_voice_files, write_preview
from mythic.speech._turn import TurnModel, smart_turn_path
from mythic.speech._vad import (
    FRAME_SAMPLES,
    Endpointer,
    EndpointEvent,
    SileroVAD,
    SpeechDetector,
    SpeechEnded,
    SpeechPaused,
    SpeechStarted,
    silero_vad_path,
)
from mythic.speech._visemes import PHONEME_VISEMES, VISEMES, Viseme, viseme_for, viseme_track
from mythic.speech._voices import BUILTIN_VOICES, SOX_EFFECTS, VoiceProfile, Voices, voice_profile

__all__ = [
    "ASR_SAMPLE_RATE",
    "BUILTIN_VOICES",
    "FRAME_SAMPLES",
    "PHONEME_VISEMES",
    "SOX_EFFECTS",
    "VISEMES",
    "ASRPool",
    "AudioFormatError",
    "EarlyTranscript",
    "EndpointEvent",
    "Endpointer",
    "FinalTranscript",
    "HeardEvent",
    "Listener",
    "PartialTranscript",
    "SileroVAD",
    "SpeechBusyError",
    "SpeechChunk",
    "SpeechDetector",
    "SpeechEnded",
    "SpeechError",
    "SpeechInputError",
    "SpeechModelError",
    "SpeechPaused",
    "SpeechPoolClosedError",
    "SpeechResumed",
    "SpeechSettings",
    "SpeechStarted",
    "SpeechStream",
    "SpeechTimeoutError",
    "SpeechWorkerError",
    "TTSPool",
    "Transcript",
    "TurnModel",
    "TurnPredicted",
    "UnknownVoiceError",
    "Viseme",
    "VoiceProfile",
    "VoiceUnavailableError",
    "Voices",
    "piper_voice_files",
    "read_wav",
    "silero_vad_path",
    "smart_turn_path",
    "split_clauses",
    "viseme_for",
    "viseme_track",
    "voice_profile",
    "whisper_model_dir",
    "write_preview",
    "write_wav",
]
