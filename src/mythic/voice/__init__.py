"""Voice for a cast's sessions: the player's speech in, the NPC's speech out.

A session that opened with `SessionStart.voice` may stream microphone audio to an NPC
(`AudioChunk`, JSON or binary frames). Per session and NPC a channel runs the audio through
a `Listener` (Silero VAD endpointing, Whisper partials and final in worker processes): each
partial goes out as `ASRPartial`, each final as `ASRFinal` and then as the player's line to
the NPC, exactly as a typed `PlayerUtterance`. The NPC's reply comes back phrase by phrase
(the cast's `ReplySink`); each phrase is synthesised in the NPC's voice (Piper or espeak-ng,
worker processes) and sent as `TTSChunk`s of 40-80 ms with visemes, paced a little ahead of
playback so a cut-off stops within a chunk.

Barge-in: speech that starts while the NPC is audible pauses its audio (the NPC falls
silent, as a person would); real words in a partial or the final cut the NPC off (`Cutoff`
to the client, the engine request cancelled, the turn marked interrupted for the next one).
A backchannel ("yeah", "mm-hm") or a false start (no words at all) resumes the NPC.

Every voice turn carries a latency trace: the utterance's end (when its last speech sample
arrived) -> ASR final -> first model token (`VoiceHub.first_token`, called by whoever sends
the reply) -> first TTS chunk -> first audio sent, logged and counted in `VoiceStats`.

Runs on the caller's event loop; the models run in worker processes (the `speech` extra).
Importing this package loads no model.
"""

from mythic.voice._audio import Decimator
from mythic.voice._errors import VoiceError
from mythic.voice._hub import BACKCHANNELS, VoiceHub, is_backchannel
from mythic.voice._trace import HOPS, VoiceStats, VoiceTrace

__all__ = [
    "BACKCHANNELS",
    "HOPS",
    "Decimator",
    "VoiceError",
    "VoiceHub",
    "VoiceStats",
    "VoiceTrace",
    "is_backchannel",
]
