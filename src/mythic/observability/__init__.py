"""What Mythic measures about itself: the statistics its stats, metrics and tools report, and
a trace per turn (OpenTelemetry: `Traces`; the SDK is needed only to build one).

Base layer: imports nothing from mythic but its errors, so the engine, the server and the CLI
share it.
"""

from mythic.observability._stats import percentile
from mythic.observability._tracing import (
    Hop,
    Traces,
    TurnTrace,
    current,
    hop,
    hop_of,
    playing,
    traced,
)

__all__ = [
    "Hop",
    "Traces",
    "TurnTrace",
    "current",
    "hop",
    "hop_of",
    "percentile",
    "playing",
    "traced",
]
