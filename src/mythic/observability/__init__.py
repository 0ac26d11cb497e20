"""What Mythic measures about itself: the statistics its stats, metrics and tools report.

Base layer: imports nothing from mythic, so the engine, the server and the CLI share it.
"""

from mythic.observability._stats import percentile

__all__ = ["percentile"]
