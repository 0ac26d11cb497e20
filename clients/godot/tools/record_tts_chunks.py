"""Records the TTSChunk messages the server's voice sends for one short line (Piper, the
`human` voice, visemes from its phonemes), as JSON frames carry them: the real data the addon's
lip-sync test (`test/unit_tests.gd`) drives a face with. Needs `mythic[speech]` (Piper, sox).

    python clients/godot/tools/record_tts_chunks.py [--text TEXT] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from mythic.contracts import TTSChunk, Viseme, dump_message
from mythic.speech import SpeechSettings, TTSPool

OUT = Path(__file__).resolve().parent.parent / "test" / "data" / "tts_chunks.json"
TEXT = "Mind the marsh, friend."


async def record(text: str) -> list[dict[str, object]]:
    """The line's chunks as the server sends them to a session (ids of a made-up turn)."""
    chunks: list[dict[str, object]] = []
    async with TTSPool(SpeechSettings(tts_workers=1)) as tts, tts.synthesize(text) as speech:
        seq = 0
        async for chunk in speech:
            message = TTSChunk(
                npc_id="marla",
                session_id="s-recorded",
                turn_id="t-recorded",
                seq=seq,
                pcm=chunk.pcm,
                sample_rate=chunk.sample_rate,
                visemes=tuple(Viseme(t=round(t, 4), p=p) for t, p in chunk.visemes),
                final=chunk.final,
            )
            chunks.append(json.loads(dump_message(message)))
            seq += 1
    return chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    chunks = asyncio.run(record(args.text))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"text": args.text, "chunks": chunks}, indent=1) + "\n")
    print(f"{len(chunks)} chunks of {args.text!r} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
