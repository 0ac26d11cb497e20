"""The server's bronze work: the job queue, the workers that run its jobs, and the follower
that hands their artifacts to the NPCs' knowledge."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mythic.config import JobSettings
from mythic.jobs import (
    Artifact,
    ArtifactFollower,
    Job,
    JobQueue,
    JobWorker,
    check_world_refs,
    validate_job,
)
from mythic.knowledge import Knowledge, World
from mythic.route import Router


class JobBoard:
    """Bronze jobs of one server: `settings.workers` workers on `queue` and one artifact
    follower, run as tasks of the gateway's task group (`start`)."""

    def __init__(
        self,
        queue: JobQueue,
        router: Router,
        knowledge: Knowledge,
        world: Callable[[], World],
        settings: JobSettings,
    ) -> None:
        self.queue = queue
        self.world = world
        self.follower = ArtifactFollower(queue, knowledge, poll_s=settings.poll_s)
        self.workers = [
            JobWorker(queue, router, world, settings, name=f"server-{i}", on_done=self._done)
            for i in range(settings.workers)
        ]

    def _done(self, _job: Job, _artifact: Artifact) -> None:
        self.follower.wake()

    def start(self, tasks: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Run the follower and the workers in `tasks` until cancelled."""
        started = [tasks.create_task(self.follower.run(), name="mythic-artifacts")]
        for i, worker in enumerate(self.workers):
            started.append(tasks.create_task(worker.run(), name=f"mythic-worker-{i}"))
        return started

    async def submit(self, kind: str, payload: object, job_id: str | None) -> dict[str, Any]:
        """Queue a bronze job (idempotent by `job_id`) and wake a worker.

        Raises:
            JobError: unknown kind, invalid payload, or an NPC or zone the world lacks.
            JobStoreError: the queue cannot be reached.
        """
        data = validate_job(kind, payload)
        check_world_refs(data, self.world())
        job, created = await self.queue.submit(kind, data, job_id=job_id)
        for worker in self.workers:
            worker.wake()
        return {**self.status(job, None), "created": created}

    def status(self, job: Job, artifact: Artifact | None) -> dict[str, Any]:
        """A job as the API shows it: with its artifact and whether the NPCs know it yet."""
        return {
            **job.to_dict(),
            "artifact": artifact.to_dict() if artifact else None,
            "applied": job.job_id in self.follower.applied,
        }
