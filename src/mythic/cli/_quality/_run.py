"""Running the plan through a real server on loopback, one configuration after another."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mythic._errors import MythicError
from mythic.cli._eval import _post
from mythic.cli._quality._judge import Reply, conversation_stats, judge
from mythic.cli._quality._probe import NPCPlan, Plan, Probe
from mythic.cli._quality._templates import Configuration
from mythic.config import MythicSettings
from mythic.knowledge import World


@dataclass(slots=True)
class ConfigRun:
    """The replies of one configuration."""

    name: Configuration
    settings: dict[str, Any]
    replies: dict[str, list[Reply]]
    conversations: dict[str, dict[str, Any]]
    seconds: float
    ambient: list[dict[str, Any]] = field(default_factory=list)
    """Per scene of the scene check, its ambient exchange (`ambient_stats`)."""


OnReply = Callable[[Configuration, str, Reply, int, int], None]
"""(configuration, npc, reply, number within its check, probes of the check)."""


def quality_settings(
    settings: MythicSettings, name: Configuration, *, seed: int, no_adapters: Path
) -> MythicSettings:
    """The settings of one configuration. Both: memory off, no file watcher, no voice, no
    background warm-up, no adapter training, a fixed seed. `baseline` also: retrieval off, no
    adapters (`no_adapters`: an empty registry), the reply filter and the catchphrase greeting
    off when there are such settings; `base` only no adapters."""
    knowledge: dict[str, Any] = {"watch": False}
    archetypes: dict[str, Any] = {"provision": "off"}
    dialogue: dict[str, Any] = {}
    if name in ("baseline", "base"):
        archetypes["registry"] = str(no_adapters)
    if name == "baseline":
        knowledge["retrieval"] = "off"
        for switch in ("line_filter", "greet_with_catchphrase"):
            if switch in type(settings.dialogue).model_fields:
                dialogue[switch] = False
    return settings.model_copy(
        update={
            "engine": settings.engine.model_copy(update={"seed": seed}),
            "knowledge": settings.knowledge.model_copy(update=knowledge),
            "memory": settings.memory.model_copy(update={"enabled": False}),
            "server": settings.server.model_copy(update={"warm_npcs": 0}),
            "speech": settings.speech.model_copy(update={"enabled": False}),
            "archetypes": settings.archetypes.model_copy(update=archetypes),
            "dialogue": settings.dialogue.model_copy(update=dialogue),
        }
    )


def _summary(settings: MythicSettings, world: World, name: Configuration) -> dict[str, Any]:
    registry = settings.archetypes.registry
    if registry is None and (world.path / "archetypes.yaml").is_file():
        registry = "<world>/archetypes.yaml"
    if name in ("baseline", "base"):
        registry = "none (an empty registry)"
    return {
        "retrieval": settings.knowledge.retrieval,
        "adapters": registry or "none (no registry)",
        "line_filter": getattr(settings.dialogue, "line_filter", None),
        "greet_with_catchphrase": getattr(settings.dialogue, "greet_with_catchphrase", None),
        "decide": settings.dialogue.decide,
        "seed": settings.engine.seed,
        "chat": settings.chat.model_dump(mode="json"),
    }


def _get(url: str, timeout: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            data: dict[str, Any] = json.loads(answer.read())
            return data
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MythicError(f"{url}: {exc}") from None


async def run_quality(
    settings: MythicSettings,
    plan: Plan,
    configurations: Sequence[Configuration],
    *,
    seed: int = 0,
    parallel: int = 2,
    on_reply: OnReply | None = None,
    contexts: bool = False,
) -> tuple[list[ConfigRun], str]:
    """Serve the world once per configuration on one loaded engine and run every probe of the
    plan; returns the runs and the model's name. `parallel` NPCs are served at once (one
    line at a time each). `contexts`: each reply keeps the lore and scene its line was told
    with (`Reply.context`; one more request per line).

    Raises:
        ModelError: the model cannot be loaded.
    """
    from mythic.engine import Engine
    from mythic.server import Gateway, serving

    engine_settings = settings.engine.model_copy(update={"seed": seed})
    engine = await asyncio.to_thread(Engine.load, engine_settings)
    model = engine.backend.name
    # Lines asked in a fresh conversation each need no decision: over HTTP no tool is
    # called, and the intent only steers the retrieval of the conversation's next line. They
    # are served without one (the same replies, faster); the actions and the long
    # conversation with the configured `dialogue.decide`.
    phases = [
        [c for c in plan.checks if c not in ("actions", "long_conversation")],
        [c for c in plan.checks if c in ("actions", "long_conversation")],
    ]
    if not settings.dialogue.decide:
        phases = [list(plan.checks)]
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="mythic-quality-") as tmp:
            for name in configurations:
                run = quality_settings(
                    settings, name, seed=seed, no_adapters=Path(tmp) / "no-adapters.yaml"
                )
                started = time.perf_counter()
                replies: dict[str, list[Reply]] = {n.npc: [] for n in plan.npcs}
                conversations: dict[str, dict[str, Any]] = {}
                for checks in phases:
                    if not any(_has_work(npc, checks) for npc in plan.npcs):
                        continue
                    served = run
                    if "actions" not in checks and "long_conversation" not in checks:
                        served = run.model_copy(
                            update={"dialogue": run.dialogue.model_copy(update={"decide": False})}
                        )
                    gateway = await asyncio.to_thread(Gateway, served, plan.world, engine)
                    gate = asyncio.Semaphore(max(1, parallel))
                    async with serving(gateway) as (host, port), asyncio.TaskGroup() as tasks:
                        for npc in plan.npcs:
                            npc_run = _NPCRun(plan, npc, name, f"{host}:{port}", on_reply, contexts)
                            tasks.create_task(
                                npc_run.run(gate, checks, replies[npc.npc], conversations)
                            )
                ambient = await _scenes(run, plan, engine, replies, name, on_reply)
                runs.append(
                    ConfigRun(
                        name,
                        _summary(run, plan.world, name),
                        replies,
                        conversations,
                        time.perf_counter() - started,
                        ambient,
                    )
                )
    finally:
        engine.close()
    return runs, model


async def _scenes(
    run: MythicSettings,
    plan: Plan,
    engine: Any,
    replies: dict[str, list[Reply]],
    name: Configuration,
    on_reply: OnReply | None,
) -> list[dict[str, Any]]:
    """The scene check on a server of its own: no decisions, NPCs answering only the
    player's lines (each scene's `max_exchanges` 0), then the ambient exchanges."""
    from mythic.cli._quality._scenes import SceneRun
    from mythic.server import Gateway, serving

    if "scenes" not in plan.checks or not plan.scenes:
        return []
    served = run.model_copy(update={"dialogue": run.dialogue.model_copy(update={"decide": False})})
    gateway = await asyncio.to_thread(Gateway, served, plan.world, engine)
    counts: dict[str, int] = {}

    def told(npc_id: str, reply: Reply) -> None:
        counts[npc_id] = counts.get(npc_id, 0) + 1
        if on_reply is not None:
            on_reply(name, npc_id, reply, counts[npc_id], counts[npc_id])

    async with serving(gateway) as (host, port):
        return await SceneRun(f"{host}:{port}", plan, told).run(plan.scenes, replies)


def _has_work(npc: NPCPlan, checks: Sequence[str]) -> bool:
    return any(npc.probes.get(c) for c in checks) or (
        "long_conversation" in checks and bool(npc.conversation)
    )


@dataclass(slots=True)
class _NPCRun:
    plan: Plan
    npc: NPCPlan
    config: Configuration
    address: str
    on_reply: OnReply | None
    contexts: bool = False
    """Each fresh line's reply keeps its `context` (the NPC's status, read after it)."""

    async def run(
        self,
        gate: asyncio.Semaphore,
        checks: Sequence[str],
        out: list[Reply],
        conversations: dict[str, dict[str, Any]],
    ) -> None:
        async with gate:
            for check in checks:
                probes = self.npc.probes.get(check, [])
                if check == "actions":
                    out += await self._actions(probes)
                elif check == "long_conversation" and self.npc.conversation:
                    said = await self.scripted_conversation(self.npc.conversation)
                    conversations[self.npc.npc] = conversation_stats(said)
                    out += said
                else:
                    for number, probe in enumerate(probes, 1):
                        out.append(self._done(await self._say(probe), number, len(probes)))

    def _done(self, reply: Reply, number: int, of: int) -> Reply:
        judge(reply, self.npc, self.plan)
        if self.on_reply is not None:
            self.on_reply(self.config, self.npc.npc, reply, number, of)
        return reply

    async def _say(self, probe: Probe, session: str | None = None) -> Reply:
        """One line over HTTP (`POST /v1/npcs/{id}/say`); a failure is the probe's error."""
        url = f"http://{self.address}/v1/npcs/{probe.npc}/say"
        body: dict[str, Any] = {"text": probe.question}
        if session is not None:
            body["session_id"] = session
        start = time.perf_counter()
        try:
            answer = await asyncio.to_thread(_post, url, body, 300)
        except MythicError as exc:
            return Reply(probe, "", time.perf_counter() - start, error=str(exc))
        reply = Reply(probe, str(answer.get("text", "")), time.perf_counter() - start)
        reply.intent = answer.get("intent")
        reply.caught = [str(c) for c in answer.get("caught") or []]
        if answer.get("finish_reason") == "error":
            reply.error = "the turn ended with an error"
        if self.contexts and session is None:
            # The NPC says one line at a time here: its last context is this line's.
            status_url = f"http://{self.address}/v1/npcs/{probe.npc}"
            try:
                status = await asyncio.to_thread(_get, status_url, 30)
            except MythicError as exc:
                reply.error = reply.error or f"status: {exc}"
                return reply
            last = status.get("last_turn") or {}
            context = status.get("context")
            if last.get("turn_id") == answer.get("turn_id") and isinstance(context, str):
                reply.context = context
        return reply

    async def scripted_conversation(self, script: list[Probe]) -> list[Reply]:
        session = f"quality-{self.config}-{self.npc.npc}"[:64]
        return [
            self._done(await self._say(probe, session), n, len(script))
            for n, probe in enumerate(script, 1)
        ]

    async def _actions(self, probes: list[Probe]) -> list[Reply]:
        """The action probes over WebSocket, tools offered: every `ToolCall` is acknowledged
        `ok`, as a game that did it would."""
        from mythic.client import MythicClient, ToolResult
        from mythic.contracts import ToolCall

        if not probes:
            return []

        async def did_it(call: ToolCall) -> ToolResult:
            del call
            return "ok", None

        out: list[Reply] = []
        client = MythicClient(
            f"ws://{self.address}/v1/ws", tool_handler=did_it, timeout_s=300, reconnect=False
        )
        try:
            await client.connect()
        except (MythicError, OSError, TimeoutError) as exc:
            for n, probe in enumerate(probes, 1):
                out.append(
                    self._done(Reply(probe, "", 0.0, error=f"connect: {exc!r}"), n, len(probes))
                )
            return out
        try:
            await client.scene(self.npc.npc, zone=self.npc.persona.zone, objects={"player": 1.5})
            for n, probe in enumerate(probes, 1):
                out.append(self._done(await self._act(client, probe), n, len(probes)))
        finally:
            await client.aclose()
        return out

    async def _act(self, client: Any, probe: Probe) -> Reply:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(300):
                turn = await client.say(probe.npc, probe.question)
                text = await turn.reply()
            status = await asyncio.to_thread(_get, f"http://{self.address}/v1/npcs/{probe.npc}", 30)
        except (MythicError, OSError, TimeoutError) as exc:
            return Reply(probe, "", time.perf_counter() - start, error=repr(exc))
        reply = Reply(probe, text.strip(), time.perf_counter() - start)
        last = status.get("last_turn") or {}
        if last.get("turn_id") == turn.turn_id:
            reply.intent = last.get("intent")
            reply.tool_calls = list(last.get("tool_calls") or [])
            reply.caught = [str(c) for c in last.get("caught") or []]
        if not reply.tool_calls:
            reply.tool_calls = [
                {"name": c.name, "args": c.args, "status": None} for c in turn.tool_calls
            ]
        if turn.errors:
            reply.error = "; ".join(f"{e.code}: {e.message}" for e in turn.errors)
        return reply
