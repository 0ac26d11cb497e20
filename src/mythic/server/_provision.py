"""Provisioning on first use (`archetypes.provision: first_use`).

When the chain router first serves an NPC whose archetype has no adapter for a task, the
server starts `mythic archetypes provision` for it in a separate process at the lowest CPU
priority: curate, train, evaluate against the base, register if the gate passes. The game is
never blocked: the base model serves meanwhile, and the registry is reread when the process
ends, so the next request routes to the new adapter. One process at a time; each (archetype,
task) is attempted once per server run; a failure is logged with the process's last lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mythic.archetypes import ChainRouter

log = logging.getLogger(__name__)

TAIL_LINES = 20


@dataclass(slots=True)
class ProvisionRun:
    """One provisioning process's outcome."""

    archetype: str
    task: str
    returncode: int
    tail: list[str] = field(default_factory=list)

    @property
    def registered(self) -> bool:
        return self.returncode == 0


class Provisioner:
    """Runs `mythic archetypes provision` for (archetype, task) pairs the router reports
    missing, one process at a time, and rereads the registry after each.

    Args:
        chains: the router whose `on_missing` feeds this and whose registry is reread.
        world: the world folder the adapters are curated from.
        registry: where the process registers (the router's registry).
        steps: training steps per task.
        extra_args: more command-line arguments for the process (`--model`, `--config`).
        nice: added to the process's niceness (19: only idle CPU).
    """

    def __init__(
        self,
        chains: ChainRouter,
        world: Path,
        registry: str,
        *,
        steps: int,
        extra_args: Sequence[str] = (),
        nice: int = 19,
        on_done: Callable[[ProvisionRun], None] | None = None,
    ) -> None:
        self.chains = chains
        self.world = world
        self.registry = registry
        self.steps = steps
        self.extra_args = tuple(extra_args)
        self.nice = nice
        self.on_done = on_done
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.seen: set[tuple[str, str]] = set()
        self.runs: list[ProvisionRun] = []
        chains.on_missing = self.request

    def request(self, archetype: str, task: str) -> None:
        """Queue a pair (called synchronously by the router on the request path: no I/O)."""
        if task not in ("dialogue_style", "action_policy") or (archetype, task) in self.seen:
            return
        self.seen.add((archetype, task))
        self.queue.put_nowait((archetype, task))
        log.info("provisioning %s %s on first use (queued)", archetype, task)

    def command(self, archetype: str, task: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mythic",
            "archetypes",
            "provision",
            archetype,
            "--world",
            str(self.world),
            "--tasks",
            task,
            "--registry",
            self.registry,
            "--steps",
            str(self.steps),
            *self.extra_args,
        ]

    async def run(self) -> None:
        """Work the queue until cancelled (a task of the app's task group)."""
        while True:
            archetype, task = await self.queue.get()
            outcome = await self._provision(archetype, task)
            self.runs.append(outcome)
            if outcome.registered:
                log.info("provisioned %s %s: registered", archetype, task)
            else:
                log.warning(
                    "provisioning %s %s ended with status %d (the base model keeps serving):\n%s",
                    archetype,
                    task,
                    outcome.returncode,
                    "\n".join(outcome.tail),
                )
            try:
                await self.chains.refresh()
            except Exception:  # a registry outage must not end the loop: the next reread helps
                log.exception("rereading the registry after provisioning failed")
            if self.on_done is not None:
                self.on_done(outcome)

    async def _provision(self, archetype: str, task: str) -> ProvisionRun:
        nice = self.nice

        def lower_priority() -> None:  # runs in the child before exec
            os.nice(nice)

        process = await asyncio.create_subprocess_exec(
            *self.command(archetype, task),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=lower_priority if os.name == "posix" else None,
        )
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            assert process.stdout is not None
            async for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    tail.append(line)
            returncode = await process.wait()
        except asyncio.CancelledError:
            process.kill()
            await process.wait()
            raise
        return ProvisionRun(archetype, task, returncode, list(tail))
