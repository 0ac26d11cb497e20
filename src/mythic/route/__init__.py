"""Routing: tiers (gold, silver, bronze), endpoints (the embedded engine, remote
OpenAI-compatible servers), health checks, circuit breakers, fallback to a canned line, usage
accounting, and the durable bronze job queue with its workers.

Importing this package loads no model and opens no connection.
"""

from mythic.route._breaker import Breaker, BreakerState
from mythic.route._build import local_router, open_router, resolve_model
from mythic.route._canned import CANNED_LINES, canned_line
from mythic.route._endpoints import (
    EmbeddedEndpoint,
    Endpoint,
    EndpointError,
    EndpointRejectedError,
    OpenAIEndpoint,
)
from mythic.route._jobs import (
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
from mythic.route._policy import TIER_ORDER, RouteDecision, TierPolicy, UnknownKindError
from mythic.route._router import NoEndpointError, RoutedStream, Router, Usage
from mythic.route._worker import (
    ArtifactFollower,
    JobWorker,
    UnusableOutputError,
    artifact_doc,
    check_world_refs,
)

__all__ = [
    "CANNED_LINES",
    "JOB_KINDS",
    "TIER_ORDER",
    "Artifact",
    "ArtifactFollower",
    "Breaker",
    "BreakerState",
    "EmbeddedEndpoint",
    "Endpoint",
    "EndpointError",
    "EndpointRejectedError",
    "Job",
    "JobError",
    "JobQueue",
    "JobStatus",
    "JobStoreError",
    "JobWorker",
    "NoEndpointError",
    "OpenAIEndpoint",
    "RouteDecision",
    "RoutedStream",
    "Router",
    "TierPolicy",
    "UnknownKindError",
    "UnusableOutputError",
    "Usage",
    "artifact_doc",
    "canned_line",
    "check_world_refs",
    "local_router",
    "open_queue",
    "open_router",
    "resolve_model",
    "validate_job",
]
