"""Routing: tiers (gold, silver, bronze), endpoints (the embedded engine, remote
OpenAI-compatible servers), health checks, circuit breakers, fallback to a canned line, usage
accounting. The bronze job queue and its workers are `mythic.jobs`.

Importing this package loads no model and opens no connection.
"""

from mythic.route._breaker import Breaker, BreakerState
from mythic.route._build import engine_sizes, local_router, open_router, resolve_model
from mythic.route._canned import CANNED_LINES, canned_line
from mythic.route._endpoints import (
    EmbeddedEndpoint,
    Endpoint,
    EndpointError,
    EndpointRejectedError,
    OpenAIEndpoint,
)
from mythic.route._policy import TIER_ORDER, RouteDecision, TierPolicy, UnknownKindError
from mythic.route._router import NoEndpointError, RoutedStream, Router, Usage

__all__ = [
    "CANNED_LINES",
    "TIER_ORDER",
    "Breaker",
    "BreakerState",
    "EmbeddedEndpoint",
    "Endpoint",
    "EndpointError",
    "EndpointRejectedError",
    "NoEndpointError",
    "OpenAIEndpoint",
    "RouteDecision",
    "RoutedStream",
    "Router",
    "TierPolicy",
    "UnknownKindError",
    "Usage",
    "canned_line",
    "engine_sizes",
    "local_router",
    "open_router",
    "resolve_model",
]
