"""`mythic voice ...` and `mythic chat --voice`: hear the voices, talk to an NPC out loud."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from mythic._errors import MythicError
from mythic.cli._console import guard, out

INPUT_RATE = 16000


def load_speech(path: Path) -> bytes:
    """A WAV file as 16 kHz mono PCM16 (resampled with sox when it is not).

    Raises:
        MythicError: not a readable WAV, or sox is needed and missing.
    """
    from mythic.speech import read_wav

    try:
        pcm, rate = read_wav(path)
    except (OSError, EOFError, MythicError) as exc:
        raise MythicError(f"cannot read {path} as a mono 16-bit WAV: {exc}") from None
    if rate == INPUT_RATE:
        return pcm
    sox = shutil.which("sox")
    if sox is None:
        raise MythicError(f"{path} is {rate} Hz; converting to 16000 Hz needs the sox program")
    converted = subprocess.run(
        [sox, "-q", str(path), "-r", str(INPUT_RATE), "-c", "1", "-b", "16", "-t", "raw", "-"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if converted.returncode != 0:
        raise MythicError(f"sox could not convert {path}: {converted.stderr.decode()[-300:]}")
    return converted.stdout


async def talk_once(
    url: str, npc: str, pcm: bytes, out: Path | None, say: Any
) -> tuple[Any, dict[str, float]]:
    """Stream `pcm` to `npc` at real-time pace over a voice session; returns the turn and its
    latencies (seconds from the end of speech, on this client's clock)."""
    from mythic.client import MythicClient
    from mythic.contracts import VoiceFormat
    from mythic.speech import write_wav

    async with MythicClient(url, voice=VoiceFormat(binary=True), timeout_s=60) as client:
        turn = await client.talk(npc, pcm)
        async with asyncio.timeout(120):
            await turn.heard.wait()
        if turn.transcript is None:
            errors = "; ".join(f"{e.code}: {e.message}" for e in turn.errors) or "nothing heard"
            raise MythicError(f"the server did not hear a line: {errors}")
        say(f"you (heard)> {turn.transcript}")
        await turn.wait(180)
    end = turn.speech_end_at
    marks = {
        "heard": turn.heard_at,
        "first_token": turn.first_delta_at,
        "first_audio": turn.first_audio_at,
    }
    latency = {k: v - end for k, v in marks.items() if v is not None and end is not None}
    if out is not None and turn.chunks:
        write_wav(out, turn.pcm, turn.sample_rate or 22050)
    return turn, latency


# -- the commands ---------------------------------------------------------------------------

voice_app = typer.Typer(help="NPC voices: list the profiles, preview one as a WAV file.")


@voice_app.command("list")
def voice_list() -> None:
    """The voice profiles NPCs can have (`voice_id` in a card; an archetype's name is one)."""
    from mythic.speech import Voices

    for profile in Voices():
        effects = ", ".join(" ".join(effect) for effect in profile.effects) or "-"
        out.print(
            f"{profile.voice_id:<10} {profile.engine:<7} rate {profile.rate:<5g} pitch "
            f"{profile.pitch_semitones:+g}  effects: {effects}  {profile.description}"
        )


@voice_app.command("preview")
def voice_preview(
    voice_id: Annotated[str, typer.Argument(help="A voice id (mythic voice list).")],
    text: Annotated[str, typer.Argument(help="What to say.")],
    output: Annotated[Path, typer.Option("--out", "-o", help="The WAV file to write.")] = Path(
        "preview.wav"
    ),
) -> None:
    """Say `text` in a voice, into a WAV file."""
    import asyncio

    from mythic.speech import write_preview

    path = guard(lambda: asyncio.run(write_preview(voice_id, text, output)))
    out.print(f"wrote {path}")
