"""Bronze workers: claim a job, generate its artifact on the bronze tier, store it.

A worker renews its lease while the model works; if it dies, the lease runs out and another
worker gets the job. The artifact reaches the dialogue through the store: whoever follows the
artifacts (the server's `ArtifactFollower`) adds them to the NPCs' knowledge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mythic._errors import MythicError
from mythic.config import JobSettings
from mythic.engine import ChatMessage, GenerationRequest, Priority, Sampling
from mythic.jobs._queue import (
    REQUEST_KIND_OF_JOB,
    Artifact,
    Job,
    JobError,
    JobQueue,
    JobStoreError,
    validate_job,
)
from mythic.knowledge import Knowledge, LoreDoc, World
from mythic.route import Router

log = logging.getLogger(__name__)


class UnusableOutputError(MythicError):
    """The model's output cannot be used (too short, not the outline's JSON); retried."""

    retryable = True


QUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 3, "maxLength": 60},
        "hook": {"type": "string", "minLength": 10, "maxLength": 300},
        "steps": {
            "type": "array",
            "items": {"type": "string", "minLength": 3, "maxLength": 160},
            "minItems": 2,
            "maxItems": 4,
        },
        "reward": {"type": "string", "minLength": 2, "maxLength": 120},
    },
    "required": ["title", "hook", "steps", "reward"],
    "additionalProperties": False,
}


def check_world_refs(payload: dict[str, Any], world: World) -> None:
    """Raise `JobError` when a job names an NPC or a zone the world does not have."""
    npc_id = payload.get("npc_id")
    if npc_id is not None and npc_id not in world.npcs:
        raise JobError(f"no NPC {npc_id!r} in world {world.name!r}")
    zone = payload.get("zone")
    if zone is not None and zone not in world.card.zones:
        raise JobError(f"no zone {zone!r} in world {world.name!r}")


def artifact_doc(artifact: Artifact, world: World) -> LoreDoc:
    """The lore document an artifact becomes: in its zone (an NPC's artifact: the NPC's
    zone), tagged with its kind and NPC so retrieval favours it for that NPC."""
    zone = artifact.zone
    if zone is None and artifact.npc_id in world.npcs:
        zone = world.npcs[artifact.npc_id].zone
    tags = tuple(t for t in (artifact.kind, artifact.npc_id) if t)
    return LoreDoc(
        zone=zone,
        title=artifact.title,
        text=artifact.text,
        path=Path("bronze") / f"{artifact.job_id}.md",
        tags=tags,
    )


class JobWorker:
    """Runs jobs from `queue` on the router's bronze tier until cancelled."""

    def __init__(
        self,
        queue: JobQueue,
        router: Router,
        world: Callable[[], World],
        settings: JobSettings,
        *,
        name: str | None = None,
        on_done: Callable[[Job, Artifact], None] | None = None,
    ) -> None:
        self.queue = queue
        self.router = router
        self.world = world
        self.settings = settings
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.on_done = on_done
        self.counts: Counter[str] = Counter()
        """Attempts by outcome: done, retried, dead, lost (the lease went to another worker)."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A job was queued: look now instead of at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                job = await self.queue.claim(self.name)
            except JobStoreError as exc:
                log.warning("worker %s: %s", self.name, exc)
                job = None
            if job is None:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.poll_s):
                        await self._wake.wait()
                continue
            await self.work(job)

    async def run_once(self) -> Job | None:
        """Claim and work one job, if one is due; the job as claimed."""
        job = await self.queue.claim(self.name)
        if job is not None:
            await self.work(job)
        return job

    async def work(self, job: Job) -> str:
        """Work one claimed job; its outcome (done, retried, dead, lost)."""
        beat = asyncio.create_task(self._heartbeat(job), name=f"lease-{job.job_id}")
        try:
            try:
                artifact = await self.make(job)
            except JobError as exc:
                outcome = await self._failed(job, str(exc), permanent=True)
            except MythicError as exc:
                outcome = await self._failed(job, f"{type(exc).__name__}: {exc}")
            else:
                if await self.queue.complete(job, artifact):
                    outcome = "done"
                    if self.on_done is not None:
                        self.on_done(job, artifact)
                else:
                    outcome = "lost"
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        self.counts[outcome] += 1
        log.info("job %s (%s, attempt %d): %s", job.job_id, job.kind, job.attempts, outcome)
        return outcome

    async def _failed(self, job: Job, error: str, *, permanent: bool = False) -> str:
        log.warning("job %s attempt %d failed: %s", job.job_id, job.attempts, error)
        status = await self.queue.fail(job, error, permanent=permanent)
        return {"queued": "retried", "dead": "dead"}.get(status or "", "lost")

    async def _heartbeat(self, job: Job) -> None:
        interval = self.settings.visibility_timeout_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.queue.extend(job):
                    log.warning("job %s: lease lost to another worker", job.job_id)
                    return
            except JobStoreError as exc:
                log.warning("job %s: lease not renewed: %s", job.job_id, exc)

    # -- making artifacts ----------------------------------------------------------------------

    async def make(self, job: Job) -> Artifact:
        """Generate the job's artifact on its tier.

        Raises:
            JobError: the job cannot be done (bad payload, unknown NPC): not retried.
            RequestError: no endpoint answered, or the output was unusable: retried.
        """
        payload = validate_job(job.kind, job.payload)
        world = self.world()
        check_world_refs(payload, world)
        npc_id = payload.get("npc_id")
        zone = payload.get("zone")
        system, user, schema = _prompt(job.kind, payload, world)
        request = GenerationRequest(
            npc_id=npc_id or "_bronze",
            session_id=f"job/{job.job_id}",
            messages=[ChatMessage("system", system), ChatMessage("user", user)],
            priority=Priority.BRONZE,
            json_schema=schema,
            sampling=Sampling(max_tokens=self.settings.max_tokens, temperature=0.7),
        )
        archetype = world.npcs[npc_id].archetype if npc_id else None
        done = await self.router.complete(
            request, REQUEST_KIND_OF_JOB[job.kind], archetype=archetype
        )
        text = done.text.strip()
        if job.kind == "quest":
            text, title = _quest_text(text)
        else:
            title = payload.get("topic") or payload.get("title") or job.kind
        if len(text) < 20:
            raise UnusableOutputError(f"the model's {job.kind} was too short to use: {text!r}")
        return Artifact(
            job_id=job.job_id,
            kind=job.kind,
            title=str(title),
            text=text,
            zone=zone,
            npc_id=npc_id,
        )


def _prompt(
    kind: str, payload: dict[str, Any], world: World
) -> tuple[str, str, dict[str, Any] | None]:
    card = world.card
    premise = f"The video game world {card.name}: {card.description}"
    zone = payload.get("zone")
    where = ""
    if zone:
        z = card.zones[zone]
        where = f" It takes place in {z.name}: {z.description}"
    hint = f" Notes: {payload['hint']}" if payload.get("hint") else ""
    npc = world.npcs.get(payload.get("npc_id") or "")
    who = f" It concerns {npc.name}, a {npc.archetype}." if npc else ""
    if kind == "lore":
        return (
            f"You write lore for a game. {premise}",
            f'Write a lore entry titled "{payload["topic"]}": 3 to 5 sentences of concrete '
            f"facts (names, places, what happened), no preamble.{where}{who}{hint}",
            None,
        )
    if kind == "quest":
        assert npc is not None
        return (
            f"You design quests for a game. {premise}",
            f"Outline a short quest that {npc.name} ({npc.archetype}; {npc.style}) offers "
            f"the player: a title, a hook in {npc.name}'s words, 2 to 4 steps and a "
            f"reward.{hint}",
            QUEST_SCHEMA,
        )
    assert npc is not None
    return (
        f"You keep the memories of {npc.name}, a {npc.archetype}. {premise}",
        "Summarize what happened, in 2 to 4 sentences, as facts "
        f"{npc.name} remembers:\n\n{payload['text']}",
        None,
    )


def _quest_text(output: str) -> tuple[str, str]:
    """The quest outline as lore text, and its title.

    Raises:
        UnusableOutputError: the output is not the outline's JSON (cut short).
    """
    try:
        data = json.loads(output)
        title = str(data["title"]).strip()
        steps = " ".join(f"{i}. {str(step).strip()}" for i, step in enumerate(data["steps"], 1))
        text = (
            f"Quest: {title}. {str(data['hook']).strip()} Steps: {steps} "
            f"Reward: {str(data['reward']).strip()}."
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise UnusableOutputError(f"the quest outline is not valid JSON: {exc}") from None
    return text, f"Quest: {title}"


class ArtifactFollower:
    """Adds the artifacts bronze workers store (in this process or any other) to the NPCs'
    knowledge: all of them at start, then each new one. An artifact is applied once."""

    def __init__(self, queue: JobQueue, knowledge: Knowledge, *, poll_s: float = 1.0) -> None:
        self.queue = queue
        self.knowledge = knowledge
        self.poll_s = poll_s
        self.seq = 0
        self.applied: dict[str, int] = {}
        """Job id -> artifact sequence number, for every artifact in the knowledge."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def catch_up(self) -> int:
        """Apply every artifact stored since the last call; how many."""
        count = 0
        while True:
            artifacts = await self.queue.artifacts(self.seq, limit=500)
            if not artifacts:
                return count
            world = self.knowledge.world
            docs = [artifact_doc(a, world) for a in artifacts if a.job_id not in self.applied]
            if docs:
                await asyncio.to_thread(self.knowledge.add_documents, docs)
            for a in artifacts:
                self.applied[a.job_id] = a.seq
            self.seq = artifacts[-1].seq
            count += len(docs)

    async def run(self) -> None:
        while True:
            try:
                await self.catch_up()
            except MythicError as exc:
                log.warning("artifacts not applied yet: %s", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()
