"""What every benchmark writes: its numbers, with the machine they were measured on."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any


def write_results(
    path: Path, root: Path, *, results: Any, quiet: bool = False, **fields: Any
) -> None:
    """Write `fields`, the machine, the time and `results` to `path` as JSON, and say so
    (unless `quiet`). The file is replaced whole: a bench stopped while writing leaves the
    previous one.

    Where `MYTHIC_BENCH_RESULTS` names a folder, the file goes there instead (`make bench`'s
    small runs: bench/results/ keeps the full runs the README cites).
    """
    folder = os.environ.get("MYTHIC_BENCH_RESULTS")
    if folder:
        path = Path(folder).resolve() / path.name
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        **fields,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            **cpu(),
        },
        "unix_time": int(time.time()),
        "results": results,
    }
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    partial.replace(path)
    if not quiet:
        print(f"wrote {path.relative_to(root) if path.is_relative_to(root) else path}")


def cpu() -> dict[str, Any]:
    """The processor's model and its vector instructions: llama.cpp and CTranslate2 use AVX-512
    where it is (bench/voice.py's first audio was 1.7x slower on an AVX2-only machine of the
    same 2 cores: voice_turn_avx2.json against voice_turn.json), so numbers from machines
    without the same are not compared."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    return {"cpu": model, "avx512": "avx512f" in flags, "avx2": "avx2" in flags}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def latency(samples: list[float], scale: float) -> dict[str, Any]:
    """p50/p95/p99/max/mean of `samples` (seconds or ns) times `scale`."""
    scaled = [s * scale for s in samples]
    return {
        "n": len(scaled),
        "p50": pct(scaled, 0.5),
        "p95": pct(scaled, 0.95),
        "p99": pct(scaled, 0.99),
        "max": max(scaled) if scaled else None,
        "mean": statistics.fmean(scaled) if scaled else None,
    }
