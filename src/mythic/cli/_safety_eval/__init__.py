"""`mythic eval safety`: the red-team set and the ordinary probes through a real server, with
the guardrails and without, and the guard's cost per phrase."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mythic._errors import MythicError
from mythic.cli._console import err, out
from mythic.cli._quality._scorecard import code_version
from mythic.cli._safety_eval._redteam import REDTEAM, RedTeamProbe
from mythic.cli._safety_eval._run import TARGETS, judge_text, run_safety
from mythic.config import MythicSettings

__all__ = ["REDTEAM", "TARGETS", "RedTeamProbe", "judge_text", "run_command", "table"]


def table(results: dict[str, Any]) -> str:
    """The results as a table: per world, violations with and without the guardrails (and
    their ratio), false positives on ordinary lines, the guard's cost per phrase."""
    rows = [
        "world        violations (guard / off)  ratio  false positives   p95 ms/phrase "
        "(rules, +classifier)"
    ]
    for name, world in results["worlds"].items():
        mythic, off = world["mythic"], world.get("off")
        probes = mythic["redteam_probes"]
        v_on = mythic["violations"]
        v_off = off["violations"] if off else None
        ratio = f"{v_on / v_off:.2f}" if v_off else "-"
        ordinary = mythic.get("ordinary", {})
        fp = (
            f"{ordinary['false_positives']}/{ordinary['probes']} "
            f"({ordinary['false_positive_rate']:.1%})"
            if ordinary
            else "-"
        )
        latency = world["latency"]
        rows.append(
            f"{name[:12]:<12} {v_on:>3}/{probes} / {v_off if v_off is not None else '-':>3}/"
            f"{probes}{'':<10} {ratio:>5}  {fp:<16}  {latency['rules']['p95_ms']}, "
            f"{latency['rules_and_classifier']['p95_ms']}"
        )
    targets = results["acceptance"]["targets"]
    rows.append(
        f"targets: {targets['violations']} violations, at most "
        f"{targets['false_positive_rate']:.0%} false positives, at most "
        f"{targets['p95_ms_per_phrase']} ms p95 per phrase"
    )
    return "\n".join(rows)


def run_command(
    settings: MythicSettings,
    worlds: Sequence[Path],
    *,
    ordinary: int = 60,
    limit: int | None = None,
    seed: int = 0,
    parallel: int = 2,
    baseline: bool = True,
    out_file: Path | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Run, print the table, and write the results as JSON to `out_file`; returns them.

    Raises:
        WorldLoadError: a world cannot be loaded.
        MythicError: the model cannot be loaded, `out_file` cannot be written.
    """

    def on_line(config: str, probe: str, text: str, found: list[str]) -> None:
        if verbose or (found and config == "mythic"):
            mark = "!!" if found else "ok"
            err.print(f"[{config}] {mark} {probe}: {text[:100]!r} {'; '.join(found)[:160]}")

    results = asyncio.run(
        run_safety(
            settings,
            worlds,
            ordinary=ordinary,
            limit=limit,
            seed=seed,
            parallel=parallel,
            baseline=baseline,
            on_line=on_line,
        )
    )
    results["code_version"] = code_version()
    out.print(table(results), markup=False, highlight=False)
    if out_file is not None:
        try:
            out_file.parent.mkdir(parents=True, exist_ok=True)
            out_file.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise MythicError(f"cannot write {out_file}: {exc}") from None
        err.print(f"written to {out_file}")
    return results
