"""`mythic sim --scene`: while the region runs, the player sits at a table with three of the
world's NPCs: a line to each by name, then the NPCs talk among themselves. The scene plays
through the Python client in a process of its own (below the game's priority, on the model's
cores), so the frame loop measures what a game feels: the scene's traffic on the same server
beside the intents, never in the frame."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mythic._errors import MythicError

_NICE = 5
"""The scene's process runs below the game's priority, as the intent client's does."""
_SCENE_WAIT_S = 900.0
"""The bound on the whole scene: its lines on a small shared CPU."""


@dataclass(frozen=True, slots=True)
class ScenePlan:
    """The table: its NPCs, and the player's line to each (naming it)."""

    npcs: tuple[str, ...]
    lines: tuple[tuple[str, str], ...]
    """(the NPC the line names, the line), in order."""
    ambient: int = 4
    """Lines of the NPCs' talk among themselves after the player's."""


@dataclass(slots=True)
class SceneResult:
    """What the scene did: who answered each line, how soon, and the ambient talk."""

    answered: list[tuple[str, str | None, str]] = field(default_factory=list)
    """(the NPC named, the NPC that answered first, how it was chosen) per line."""
    first_token_s: list[float] = field(default_factory=list)
    """From a line sent to its first reply's first words."""
    ambient_said: int = 0
    ambient_replies: int = 0
    started_s: float = 0.0
    ended_s: float = 0.0
    error: str | None = None


def plan_scene(world: Path, npcs: Sequence[str] | None, ambient: int = 4) -> ScenePlan:
    """Three NPCs of `world` (`npcs`, else its first three) and a line naming each.

    Raises:
        MythicError: an NPC the world lacks, or fewer than two.
    """
    from mythic.knowledge import load_world

    loaded = load_world(world)
    chosen = tuple(npcs) if npcs else tuple(sorted(loaded.npcs)[:3])
    unknown = [n for n in chosen if n not in loaded.npcs]
    if unknown:
        raise MythicError(
            f"--scene-npcs: {', '.join(unknown)} not in {loaded.name} "
            f"(its NPCs: {', '.join(sorted(loaded.npcs))})"
        )
    if len(chosen) < 2:
        raise MythicError("--scene-npcs: a scene takes two NPCs or more")
    lines = []
    for npc_id in chosen:
        name = loaded.npcs[npc_id].name.split(",")[0].strip()
        lines.append((npc_id, f"{name}, what news tonight?"))
    return ScenePlan(chosen, tuple(lines), ambient)


async def play_scene(url: str, plan: ScenePlan, *, player_id: str = "sim-guest") -> SceneResult:
    """The scene over `url`: open it, say each line and read its replies, then the NPCs'
    ambient talk, then end it."""
    from mythic.client import MythicClient
    from mythic.contracts import LLMStreamDelta

    result = SceneResult()
    start = time.monotonic()
    async with MythicClient(url, player_id=player_id, timeout_s=300.0) as client:
        result.started_s = time.monotonic() - start
        scene = await client.start_scene(f"sim-{int(start * 1000)}", list(plan.npcs))
        for npc_id, line in plan.lines:
            sent = time.monotonic()
            talk = await scene.say(line)
            first: float | None = None
            async for event in talk:
                if isinstance(event, LLMStreamDelta) and event.delta and first is None:
                    first = time.monotonic() - sent
            if first is not None:
                result.first_token_s.append(first)
            chosen = talk.turns[0].chosen_by if talk.turns else "nobody"
            first_speaker = talk.speakers[0] if talk.speakers else None
            result.answered.append((npc_id, first_speaker, chosen))
        if plan.ambient:
            talk = await (await scene.ambient(plan.ambient, priority="bronze")).wait()
            result.ambient_replies = len(talk.replies)
            result.ambient_said = sum(1 for r in talk.replies if r.text.strip())
        await scene.end("the sim is over")
    result.ended_s = time.monotonic() - start
    return result


def _run(
    url: str, plan: ScenePlan, out: Connection, nice: int, cpus: frozenset[int] | None
) -> None:
    """The scene's process: placed below the game, then the scene; its result sent back."""
    from mythic.control import Placement

    Placement(nice, cpus).apply()
    try:
        result = asyncio.run(play_scene(url, plan))
    except (MythicError, OSError, TimeoutError) as exc:  # reported in the sim's output
        result = SceneResult(error=f"{type(exc).__name__}: {exc}")
    out.send(result)
    out.close()


@contextlib.contextmanager
def scene_player(
    url: str, plan: ScenePlan, *, cpus: Collection[int] | None = None
) -> Iterator[Any]:
    """Start the scene in a process of its own; yields a function that waits (bounded) for its
    `SceneResult`. The process is ended on exit."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=_run,
        args=(url, plan, send, _NICE, frozenset(cpus) if cpus is not None else None),
        name="mythic sim scene",
        daemon=True,
    )
    process.start()
    send.close()

    def result(timeout_s: float = _SCENE_WAIT_S) -> SceneResult:
        if receive.poll(timeout_s):
            with contextlib.suppress(EOFError):
                got: SceneResult = receive.recv()
                return got
        return SceneResult(error=f"the scene did not end within {timeout_s:.0f} s")

    try:
        yield result
    finally:
        if process.is_alive():
            process.terminate()
        process.join(10)
        receive.close()


def describe(result: SceneResult, plan: ScenePlan) -> list[str]:
    """The scene's lines of the sim's report."""
    if result.error is not None:
        return [f"scene failed: {result.error}"]
    by_name = sum(1 for named, first, _ in result.answered if first == named)
    answered = ", ".join(f"{first or 'nobody'} ({how})" for _, first, how in result.answered)
    firsts = sorted(result.first_token_s)
    p50 = f"{firsts[len(firsts) // 2] * 1000:.0f} ms" if firsts else "-"
    return [
        f"scene {', '.join(plan.npcs)}: {len(result.answered)} lines, {by_name} answered by the "
        f"NPC named ({answered}); first token p50 {p50}",
        f"scene ambient {result.ambient_said}/{plan.ambient} lines said "
        f"({result.ambient_replies} replies); the scene ran {result.started_s:.1f}-"
        f"{result.ended_s:.1f} s",
    ]
