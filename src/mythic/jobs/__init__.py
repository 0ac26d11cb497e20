"""Bronze jobs: the durable queue (lore, quests, summaries; at-least-once, leased, retried,
dead-lettered) on SQLite or PostgreSQL, and the workers that run each job through the router's
bronze tier and store its artifact, which `ArtifactFollower` adds to the NPCs' knowledge.

The queue imports nothing above the stores; only the workers use the router.
Importing this package loads no model and opens no connection.
"""

from mythic.jobs._queue import (
    JOB_KINDS,
    Artifact,
    Job,
    JobError,
    JobQueue,
    JobStatus,
    JobStoreError,
    open_queue,
    validate_job,
)
from mythic.jobs._worker import (
    ArtifactFollower,
    JobWorker,
    UnusableOutputError,
    artifact_doc,
    check_world_refs,
)

__all__ = [
    "JOB_KINDS",
    "Artifact",
    "ArtifactFollower",
    "Job",
    "JobError",
    "JobQueue",
    "JobStatus",
    "JobStoreError",
    "JobWorker",
    "UnusableOutputError",
    "artifact_doc",
    "check_world_refs",
    "open_queue",
    "validate_job",
]
