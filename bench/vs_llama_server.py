"""Mythic's engine against llama.cpp's own server, `llama-server`, on NPC workloads.

What a studio would run instead of Mythic's engine is `llama-server --parallel N`: continuous
batching, a prompt cache per slot, grammars. It is built from the llama.cpp that the installed
llama-cpp-python vendors, with the same instruction sets (`make llama-server`, cached beside the
wheel), and serves the same GGUF. Both sides get the same work, one after the other in one run:

- the same prompt tokens (the engine's chat template, sent to llama-server as token ids), the
  same sampler chain (repeat penalty over 64 tokens, top-k 40, top-p 0.9, temperature 0.7, one
  seed per NPC), `MAX_TOKENS` tokens generated per reply (`ignore_eos` on both sides), the
  same threads;
- `cold`: N NPCs' first turns at once, from empty caches (a fresh engine, a fresh server);
  personas from both example worlds, distinct up to their number (15), repeated past it;
- `follow`: the same N conversations' second turns right after (each side has the first turn
  cached: the engine in the session's sequence, llama-server in the NPC's slot, `id_slot`);
- `zone`: cold first turns of 8 NPCs standing in one zone (their prompts share the template,
  the world and the zone before the persona);
- `mixed`: gold intents (JSON schema, greedy, strict priority on the engine) one at a time
  while 8 silver conversations stream, against the same intents on an idle engine / server;
  llama-server has no priority: its figure is reported beside.

Per workload: aggregate generated tokens/s (all tokens over the wall time from the first
submission to the last token), time to first token p50/p95 (the engine's from its own timing,
llama-server's at the client from the first streamed token), and prompt tokens evaluated (what
each side computed, not what it reused). Ratios are Mythic over llama-server, per round;
medians of `--rounds`. Writes bench/results/vs_llama_server.json.

    .venv/bin/python bench/vs_llama_server.py [--n 1,4,8,16,32] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from _results import write_results  # noqa: E402
from mythic.config import EngineSettings, load_settings  # noqa: E402
from mythic.dialogue import persona_prompt  # noqa: E402
from mythic.engine import (  # noqa: E402
    ChatMessage,
    Engine,
    GenerationRequest,
    Priority,
    Sampling,
)
from mythic.engine.models import ModelStore  # noqa: E402
from mythic.knowledge import World, load_world  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "vs_llama_server.json"
WORLDS = [ROOT / "examples" / "worlds" / "ravenmoor", ROOT / "examples" / "worlds" / "coldiron"]
MODEL = "qwen2.5-coder-0.5b-instruct"
MAX_TOKENS = 64
SAMPLING = Sampling(max_tokens=MAX_TOKENS, temperature=0.7, top_k=40, top_p=0.9, ignore_eos=True)
QUESTIONS = [
    "What news from the road?",
    "What do you sell here?",
    "Who rules this place?",
    "Is it safe at night?",
    "What happened here last winter?",
    "Where can a stranger sleep?",
    "Why is the fog so thick tonight?",
    "What is buried under this town?",
]
REPLY = "Aye, stranger. Sit down, the night is long and the ale is cheap."
FOLLOW_UP = "And what should a stranger avoid around here?"
INTENT_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["attack", "flee", "talk", "wait"]},
        "target": {"enum": ["player", "guard", "nobody"]},
    },
    "required": ["action", "target"],
}
INTENT_PROMPT = "The guard sees the player draw a blade at the gate. Intent as JSON: "
SILVER = 8
GOLD_TRIALS = 8


# -- the workload ----------------------------------------------------------------------------


def _cast() -> list[tuple[World, str]]:
    cast = []
    for path in WORLDS:
        world = load_world(path)
        cast += [(world, npc) for npc in sorted(world.npcs)]
    return cast


def first_turns(n: int) -> list[list[ChatMessage]]:
    """N NPCs' first turns: personas of both worlds in turn, each NPC its own question."""
    cast = _cast()
    out = []
    for i in range(n):
        world, npc = cast[i % len(cast)]
        system = persona_prompt(world, world.npc(npc))
        out.append([ChatMessage("system", system), ChatMessage("user", QUESTIONS[i % 8])])
    return out


def zone_turns(n: int) -> list[list[ChatMessage]]:
    """N NPCs of the first world standing in one zone (its first), each asked its question."""
    world = load_world(WORLDS[0])
    zone = next(iter(world.card.zones))
    npcs = sorted(world.npcs)
    out = []
    for i in range(n):
        persona = world.npc(npcs[i % len(npcs)]).model_copy(update={"zone": zone})
        system = persona_prompt(world, persona)
        out.append([ChatMessage("system", system), ChatMessage("user", QUESTIONS[i % 8])])
    return out


def second_turns(firsts: list[list[ChatMessage]]) -> list[list[ChatMessage]]:
    return [
        [*first, ChatMessage("assistant", REPLY), ChatMessage("user", FOLLOW_UP)]
        for first in firsts
    ]


@dataclass
class Outcome:
    """One workload on one side, in one round."""

    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    prompt_evaluated: int = 0

    def row(self) -> dict[str, Any]:
        ttft = sorted(self.ttft_s)
        return {
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "tok_s": self.tokens / self.wall_s if self.wall_s else 0.0,
            "ttft_p50_s": _pct(ttft, 0.5),
            "ttft_p95_s": _pct(ttft, 0.95),
            "prompt_evaluated": self.prompt_evaluated,
        }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


# -- Mythic's engine -------------------------------------------------------------------------


class MythicSide:
    def __init__(self, settings: EngineSettings, n_seq: int) -> None:
        self.settings = settings.model_copy(
            update={"max_sequences": max(settings.max_sequences, n_seq + 8)}
        )
        self.engine = Engine.load(self.settings, MODEL)

    def tokens(self, messages: list[ChatMessage]) -> list[int]:
        """The prompt tokens the engine evaluates for `messages` (sent to llama-server)."""
        return self.engine.prompt_tokens(GenerationRequest(npc_id="tokens", messages=messages))

    async def turns(self, convs: list[list[ChatMessage]], tag: str) -> Outcome:
        before = self.engine.metrics()
        start = time.perf_counter()
        streams = [
            self.engine.submit(
                GenerationRequest(
                    npc_id=f"{tag}-{i}",
                    messages=messages,
                    sampling=replace(SAMPLING, seed=i + 1),
                )
            )
            for i, messages in enumerate(convs)
        ]
        done = await asyncio.gather(*(s.collect() for s in streams))
        wall = time.perf_counter() - start
        after = self.engine.metrics()
        evaluated = (after.prompt_tokens - after.cached_prompt_tokens) - (
            before.prompt_tokens - before.cached_prompt_tokens
        )
        return Outcome(
            tokens=sum(c.tokens for c in done),
            wall_s=wall,
            ttft_s=[c.timing.first_token_s or 0.0 for c in done],
            prompt_evaluated=evaluated,
        )

    async def gold(self, load: int) -> list[float]:
        silver = []
        if load:
            for i, messages in enumerate(first_turns(load)):
                request = GenerationRequest(
                    npc_id=f"talker-{i}",
                    messages=messages,
                    sampling=replace(SAMPLING, max_tokens=1000, seed=i + 1),
                )
                silver.append(self.engine.submit(request))
            for stream in silver:
                await anext(stream)  # every silver conversation streams
        ttfts = []
        for i in range(GOLD_TRIALS):
            request = GenerationRequest(
                npc_id=f"guard-{load}-{i}",
                prompt=INTENT_PROMPT,
                priority=Priority.GOLD,
                json_schema=INTENT_SCHEMA,
                sampling=Sampling(max_tokens=24, temperature=0.0),
            )
            done = await self.engine.submit(request).collect()
            ttfts.append(done.timing.first_token_s or 0.0)
        for stream in silver:
            stream.cancel()
        return ttfts

    def close(self) -> None:
        self.engine.close()


# -- llama-server ----------------------------------------------------------------------------


def llama_server_binary(path: str | None) -> Path:
    """The server binary: `--server`, else the one `make llama-server` builds (built now if
    it is missing)."""
    if path:
        return Path(path)
    made = subprocess.run(
        ["make", "-s", "llama-server-path"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    binary = Path(made)
    if not binary.exists():
        subprocess.run(["make", "llama-server"], cwd=ROOT, check=True)
    return binary


class ServerSide:
    def __init__(self, binary: Path, model: Path, slots: int, threads: int, extra: list[str]):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.command = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(slots),
            # The same context per NPC as the engine's (`engine.n_ctx`, 2048).
            "--ctx-size",
            str(2048 * slots),
            "--threads",
            str(threads),
            "--threads-batch",
            str(threads),
            "--no-webui",
            *extra,
        ]
        # Its log goes to a file: a pipe nobody reads would fill up and stall it.
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by close()
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=self.log, text=True
        )
        self.url = f"http://127.0.0.1:{self.port}"
        # A new connection a request: a kept-alive one the server has just closed would fail
        # the next request ("disconnected without sending a response").
        limits = httpx.Limits(max_keepalive_connections=0)
        self.client = httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits)

    async def ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"llama-server exited: {self.log.read()[-2000:]}")
            try:
                if (await self.client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError("llama-server did not become ready in 120 s")

    async def complete(
        self, body: dict[str, Any], start: float, started: asyncio.Event | None = None
    ) -> tuple[int, float, int]:
        """Stream one completion: (tokens generated, first token seconds, prompt evaluated);
        `started` is set at its first token."""
        first = None
        tokens = evaluated = 0
        async with self.client.stream("POST", "/completion", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = json.loads(line[6:])
                if first is None:
                    first = time.perf_counter() - start
                    if started is not None:
                        started.set()
                if data.get("stop"):
                    timings = data.get("timings", {})
                    tokens = int(timings.get("predicted_n", 0))
                    evaluated = int(timings.get("prompt_n", 0))
        return tokens, first or 0.0, evaluated

    def body(self, tokens: list[int], seed: int, slot: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": tokens,
            "n_predict": MAX_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "cache_prompt": True,
            "samplers": ["penalties", "top_k", "top_p", "temperature"],
            "repeat_penalty": SAMPLING.repeat_penalty,
            "repeat_last_n": 64,
            "top_k": SAMPLING.top_k,
            "top_p": SAMPLING.top_p,
            "min_p": 0.0,
            "temperature": SAMPLING.temperature,
            "seed": seed,
        }
        if slot is not None:
            body["id_slot"] = slot
        return body

    async def turns(self, prompts: list[list[int]], slotted: bool) -> Outcome:
        start = time.perf_counter()
        done = await asyncio.gather(
            *(
                self.complete(self.body(p, i + 1, i if slotted else None), start)
                for i, p in enumerate(prompts)
            )
        )
        return Outcome(
            tokens=sum(d[0] for d in done),
            wall_s=time.perf_counter() - start,
            ttft_s=[d[1] for d in done],
            prompt_evaluated=sum(d[2] for d in done),
        )

    async def gold(self, silver_prompts: list[list[int]], gold_prompt: list[int]) -> list[float]:
        silver = []
        streaming = []
        for i, prompt in enumerate(silver_prompts):
            body = self.body(prompt, i + 1, None) | {"n_predict": 1000}
            streaming.append(asyncio.Event())
            silver.append(
                asyncio.ensure_future(self.complete(body, time.perf_counter(), streaming[-1]))
            )
        for event in streaming:
            await event.wait()  # every silver conversation streams
        ttfts = []
        for _ in range(GOLD_TRIALS):
            body = {
                "prompt": gold_prompt,
                "n_predict": 24,
                "temperature": 0.0,
                "json_schema": INTENT_SCHEMA,
                "stream": True,
                "cache_prompt": True,
            }
            _, first, _ = await self.complete(body, time.perf_counter())
            ttfts.append(first)
        for task in silver:
            task.cancel()
        await asyncio.gather(*silver, return_exceptions=True)
        return ttfts

    async def close(self) -> None:
        await self.client.aclose()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


# -- the run ---------------------------------------------------------------------------------


async def one_round(
    n: int, settings: EngineSettings, binary: Path, model: Path, threads: int, extra: list[str]
) -> dict[str, Any]:
    """Cold first turns and follow-ups of N NPCs on both sides; returns their rows."""
    firsts = first_turns(n)
    seconds = second_turns(firsts)
    mythic = MythicSide(settings, n)
    try:
        first_tokens = [mythic.tokens(m) for m in firsts]
        second_tokens = [mythic.tokens(m) for m in seconds]
        m_cold = await mythic.turns(firsts, "npc")
        m_follow = await mythic.turns(seconds, "npc")
    finally:
        mythic.close()
    server = ServerSide(binary, model, n, threads, extra)
    try:
        await server.ready()
        s_cold = await server.turns(first_tokens, slotted=True)
        s_follow = await server.turns(second_tokens, slotted=True)
    finally:
        await server.close()
    return {
        "cold": {"mythic": m_cold.row(), "llama_server": s_cold.row()},
        "follow": {"mythic": m_follow.row(), "llama_server": s_follow.row()},
    }


async def zone_round(
    n: int, settings: EngineSettings, binary: Path, model: Path, threads: int, extra: list[str]
) -> dict[str, Any]:
    convs = zone_turns(n)
    mythic = MythicSide(settings, n)
    try:
        tokens = [mythic.tokens(m) for m in convs]
        m_zone = await mythic.turns(convs, "zone")
    finally:
        mythic.close()
    server = ServerSide(binary, model, n, threads, extra)
    try:
        await server.ready()
        s_zone = await server.turns(tokens, slotted=True)
    finally:
        await server.close()
    shared = min(_common(tokens[0], t) for t in tokens[1:]) if n > 1 else 0
    return {
        "zone": {"mythic": m_zone.row(), "llama_server": s_zone.row()},
        "shared_prefix_tokens": shared,
    }


async def mixed_round(
    settings: EngineSettings, binary: Path, model: Path, threads: int, extra: list[str]
) -> dict[str, Any]:
    silver = first_turns(SILVER)
    mythic = MythicSide(settings, SILVER + 2)
    try:
        silver_tokens = [mythic.tokens(m) for m in silver]
        gold_tokens = mythic.engine.backend.tokenize(
            INTENT_PROMPT, add_special=True, parse_special=True
        )
        m_idle = await mythic.gold(0)
        m_load = await mythic.gold(SILVER)
    finally:
        mythic.close()
    server = ServerSide(binary, model, SILVER + 1, threads, extra)
    try:
        await server.ready()
        s_idle = await server.gold([], gold_tokens)
        s_load = await server.gold(silver_tokens, gold_tokens)
    finally:
        await server.close()
    return {
        "mythic": {"idle": _ttft(m_idle), "loaded": _ttft(m_load)},
        "llama_server": {"idle": _ttft(s_idle), "loaded": _ttft(s_load)},
    }


def _ttft(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {"p50_s": _pct(ordered, 0.5), "p95_s": _pct(ordered, 0.95)}


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _ratios(row: dict[str, Any]) -> dict[str, float | None]:
    m, s = row["mythic"], row["llama_server"]
    return {
        "tok_s": m["tok_s"] / s["tok_s"] if s["tok_s"] else None,
        "ttft_p50": m["ttft_p50_s"] / s["ttft_p50_s"] if s["ttft_p50_s"] else None,
        "prompt_evaluated": m["prompt_evaluated"] / s["prompt_evaluated"]
        if s["prompt_evaluated"]
        else None,
    }


def _median(rounds: list[dict[str, Any]], *keys: str) -> float | None:
    values = []
    for r in rounds:
        value: Any = r
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float):
            values.append(float(value))
    return statistics.median(values) if values else None


def _summary(rounds: list[dict[str, Any]], workload: str) -> dict[str, float | None]:
    """A workload's medians over the rounds: its ratios, and each side's figures."""
    out = {
        "tok_s_ratio": _median(rounds, workload, "ratio", "tok_s"),
        "ttft_p50_ratio": _median(rounds, workload, "ratio", "ttft_p50"),
    }
    for side in ("mythic", "llama_server"):
        for key in ("tok_s", "ttft_p50_s", "ttft_p95_s", "prompt_evaluated"):
            out[f"{side}_{key}"] = _median(rounds, workload, side, key)
    return out


def _table_row(n: str, workload: str, s: dict[str, Any]) -> tuple[str, ...]:
    return (
        n,
        workload,
        f"{s['mythic_tok_s']:.1f} / {s['llama_server_tok_s']:.1f}",
        f"{s['tok_s_ratio']:.2f}x",
        f"{s['mythic_ttft_p50_s']:.2f} / {s['llama_server_ttft_p50_s']:.2f}",
        f"{s['mythic_prompt_evaluated']:.0f} / {s['llama_server_prompt_evaluated']:.0f}",
    )


async def main_async(args: argparse.Namespace) -> None:
    settings = load_settings().engine
    threads = settings.n_threads or os.cpu_count() or 1
    binary = llama_server_binary(args.server)
    model = ModelStore(settings.models_dir).resolve(MODEL).path
    # The same KV cell type on both sides (`engine.kv_type`); `--server-arg` comes after.
    extra = ["--cache-type-k", settings.kv_type, "--cache-type-v", settings.kv_type]
    extra += args.server_arg or []
    if args.device == "cuda":
        settings = settings.model_copy(update={"n_gpu_layers": -1})
        extra = [*extra, "--n-gpu-layers", "999"]
    results: dict[str, Any] = {"n": {}, "zone": None, "mixed": None}
    table: list[tuple[str, ...]] = []
    earlier = _earlier_rounds(args.resume) if args.resume else {}
    reused = 0
    for n in args.n:
        rounds = []
        for r in range(args.rounds):
            if len(earlier.get(f"N={n}", [])) > r:
                rounds.append(earlier[f"N={n}"][r])
                reused += 1
                continue
            row = await one_round(n, settings, binary, model, threads, extra)
            for workload in ("cold", "follow"):
                row[workload]["ratio"] = _ratios(row[workload])
            rounds.append(row)
            print(f"N={n} round {r + 1}: {json.dumps(row)}", flush=True)
        summary = {workload: _summary(rounds, workload) for workload in ("cold", "follow")}
        results["n"][str(n)] = {"rounds": rounds, "median": summary}
        table += [_table_row(str(n), workload, summary[workload]) for workload in summary]
    if not args.skip_zone:
        rounds = earlier.get("zone", [])[: args.rounds]
        reused += len(rounds)
        for _ in range(args.rounds - len(rounds)):
            row = await zone_round(8, settings, binary, model, threads, extra)
            row["zone"]["ratio"] = _ratios(row["zone"])
            rounds.append(row)
            print(f"zone: {json.dumps(row)}", flush=True)
        results["zone"] = {"rounds": rounds, "npcs": 8, "median": _summary(rounds, "zone")}
        table.append(_table_row("8", "zone", results["zone"]["median"]))
    if not args.skip_mixed:
        rounds = earlier.get("mixed", [])[: args.rounds]
        reused += len(rounds)
        for _ in range(args.rounds - len(rounds)):
            row = await mixed_round(settings, binary, model, threads, extra)
            rounds.append(row)
            print(f"mixed: {json.dumps(row)}", flush=True)
        mixed = {
            side: {
                f"{state}_{q}": _median(rounds, side, state, q)
                for state in ("idle", "loaded")
                for q in ("p50_s", "p95_s")
            }
            for side in ("mythic", "llama_server")
        }
        for side in mixed.values():
            idle, loaded = side["idle_p95_s"], side["loaded_p95_s"]
            side["loaded_over_idle_p95"] = loaded / idle if idle and loaded else None
        results["mixed"] = {"rounds": rounds, "silver": SILVER, "median": mixed}
        for side, s in mixed.items():
            table.append(
                (
                    str(SILVER),
                    f"gold ({side})",
                    "",
                    f"p95 {s['loaded_over_idle_p95']:.2f}x idle",
                    f"{s['loaded_p50_s']:.2f} loaded / {s['idle_p50_s']:.2f} idle",
                    "",
                )
            )
    header = (
        "NPCs",
        "workload",
        "tok/s Mythic / llama-server",
        "ratio",
        "TTFT p50 s",
        "prompt evaluated",
    )
    widths = [max(len(r[i]) for r in (header, *table)) for i in range(len(header))]
    for row in (header, *table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    write_results(
        RESULTS,
        ROOT,
        results=results,
        model=MODEL,
        max_tokens=MAX_TOKENS,
        rounds=args.rounds,
        threads=threads,
        device=args.device,
        quick=args.quick,
        resumed_rounds=reused,
        llama_server_command=_describe(binary, model, threads, extra),
        engine_settings={
            "batch_invariant": settings.batch_invariant,
            "n_batch": settings.n_batch,
            "prefill_chunk": settings.prefill_chunk,
            "n_ctx": settings.n_ctx,
            "kv_type": settings.kv_type,
        },
    )


def _earlier_rounds(log: Path) -> dict[str, list[dict[str, Any]]]:
    """The rounds an earlier run printed (`--resume`): "N=8", "zone", "mixed" -> rows."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in log.read_text().splitlines():
        head, sep, body = line.partition(": ")
        if not sep or not body.startswith("{"):
            continue
        key = head.split(" round ")[0]
        if key.startswith("N=") or key in ("zone", "mixed"):
            found.setdefault(key, []).append(json.loads(body))
    return found


def _describe(binary: Path, model: Path, threads: int, extra: list[str]) -> str:
    return (
        f"{binary.name} -m {model.name} --parallel N --ctx-size 2048*N --threads {threads} "
        f"--threads-batch {threads} --no-webui {' '.join(extra)}".strip()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16, 32]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="N = 1, 4; one round")
    parser.add_argument("--server", help="a llama-server binary (default: make llama-server's)")
    parser.add_argument("--server-arg", action="append", help="one more llama-server argument")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--skip-zone", action="store_true")
    parser.add_argument("--skip-mixed", action="store_true")
    parser.add_argument(
        "--resume",
        type=Path,
        help="the output of an earlier run of this bench that stopped part-way: its printed "
        "rounds are taken as they are, the rest measured (the file records how many)",
    )
    args = parser.parse_args()
    if args.quick:
        args.n, args.rounds = [1, 4], 1
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
