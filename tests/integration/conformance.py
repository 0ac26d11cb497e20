"""The client conformance suite's harness (`clients/conformance/`): the server every SDK's
player meets, started as a user starts it, and the audio clips its `talk` steps speak.

The session fixtures `conformance_url` and `conformance_audio` (tests/integration/conftest.py)
start each once per test run, for every player that asks: the Python one
(`test_conformance.py`) and the TypeScript, C# and Godot ones (`test_sdk_*.py`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import EXAMPLE_WORLD, ROOT, served_address

CONFORMANCE = ROOT / "clients" / "conformance"
SCENARIOS = sorted((CONFORMANCE / "scenarios").glob("*.json"))

# The server every player meets (clients/conformance/README.md says the same): SmolLM2 talks
# and decides (one small model: fast), replies are short and greedy, voice is on.
SERVE_ENV = {
    "MYTHIC_ENGINE__DIALOGUE_MODEL": "smollm2-135m-instruct",
    "MYTHIC_CHAT__MAX_TOKENS": "40",
    "MYTHIC_CHAT__TEMPERATURE": "0",
}
SERVE_ARGS = ("serve", "--world", str(EXAMPLE_WORLD), "--port", "0", "--voice")
CLIPS = {"question": "Good evening. What do you have for sale tonight?"}
"""The audio clips `talk` steps speak (the README's table): name -> words."""
CLIP_RATE = 16000


@contextlib.contextmanager
def mythic_serve(log_dir: Path, ready_timeout_s: float = 180) -> Iterator[str]:
    """`mythic serve` of the example world on a free loopback port, as a user starts it;
    yields its WebSocket URL once `/readyz` answers, and kills it on exit."""
    # stderr goes to a file: llama.cpp logs a lot, and a full pipe would block the server.
    with (log_dir / "serve.log").open("w+b") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mythic", *SERVE_ARGS],
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
            env={**os.environ, **SERVE_ENV},
        )
        assert proc.stdout is not None
        try:
            address = served_address(
                proc, time.monotonic() + ready_timeout_s, "the conformance server"
            )
            yield f"ws://{address}/v1/ws"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            proc.stdout.close()


async def speak_clips(folder: Path) -> None:
    """Write each of `CLIPS` into `folder` as `<name>.pcm`, spoken by the server's own Piper
    voice at 16 kHz (16-bit mono PCM) with a fifth of a second of silence before it."""
    from mythic.speech import SpeechSettings, TTSPool

    settings = SpeechSettings(sample_rate=CLIP_RATE, tts_workers=1)
    async with TTSPool(settings) as tts:
        # No random variation: the same audio every run.
        voice = tts.voices.get("human").model_copy(update={"variation": 0.0})
        for name, words in CLIPS.items():
            pcm, _ = await tts.speak(words, voice)
            (folder / f"{name}.pcm").write_bytes(bytes(CLIP_RATE // 5 * 2) + pcm)
