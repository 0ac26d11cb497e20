"""The WebSocket server's overhead: scripted player conversations over loopback against the
engine called directly, in the same run.

For N = 1, 8, 32, 64 simultaneous conversations, each K scripted player lines said one after
another, two paths do the same work on one loaded model (default SmolLM2-135M):
- server: a real uvicorn on loopback serving the example world (`mythic.server`), one
  `MythicClient` (one WebSocket, one session) per conversation;
- direct: the same conversations calling `Engine.submit` with the messages the NPC actor
  builds (persona, history, the line, the scene told on the first turn), its sampling and
  priority.

Conversation i talks to NPC i % 8. An NPC's actor answers one turn at a time, so past 8
conversations the turns to one NPC queue; the direct path holds a lock per NPC around each
turn, so both paths queue alike and the ratio is what the server adds: the protocol's
encoding, the WebSocket, the session outbox, the actor's mailbox and bookkeeping.

Measured on the client side: time to first token (from just before the line is sent to the
first non-empty reply delta) p50/p95/p99 over every turn, tokens/s (reply deltas received /
wall time of the run; the engine sends one delta per generated token, except while it holds
text back at a possible stop string) and errors. Target: server/direct TTFT <= 1.1x at 8.

What keeps the comparison fair:
- `dialogue.decide` is off: with it each turn also runs a gold decision request (intent and
  tool choice) on the engine, work the direct path would not do; it is not server overhead.
- No speaker limit (`max_concurrent_speakers` 1024); rate and session limits out of reach.
- Temperature 0 and the engine's batch invariance: both paths should say the same words. The
  share of identical replies is reported as the check that they did the same work.
- Before each measured run the path answers one turn per NPC through itself (not timed), so
  persona prefixes are in the KV cache and its code is warm; every run has fresh sessions.
- The order of the two paths alternates per N and per round (`--rounds`); TTFT samples of the
  rounds are pooled, tokens/s is their median.
- The clients connect before the clock starts: opening a session is not a turn's overhead.

Writes bench/results/server_load.json.

    .venv/bin/python bench/server_load.py [--model m] [--conversations 1,8,32,64] [--turns 3]
        [--tokens 32] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _results import write_results  # noqa: E402
from mythic import MythicError  # noqa: E402
from mythic.client import MythicClient  # noqa: E402
from mythic.config import MythicSettings, load_settings  # noqa: E402
from mythic.contracts import Error, LLMStreamDelta  # noqa: E402
from mythic.dialogue import Scene, chat_sampling, persona_prompt  # noqa: E402
from mythic.engine import ChatMessage, Engine, GenerationRequest, Priority  # noqa: E402
from mythic.knowledge import World, load_world  # noqa: E402
from mythic.server import Gateway, serving  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "server_load.json"
WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What news from the road?",
    "What do you sell here?",
    "Who rules this city?",
    "Is the marsh safe at night?",
    "What happened at the old mill?",
    "Where can a stranger sleep?",
    "Why is the fog so thick tonight?",
    "What is buried in the catacombs?",
]
WARMUP_LINE = "Good evening."
TARGET_AT_8 = 1.1
PATHS = ("direct", "server")

Script = Callable[[int, int], str]
"""Conversation index, turn index -> the player's line."""


def tavern_script(n_npcs: int) -> Script:
    """Conversations that share an NPC ask it different questions."""
    return lambda i, k: QUESTIONS[(i + i // n_npcs + k) % len(QUESTIONS)]


def warmup_script(i: int, k: int) -> str:
    del i, k
    return WARMUP_LINE


@dataclass(slots=True)
class TurnResult:
    conversation: int
    turn: int
    ttft_s: float | None = None
    deltas: int = 0
    chars: int = 0
    text: str = ""
    error: str | None = None


@dataclass(slots=True)
class RunResult:
    """One path answering N conversations once."""

    turns: list[TurnResult]
    wall_s: float
    engine_tokens: int
    stray_errors: list[str] = field(default_factory=list)
    """Errors that belonged to no turn (server path)."""
    server_ttft_s: list[float] = field(default_factory=list)
    """The gateway's own first-token times (server path): line received to first delta sent."""

    @property
    def errors(self) -> list[str]:
        return [t.error for t in self.turns if t.error is not None] + self.stray_errors

    @property
    def tok_s(self) -> float:
        return sum(t.deltas for t in self.turns) / self.wall_s if self.wall_s else 0.0


def bench_settings(settings: MythicSettings, tokens: int, conversations: int) -> MythicSettings:
    """The settings the server runs with (and the direct path copies)."""
    sections: dict[str, dict[str, Any]] = {
        "chat": {"max_tokens": tokens, "temperature": 0.0},
        "dialogue": {
            "max_concurrent_speakers": 1024,
            "decide": False,
            "mailbox_size": max(settings.dialogue.mailbox_size, conversations),
        },
        "server": {
            "rate_per_s": 1e6,
            "rate_burst": 10**6,
            "max_sessions": max(settings.server.max_sessions, 4 * conversations),
            # The direct path has no background warm-up at start; both paths warm their
            # personas with one untimed turn per NPC instead.
            "warm_npcs": 0,
        },
    }
    updates = {
        name: getattr(settings, name).model_copy(update=values) for name, values in sections.items()
    }
    return settings.model_copy(update=updates)


# -- the direct path --------------------------------------------------------------------------


class DirectPath:
    """The NPC actors' engine requests, made by hand: same messages, sampling and priority, and
    one turn at a time per NPC."""

    def __init__(self, engine: Engine, world: World, settings: MythicSettings) -> None:
        self.engine = engine
        self.npcs = sorted(world.npcs)
        self.system = {
            npc: ChatMessage("system", persona_prompt(world, world.npc(npc))) for npc in self.npcs
        }
        # The actor starts with the scene of its persona's zone and adds it to every prompt.
        self.scene = {npc: Scene(zone=world.npc(npc).zone).describe() for npc in self.npcs}
        self.sampling = chat_sampling(settings.chat)
        self.history_turns = settings.chat.history_turns

    def exchange(self, npc: str, history: list[ChatMessage], line: str) -> list[ChatMessage]:
        """What the actor adds for a line: the line, then the scene, told once (first turn)."""
        scene = self.scene[npc]
        told = [ChatMessage("system", scene)] if scene and not history else []
        return [ChatMessage("user", line), *told]

    def messages(
        self, npc: str, history: list[ChatMessage], new: list[ChatMessage]
    ) -> list[ChatMessage]:
        """What `NPCActor._reply_messages` builds: persona, the history's last
        `history_turns` exchanges (each ends with a reply), the new messages."""
        keep = self.history_turns
        starts = [0, *(i + 1 for i, m in enumerate(history) if m.role == "assistant")]
        starts = [i for i in starts if i < len(history)][-keep:] if keep else []
        begin = starts[0] if starts else len(history)
        return [self.system[npc], *history[begin:], *new]

    async def run(
        self, n: int, turns: int, script: Script, tag: str, timeout_s: float
    ) -> RunResult:
        locks = {npc: asyncio.Lock() for npc in self.npcs}
        tokens = self.engine.metrics().generated_tokens
        start = time.perf_counter()
        async with asyncio.TaskGroup() as tasks:
            running = [
                tasks.create_task(
                    self._conversation(i, turns, script, f"{tag}-{i}", locks, timeout_s)
                )
                for i in range(n)
            ]
        wall = time.perf_counter() - start
        return RunResult(
            [t for task in running for t in task.result()],
            wall,
            self.engine.metrics().generated_tokens - tokens,
        )

    async def _conversation(
        self,
        i: int,
        turns: int,
        script: Script,
        session: str,
        locks: dict[str, asyncio.Lock],
        timeout_s: float,
    ) -> list[TurnResult]:
        npc = self.npcs[i % len(self.npcs)]
        history: list[ChatMessage] = []
        results = []
        for k in range(turns):
            line = script(i, k)
            result = TurnResult(i, k)
            pieces: list[str] = []
            new = self.exchange(npc, history, line)
            start = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s), locks[npc]:
                    request = GenerationRequest(
                        npc_id=npc,
                        session_id=session,
                        messages=self.messages(npc, history, new),
                        priority=Priority.SILVER,
                        sampling=self.sampling,
                    )
                    finish = None
                    async with self.engine.submit(request) as stream:
                        async for delta in stream:
                            if delta.text:
                                if result.ttft_s is None:
                                    result.ttft_s = time.perf_counter() - start
                                result.deltas += 1
                                pieces.append(delta.text)
                            finish = delta.finish_reason or finish
                    if finish not in ("stop", "length"):
                        result.error = f"finish:{finish}"
            except TimeoutError:
                result.error = result.error or "timeout"
            except MythicError as exc:
                result.error = type(exc).__name__
            # The actor's history rule: the exchange joins it when the NPC said something.
            said = "".join(pieces).strip()
            if said:
                history += [*new, ChatMessage("assistant", said)]
            result.text = "".join(pieces)
            result.chars = len(result.text)
            results.append(result)
        return results


# -- the server path --------------------------------------------------------------------------


class ServerPath:
    """The conversations as game clients: one WebSocket session each."""

    def __init__(self, url: str, gateway: Gateway, npcs: list[str]) -> None:
        self.url = url
        self.gateway = gateway
        self.npcs = npcs

    async def run(
        self, n: int, turns: int, script: Script, tag: str, timeout_s: float
    ) -> RunResult:
        del tag  # the server names its sessions
        engine = self.gateway.engine
        async with contextlib.AsyncExitStack() as stack:
            clients: list[MythicClient | None] = []
            for _ in range(n):
                client = MythicClient(self.url, timeout_s=min(30.0, timeout_s))
                try:
                    clients.append(await stack.enter_async_context(client))
                except (MythicError, TimeoutError, OSError):
                    clients.append(None)
            self.gateway.cast.stats.first_tokens.clear()
            tokens = engine.metrics().generated_tokens
            start = time.perf_counter()
            async with asyncio.TaskGroup() as tasks:
                running = [
                    tasks.create_task(self._conversation(i, client, turns, script, timeout_s))
                    for i, client in enumerate(clients)
                ]
            wall = time.perf_counter() - start
            generated = engine.metrics().generated_tokens - tokens
            stray = []
            for connected in clients:
                while connected is not None and not connected.events.empty():
                    message = connected.events.get_nowait()
                    if isinstance(message, Error):
                        stray.append(message.code)
        return RunResult(
            [t for task in running for t in task.result()],
            wall,
            generated,
            stray_errors=stray,
            server_ttft_s=list(self.gateway.cast.stats.first_tokens),
        )

    async def _conversation(
        self, i: int, client: MythicClient | None, turns: int, script: Script, timeout_s: float
    ) -> list[TurnResult]:
        npc = self.npcs[i % len(self.npcs)]
        if client is None:
            return [TurnResult(i, k, error="connect") for k in range(turns)]
        results = []
        for k in range(turns):
            result = TurnResult(i, k)
            start = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    turn = await client.say(npc, script(i, k))
                    async for event in turn:
                        if isinstance(event, LLMStreamDelta) and event.delta:
                            if result.ttft_s is None:
                                result.ttft_s = time.perf_counter() - start
                            result.deltas += 1
                        elif isinstance(event, Error) and result.error is None:
                            result.error = event.code
                if result.error is None and turn.finish_reason not in ("stop", "length"):
                    result.error = f"finish:{turn.finish_reason}"
                result.text = turn.text
            except TimeoutError:
                result.error = result.error or "timeout"
            except (MythicError, OSError) as exc:
                result.error = type(exc).__name__
            result.chars = len(result.text)
            results.append(result)
        return results


# -- running and reporting --------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def summary(runs: list[RunResult]) -> dict[str, Any]:
    """One path at one N, over its rounds: TTFT samples pooled, throughput the median."""
    ttfts = [t.ttft_s for r in runs for t in r.turns if t.ttft_s is not None]
    server_side = [s for r in runs for s in r.server_ttft_s]
    errors = Counter(e for r in runs for e in r.errors)
    out: dict[str, Any] = {
        "turns": sum(len(r.turns) for r in runs),
        "ttft_p50_ms": ms(pct(ttfts, 0.5)),
        "ttft_p95_ms": ms(pct(ttfts, 0.95)),
        "ttft_p99_ms": ms(pct(ttfts, 0.99)),
        "tok_s": statistics.median(r.tok_s for r in runs),
        "deltas": sum(t.deltas for r in runs for t in r.turns),
        "chars": sum(t.chars for r in runs for t in r.turns),
        "engine_tokens": sum(r.engine_tokens for r in runs),
        "wall_s_median": statistics.median(r.wall_s for r in runs),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
    }
    if server_side:
        out["gateway_ttft_p50_ms"] = ms(pct(server_side, 0.5))
        out["gateway_ttft_p95_ms"] = ms(pct(server_side, 0.95))
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def same_replies(pairs: list[tuple[RunResult, RunResult]]) -> float:
    """The share of turns where both paths said exactly the same."""
    same = total = 0
    for direct, server in pairs:
        said = {(t.conversation, t.turn): t.text for t in server.turns}
        for t in direct.turns:
            total += 1
            same += said.get((t.conversation, t.turn)) == t.text
    return same / total if total else 0.0


async def bench(
    engine: Engine, ns: list[int], turns: int, tokens: int, rounds: int, timeout_s: float
) -> list[dict[str, Any]]:
    world = load_world(WORLD)
    npcs = sorted(world.npcs)
    settings = bench_settings(load_settings(), tokens, max(ns))
    script = tavern_script(len(npcs))
    rows = []
    gateway = Gateway(settings, world, engine)
    async with serving(gateway) as (host, port):
        url = f"ws://{host}:{port}/v1/ws"
        paths: dict[str, DirectPath | ServerPath] = {
            "direct": DirectPath(engine, world, settings),
            "server": ServerPath(url, gateway, npcs),
        }
        for index, n in enumerate(ns):
            runs: dict[str, list[RunResult]] = {p: [] for p in PATHS}
            warmup_errors: Counter[str] = Counter()
            for r in range(rounds):
                order = PATHS if (index + r) % 2 == 0 else PATHS[::-1]
                for name in order:
                    path = paths[name]
                    tag = f"{name}-n{n}-r{r}"
                    warm = await path.run(len(npcs), 1, warmup_script, f"{tag}-warm", timeout_s)
                    warmup_errors.update(warm.errors)
                    run = await path.run(n, turns, script, tag, timeout_s)
                    runs[name].append(run)
                    p50 = ms(pct([t.ttft_s for t in run.turns if t.ttft_s is not None], 0.5))
                    print(
                        f"N={n:>2} round {r} {name:6}: TTFT p50 "
                        f"{p50 if p50 is not None else float('nan'):6.0f} ms, "
                        f"{run.tok_s:6.1f} tok/s, {len(run.errors)} errors"
                    )
            direct, server = summary(runs["direct"]), summary(runs["server"])
            rows.append(
                {
                    "n": n,
                    "direct": direct,
                    "server": server,
                    "ratios": {
                        "ttft_p50": ratio(server["ttft_p50_ms"], direct["ttft_p50_ms"]),
                        "ttft_p95": ratio(server["ttft_p95_ms"], direct["ttft_p95_ms"]),
                        "tok_s": ratio(server["tok_s"], direct["tok_s"]),
                    },
                    "same_replies": same_replies(
                        list(zip(runs["direct"], runs["server"], strict=True))
                    ),
                    "warmup_errors": dict(warmup_errors),
                }
            )
    return rows


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    header = (
        f"{'N':>3} {'path':7} {'TTFT p50':>9} {'p95':>7} {'p99':>7} {'tok/s':>7} {'errors':>6}"
        f" {'x p50':>6} {'x p95':>6} {'x tok/s':>7} {'same':>5}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        for name in PATHS:
            s = row[name]
            line = (
                f"{row['n']:>3} {name:7} {fmt(s['ttft_p50_ms'], '.0f'):>9} "
                f"{fmt(s['ttft_p95_ms'], '.0f'):>7} {fmt(s['ttft_p99_ms'], '.0f'):>7} "
                f"{s['tok_s']:>7.1f} {s['errors']:>6}"
            )
            if name == "server":
                x = row["ratios"]
                line += (
                    f" {fmt(x['ttft_p50'], '.2f'):>6} {fmt(x['ttft_p95'], '.2f'):>6}"
                    f" {fmt(x['tok_s'], '.2f'):>7} {100 * row['same_replies']:>4.0f}%"
                )
            print(line)
    print("(TTFT in ms, client side; x = server / direct; same = identical replies)")
    at8 = next((row for row in rows if row["n"] == 8), None)
    if at8 is not None and at8["ratios"]["ttft_p50"] is not None:
        x = at8["ratios"]["ttft_p50"]
        verdict = "met" if x <= TARGET_AT_8 else "NOT met"
        print(f"server/direct TTFT p50 at N=8: {x:.2f}x (target <= {TARGET_AT_8}x): {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--conversations", default="1,8,32,64")
    parser.add_argument("--turns", type=int, default=3, help="player lines per conversation")
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of a reply")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each path per N")
    parser.add_argument("--turn-timeout", type=float, default=180.0, help="seconds per turn")
    parser.add_argument("--quick", action="store_true", help="N = 1, 8; 2 turns; 1 round")
    args = parser.parse_args()
    ns = [1, 8] if args.quick else [int(n) for n in args.conversations.split(",")]
    turns = 2 if args.quick else args.turns
    rounds = 1 if args.quick else args.rounds
    engine = Engine.load(load_settings().engine, args.model)
    try:
        rows = asyncio.run(bench(engine, ns, turns, args.tokens, rounds, args.turn_timeout))
    finally:
        engine.close()
    print_table(rows)
    write_results(
        RESULTS,
        ROOT,
        results=rows,
        benchmark="server_load",
        baseline="the engine called directly with the NPC actor's requests, "
        "one turn at a time per NPC",
        model=args.model,
        max_tokens=args.tokens,
        turns=turns,
        rounds=rounds,
        conversations=ns,
        target={"ttft_p50_ratio_at_8": TARGET_AT_8},
    )


if __name__ == "__main__":
    main()
