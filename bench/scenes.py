"""Scenes at load: the player-addressed reply's time to first token in 10 group scenes at once,
against the same lines said one-to-one, in the same run on the same server.

Ten players each open a scene of 3 to 5 of the example world's NPCs (`SceneStart`, the NPCs
drawn in turn from its eight, so NPCs sit in several scenes at once, as in a busy tavern
district) and say `--lines` lines one after another, each naming the NPC it is for
("Marla, ..."): the scene answers with that NPC (`SceneTurn`, chosen by name), and the
others hear it. The same ten players then say the same lines to the same NPCs as plain
`PlayerUtterance`s, one-to-one, in sessions of their own. Both paths run on one real server
(uvicorn on loopback) and one loaded model; the order of the paths alternates per round.

What each path pays for is the same reply: `max_exchanges` 0 (no NPC answers another: the
scene's only extra work is choosing the speaker by name and telling the others what was
said), `dialogue.decide` off, temperature 0, 24 tokens. What the scene adds on top is the
heard lines in each NPC's next prompt (`## Heard nearby`): they are part of the cost being
measured, as a game would pay it.

Measured on the client: from just before a line is sent to the first non-empty reply delta of
the NPC it names, p50/p95 over every line of every round; the scene path's ratio against the
one-to-one path. Writes bench/results/scenes.json.

    .venv/bin/python bench/scenes.py [--model NAME] [--scenes 10] [--lines 3] [--rounds 2]
                                     [--tokens 24] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from _results import pct, write_results  # noqa: E402
from mythic.config import MythicSettings, load_settings  # noqa: E402
from mythic.contracts import (  # noqa: E402
    Error,
    LLMStreamDelta,
    SceneState,
    SceneTurn,
    ServerMessage,
    Welcome,
    parse_server_message,
)
from mythic.engine import Engine  # noqa: E402
from mythic.knowledge import load_world  # noqa: E402
from mythic.server import Gateway, serving  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scenes.json"
WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
PATHS = ("scene", "one_to_one")
QUESTIONS = [
    "what news from the road tonight?",
    "is the marsh safe after dark?",
    "who rules this city now?",
    "where can a stranger sleep?",
    "what is buried in the catacombs?",
    "why is the fog so thick?",
]
WAIT_S = 300.0


def bench_settings(settings: MythicSettings, tokens: int) -> MythicSettings:
    sections: dict[str, dict[str, Any]] = {
        "chat": {"max_tokens": tokens, "temperature": 0.0},
        "dialogue": {"decide": False, "max_concurrent_speakers": 1024, "mailbox_size": 256},
        "server": {"rate_per_s": 1e6, "rate_burst": 10**6, "warm_npcs": 0},
        "scenes": {"max_exchanges": 0},
    }
    updates = {
        name: getattr(settings, name).model_copy(update=values) for name, values in sections.items()
    }
    return settings.model_copy(update=updates)


def casts(npcs: list[str], scenes: int) -> list[list[str]]:
    """Scene i's NPCs: 3, 4 or 5 of them, drawn in turn from the world's."""
    out, at = [], 0
    for i in range(scenes):
        size = 3 + i % 3
        out.append([npcs[(at + k) % len(npcs)] for k in range(size)])
        at += 2
    return out


def lines(
    world_names: dict[str, str], cast: list[str], count: int, i: int
) -> list[tuple[str, str]]:
    """(npc, line) for each of the scene's lines: each names the NPC it is for."""
    out = []
    for k in range(count):
        npc = cast[(i + k) % len(cast)]
        out.append((npc, f"{world_names[npc]}, {QUESTIONS[(i + k) % len(QUESTIONS)]}"))
    return out


async def recv(ws: ClientConnection) -> ServerMessage:
    async with asyncio.timeout(WAIT_S):
        return parse_server_message(await ws.recv())


async def start(url: str) -> tuple[ClientConnection, str]:
    ws = await connect(url, max_size=1 << 24)
    await ws.send(json.dumps({"schema_version": "v1", "type": "SessionStart"}))
    welcome = await recv(ws)
    assert isinstance(welcome, Welcome), welcome
    return ws, welcome.session_id


async def one_player(
    url: str, path: str, tag: str, cast: list[str], said: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """One player's lines on `path`: per line, the NPC it names and the first token's time."""
    ws, session = await start(url)
    out: list[dict[str, Any]] = []
    try:
        scene = f"{tag}-scene"
        if path == "scene":
            await ws.send(
                json.dumps(
                    {
                        "schema_version": "v1",
                        "type": "SceneStart",
                        "scene_id": scene,
                        "session_id": session,
                        "npcs": cast,
                        "max_exchanges": 0,
                    }
                )
            )
            while not isinstance(await recv(ws), SceneState):
                pass
        for k, (npc, text) in enumerate(said):
            turn = f"{tag}-{k}"
            frame: dict[str, Any] = (
                {"type": "SceneLine", "scene_id": scene}
                if path == "scene"
                else {"type": "PlayerUtterance", "npc_id": npc}
            )
            frame |= {"schema_version": "v1", "session_id": session, "turn_id": turn, "text": text}
            sent = time.perf_counter()
            await ws.send(json.dumps(frame))
            first: float | None = None
            speaker: str | None = None
            error: str | None = None
            while True:
                message = await recv(ws)
                if isinstance(message, SceneTurn) and message.turn_id == turn:
                    speaker = message.speakers[0] if message.speakers else None
                elif isinstance(message, Error):
                    error = message.code
                    break
                elif isinstance(message, LLMStreamDelta) and message.turn_id == turn:
                    if first is None and message.delta:
                        first = time.perf_counter() - sent
                    if message.final:
                        speaker = speaker or message.npc_id
                        break
            out.append(
                {
                    "npc": npc,
                    "answered_by": speaker,
                    "ttft_ms": first and first * 1000,
                    "error": error,
                }
            )
    finally:
        await ws.close()
    return out


async def bench(
    engine: Engine, scenes: int, count: int, rounds: int, tokens: int
) -> dict[str, Any]:
    world = load_world(WORLD)
    npcs = sorted(world.npcs)
    names = {n: world.npcs[n].name.split(",")[0].split()[-1] for n in npcs}
    settings = bench_settings(load_settings(), tokens)
    gateway = Gateway(settings, world, engine)
    groups = casts(npcs, scenes)
    said = [lines(names, cast, count, i) for i, cast in enumerate(groups)]
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    async with serving(gateway) as (host, port):
        url = f"ws://{host}:{port}/v1/ws"
        # Untimed: one line to every NPC, so personas are in the KV cache for both paths.
        await one_player(
            url, "one_to_one", "warm", npcs, [(n, f"{names[n]}, good evening.") for n in npcs]
        )
        for r in range(rounds):
            order = PATHS if r % 2 == 0 else PATHS[::-1]
            for path in order:
                results = await asyncio.gather(
                    *(
                        one_player(url, path, f"{path}-r{r}-p{i}", cast, said[i])
                        for i, cast in enumerate(groups)
                    )
                )
                samples[path] += [s for player in results for s in player]
                print(f"round {r + 1}/{rounds} {path}: {sum(len(p) for p in results)} lines")
    rows: dict[str, Any] = {}
    for path in PATHS:
        ttft = [s["ttft_ms"] for s in samples[path] if s["ttft_ms"] is not None]
        rows[path] = {
            "lines": len(samples[path]),
            "answered": len(ttft),
            "errors": sum(s["error"] is not None for s in samples[path]),
            "answered_by_named": sum(s["answered_by"] == s["npc"] for s in samples[path]),
            "ttft_ms": {
                "p50": pct(ttft, 0.5),
                "p95": pct(ttft, 0.95),
                "mean": statistics.fmean(ttft) if ttft else None,
            },
        }
    base = rows["one_to_one"]["ttft_ms"]
    for path in PATHS:
        mine = rows[path]["ttft_ms"]
        rows[path]["ratio_p50"] = mine["p50"] / base["p50"] if mine["p50"] and base["p50"] else None
        rows[path]["ratio_p95"] = mine["p95"] / base["p95"] if mine["p95"] and base["p95"] else None
    rows["scene_sizes"] = [len(c) for c in groups]
    return rows


def print_table(rows: dict[str, Any]) -> None:
    heads = ("path", "lines", "named", "err", "p50 ms", "p95 ms", "x p50", "x p95")
    print(f"{heads[0]:<12}" + "".join(f"{h:>8}" for h in heads[1:]))
    for path in PATHS:
        r, t = rows[path], rows[path]["ttft_ms"]
        cells = [r["lines"], r["answered_by_named"], r["errors"]]
        numbers = [t["p50"] or 0, t["p95"] or 0]
        ratios = [r["ratio_p50"] or 0, r["ratio_p95"] or 0]
        print(
            f"{path:<12}"
            + "".join(f"{c:>8}" for c in cells)
            + "".join(f"{n:>8.0f}" for n in numbers)
            + "".join(f"{x:>8.2f}" for x in ratios)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="dialogue model (default: engine.dialogue_model)"
    )
    parser.add_argument("--scenes", type=int, default=10)
    parser.add_argument("--lines", type=int, default=3, help="lines per player")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="3 scenes, 1 line, 1 round")
    args = parser.parse_args()
    scenes, count, rounds = (3, 1, 1) if args.quick else (args.scenes, args.lines, args.rounds)
    settings = load_settings()
    model = args.model or settings.engine.dialogue_model
    engine = Engine.load(settings.engine, model)
    try:
        rows = asyncio.run(bench(engine, scenes, count, rounds, args.tokens))
    finally:
        engine.close()
    print_table(rows)
    write_results(
        RESULTS,
        ROOT,
        results=rows,
        benchmark="scenes",
        baseline="the same lines to the same NPCs one-to-one (PlayerUtterance), same server",
        model=model,
        scenes=scenes,
        lines=count,
        rounds=rounds,
        max_tokens=args.tokens,
    )


if __name__ == "__main__":
    main()
