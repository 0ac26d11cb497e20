"""What every benchmark writes: its numbers, with the machine they were measured on."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def write_results(path: Path, root: Path, *, results: Any, **fields: Any) -> None:
    """Write `fields`, the machine, the time and `results` to `path` as JSON, and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        **fields,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "unix_time": int(time.time()),
        "results": results,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path.relative_to(root)}")
