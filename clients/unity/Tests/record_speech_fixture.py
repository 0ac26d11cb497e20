"""Records Tests/Fixtures/tts_chunk.json: one binary TTSChunk frame, as a real `mythic serve`
with voice on sends it, for the lip-sync tests (LipSyncTests.cs).

    MYTHIC_ENGINE__DIALOGUE_MODEL=smollm2-135m-instruct \
        mythic serve --world examples/worlds/ravenmoor --port 8791 --voice &
    .venv/bin/python clients/unity/Tests/record_speech_fixture.py ws://127.0.0.1:8791/v1/ws

The chunk kept is the turn's first with three different visemes or more; the frame is stored
whole (base64), so the test reads it through the SDK's own MYA1 decoder.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

from websockets.asyncio.client import connect

from mythic.contracts import TTSChunk, parse_audio_frame

FIXTURE = Path(__file__).parent / "Fixtures" / "tts_chunk.json"


async def record(url: str) -> None:
    async with connect(url, max_size=None) as ws, asyncio.timeout(600):
        start = {"schema_version": "v1", "type": "SessionStart", "voice": {"binary": True}}
        await ws.send(json.dumps(start))
        welcome = json.loads(await ws.recv())
        line = {
            "schema_version": "v1",
            "type": "PlayerUtterance",
            "npc_id": "marla",
            "session_id": welcome["session_id"],
            "turn_id": "t-fixture",
            "text": "Good evening! Is the tavern open tonight?",
        }
        await ws.send(json.dumps(line))
        while True:
            frame = await ws.recv()
            if isinstance(frame, bytes):
                chunk = parse_audio_frame(frame, side="server")
                assert isinstance(chunk, TTSChunk)
                if len({v.p for v in chunk.visemes}) >= 3:
                    break
    FIXTURE.parent.mkdir(exist_ok=True)
    record = {
        "about": "One TTSChunk binary frame (MYA1) of `mythic serve` with voice on, NPC marla.",
        "frame_base64": base64.b64encode(frame).decode(),
    }
    FIXTURE.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{FIXTURE}: {len(frame)} bytes, visemes {[v.p for v in chunk.visemes]}")


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1]))
