"""Turn-taking: false cut-ins, missed barge-ins, backchannels and the endpoint delay, with
turns ended on silence alone against the turn model, on a labelled set.

The set (bench/turn_taking.yaml, text and pauses only) is spoken by the project's own Piper
voice at 16 kHz and streamed at real-time pace over the real server's WebSocket to a
`mythic serve --voice` in its own process, once per round: `silence` (turns end after
`speech.trailing_silence_ms` of silence, no preemptive reply) and `smart` (the defaults: Smart
Turn v3.2 judges each pause; "not yet" waits up to `speech.turn_wait_ms`). Each line gets a
session of its own.

- The player's lines (`complete`, `paused`, `filler`, `digits`) are said to a silent NPC, then
  1.5 s of silence. A line the server heard as two or more utterances was cut in on (a false
  cut-in: the NPC would have answered half a sentence). For the lines without a pause, the
  endpoint delay is from the end of the speech to the final transcript (the server's answer to
  "has the player finished?", its transcription included).
- The lines said over the NPC (`backchannel`, `barge_in`): the NPC is asked for a long story,
  and once its first audio has come the line is said. A barge-in the NPC did not stop for
  within 6 s is missed; a backchannel it stopped for is a backchannel that cut it off.

The dialogue model is SmolLM2 (`--model`): turn-taking happens before the reply, and a small
model keeps the stories coming. Writes bench/results/turn_taking.json.

    .venv/bin/python bench/turn_taking.py [--rounds silence,smart] [--only paused,barge_in]
                                          [--voice human] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.cli._sim import spawned_server  # noqa: E402

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
NPC = "marla"
SET = ROOT / "bench" / "turn_taking.yaml"
PLAYER = ("complete", "paused", "filler", "digits")
OVER = ("backchannel", "barge_in")
ROUNDS: dict[str, dict[str, str | None]] = {
    "silence": {"SPEECH__TURN_DETECTOR": "silence", "DIALOGUE__PREEMPT_SPOKEN_LINES": "false"},
    "smart": {"SPEECH__TURN_DETECTOR": None, "DIALOGUE__PREEMPT_SPOKEN_LINES": None},
}
RATE = 16000
STORY = "Tell me a long story about this town, from the very beginning."
TAIL_S = 1.5  # silence after a line: longer than any endpoint (turn_wait_ms is 1.2 s)


def load_set(only: set[str] | None) -> dict[str, list[list[str | int]]]:
    lines: dict[str, list[list[str | int]]] = yaml.safe_load(SET.read_text())
    return {k: v for k, v in lines.items() if only is None or k in only}


async def speak(lines: dict[str, list[list[str | int]]], voice: str) -> dict[str, list[bytes]]:
    """Each line's audio: its words spoken, its pauses as silence, 200 ms before it."""
    from mythic.speech import SpeechSettings, TTSPool

    audio: dict[str, list[bytes]] = {}
    async with TTSPool(SpeechSettings(sample_rate=RATE)) as tts:
        for kind, items in lines.items():
            audio[kind] = []
            for item in items:
                pcm = bytearray(RATE // 5 * 2)
                for part in item:
                    if isinstance(part, int):
                        pcm += bytes(RATE * 2 * part // 1000)
                    else:
                        pcm += (await tts.speak(part, voice))[0]
                audio[kind].append(bytes(pcm))
    return audio


async def utterances(address: str) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        text = (await http.get("/metrics")).text
    found = re.search(r"^mythic_voice_utterances_total ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def player_line(url: str, address: str, pcm: bytes) -> dict[str, Any]:
    """A line said to a silent NPC: how many utterances the server heard in it, and the
    endpoint delay (end of speech to the final transcript)."""
    from mythic.client import MythicClient
    from mythic.contracts import VoiceFormat

    before = await utterances(address)
    async with MythicClient(url, voice=VoiceFormat(binary=True), timeout_s=60) as client:
        turn = await client.talk(NPC, pcm, silence_ms=int(TAIL_S * 1000))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(turn.heard.wait(), 10)
        await asyncio.sleep(1.0)  # a second utterance of the same line is heard by now
        heard = await utterances(address) - before
    end = turn.speech_end_at
    delay = turn.heard_at - end if turn.heard_at is not None and end is not None else None
    return {"utterances": heard, "endpoint_s": delay, "transcript": turn.transcript}


async def over_npc(url: str, pcm: bytes) -> dict[str, Any]:
    """A line said while the NPC tells a story: whether it cut the NPC off."""
    from mythic.client import MythicClient
    from mythic.contracts import VoiceFormat

    async with MythicClient(url, voice=VoiceFormat(binary=True), timeout_s=60) as client:
        story = await client.talk(NPC, await story_pcm())
        began = time.perf_counter()
        while not story.chunks and time.perf_counter() - began < 60:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if not story.chunks:
            return {"speaking": False, "cut": None}
        await asyncio.sleep(0.5)  # well into its first words
        said = await client.talk(NPC, pcm, silence_ms=int(TAIL_S * 1000))
        deadline = time.perf_counter() + 6.0
        while story.cutoff is None and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        return {
            "speaking": True,
            "cut": story.cutoff is not None,
            "transcript": said.transcript,
        }


_STORY: list[bytes] = []


async def story_pcm() -> bytes:
    if not _STORY:
        from mythic.speech import SpeechSettings, TTSPool

        async with TTSPool(SpeechSettings(sample_rate=RATE)) as tts:
            _STORY.append(bytes(RATE // 5 * 2) + (await tts.speak(STORY, "human"))[0])
    return _STORY[0]


async def run_round(url: str, audio: dict[str, list[bytes]], lines: dict[str, Any]) -> list[Any]:
    address = url.removeprefix("ws://").removesuffix("/v1/ws")
    rows: list[dict[str, Any]] = []
    for kind, clips in audio.items():
        for item, pcm in zip(lines[kind], clips, strict=True):
            text = " ".join(p if isinstance(p, str) else f"[{p} ms]" for p in item)
            if kind in PLAYER:
                row = {"kind": kind, "line": text, **await player_line(url, address, pcm)}
                seen = f"{row['utterances']:.0f} utterance(s)"
            else:
                row = {"kind": kind, "line": text, **await over_npc(url, pcm)}
                seen = "cut the NPC off" if row["cut"] else "NPC went on"
            rows.append(row)
            print(f"  {kind:<12} {text[:60]:<60} {seen}", flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    paused = [r for r in rows if r["kind"] in ("paused", "filler", "digits")]
    complete = [r for r in rows if r["kind"] == "complete"]
    barge = [r for r in rows if r["kind"] == "barge_in" and r.get("speaking")]
    back = [r for r in rows if r["kind"] == "backchannel" and r.get("speaking")]
    return {
        "false_cut_ins": sum(1 for r in paused if r["utterances"] >= 2),
        "paused_lines": len(paused),
        "false_cut_ins_by_kind": {
            k: sum(1 for r in paused if r["kind"] == k and r["utterances"] >= 2)
            for k in ("paused", "filler", "digits")
        },
        "complete_split": sum(1 for r in complete if r["utterances"] >= 2),
        "complete_unheard": sum(1 for r in complete if r["utterances"] < 1),
        "endpoint_ms": latency([r["endpoint_s"] for r in complete if r["endpoint_s"]], 1000),
        "missed_barge_ins": sum(1 for r in barge if not r["cut"]),
        "barge_ins": len(barge),
        "backchannels_that_cut": sum(1 for r in back if r["cut"]),
        "backchannels": len(back),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", default="silence,smart")
    parser.add_argument("--only", default=None, help="kinds of line, e.g. paused,barge_in")
    parser.add_argument("--voice", default="human", help="the voice that says the lines")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="dialogue model")
    parser.add_argument("--threads", type=int, default=1, help="cores for the server's model")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "turn_taking.json")
    args = parser.parse_args()
    rounds = args.rounds.split(",")
    if set(rounds) - set(ROUNDS):
        parser.error(f"--rounds takes {', '.join(ROUNDS)}")
    lines = load_set(set(args.only.split(",")) if args.only else None)
    audio = asyncio.run(speak(lines, args.voice))
    os.environ.update(
        {
            "MYTHIC_ENGINE__DIALOGUE_MODEL": args.model,
            "MYTHIC_CHAT__MAX_TOKENS": "80",
            "MYTHIC_DIALOGUE__SPOKEN_MAX_SENTENCES": "0",  # stories long enough to talk over
            "MYTHIC_DIALOGUE__DECIDE": "false",
            "MYTHIC_SERVER__WARM_NPCS": "0",
        }
    )
    results: list[dict[str, Any]] = []

    def save(*, quiet: bool) -> None:
        write_results(
            args.out.resolve(),
            ROOT,
            benchmark="turn_taking",
            voice=args.voice,
            dialogue_model=args.model,
            server_threads=args.threads,
            results=results,
            quiet=quiet,
        )

    for name in rounds:
        for key, value in ROUNDS[name].items():
            if value is None:
                os.environ.pop(f"MYTHIC_{key}", None)
            else:
                os.environ[f"MYTHIC_{key}"] = value
        print(f"round {name}", flush=True)
        with spawned_server(WORLD, threads=args.threads, voice=True, nice=0) as url:
            rows = asyncio.run(run_round(url, audio, lines))
        results.append({"round": name, **summarise(rows)})
        save(quiet=True)  # a bench stopped in a later round keeps this one
    print(f"{'round':<9}{'false cut-ins':>15}{'missed barge-ins':>18}{'backchannels cut':>18}"
          f"{'endpoint p50':>14}{'p95':>7}{'x p50':>7}")  # fmt: skip
    base = results[0]["endpoint_ms"]["p50"]
    for r in results:
        ms = r["endpoint_ms"]
        print(
            f"{r['round']:<9}{r['false_cut_ins']:>8}/{r['paused_lines']:<6}"
            f"{r['missed_barge_ins']:>11}/{r['barge_ins']:<6}"
            f"{r['backchannels_that_cut']:>11}/{r['backchannels']:<6}"
            f"{fmt(ms['p50'], '.0f'):>14}{fmt(ms['p95'], '.0f'):>7}"
            f"{fmt(ratio(ms['p50'], base), '.2f'):>7}"
        )
    save(quiet=False)


if __name__ == "__main__":
    main()
