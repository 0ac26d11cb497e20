"""`mythic eval quality`: plan, run, print and write the scorecard."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mythic._errors import MythicError
from mythic.cli._console import err, out
from mythic.cli._quality._judge import Reply
from mythic.cli._quality._plan import build_plan, load_quality_world
from mythic.cli._quality._probe import NotChecked
from mythic.cli._quality._run import run_quality
from mythic.cli._quality._scenes import AMBIENT_LINES
from mythic.cli._quality._scorecard import code_version, scorecard, table
from mythic.cli._quality._templates import CHECKS, Configuration
from mythic.config import MythicSettings


def run_command(
    settings: MythicSettings,
    world_path: Path,
    *,
    npcs: Sequence[str] = (),
    checks: Sequence[str] = (),
    turns: int = 40,
    limit: int | None = None,
    baseline: bool = True,
    base: bool = False,
    seed: int = 0,
    parallel: int = 2,
    out_file: Path | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """`mythic eval quality`: plan every probe, run them through a server on loopback per
    configuration, print the scorecard and write it as JSON to `out_file`; returns it.
    `base`: compare with the same settings without the registry's adapters (an adapter's
    gate) rather than the baseline.

    Raises:
        WorldLoadError: the world cannot be loaded (a refused card is only listed).
        MythicError: an unknown NPC or check, the model cannot be loaded, `out_file` cannot
            be written.
    """
    configurations: list[Configuration] = ["mythic"]
    if base:
        configurations.append("base")
    elif baseline:
        configurations.append("baseline")
    with tempfile.TemporaryDirectory(prefix="mythic-quality-") as tmp:
        max_lore = settings.knowledge.max_lore_bytes
        world, refused = load_quality_world(world_path, max_lore_bytes=max_lore, workdir=Path(tmp))
        skipped = [NotChecked(None, "lore", f"lore file skipped: {p}") for p in world.skipped]
        plan = build_plan(
            world,
            root=world_path,
            npcs=npcs or None,
            checks=checks or CHECKS,
            turns=turns,
            limit=limit,
            decide=settings.dialogue.decide,
            not_checked=[*refused, *skipped],
        )
        lines = sum(len(p) for n in plan.npcs for p in n.probes.values())
        lines += sum(len(n.conversation) for n in plan.npcs)
        lines += sum(len(s.addressed) + 2 + AMBIENT_LINES for s in plan.scenes)
        err.print(
            f"{lines} lines x {len(configurations)} configuration(s) "
            f"({', '.join(configurations)}) for {len(plan.npcs)} NPC(s) on "
            f"{settings.engine.dialogue_model}, through a server on loopback ..."
        )

        def show(configuration: str, npc: str, reply: Reply, number: int, of: int) -> None:
            failed = [c for c, ok in reply.checks.items() if not ok]
            err.print(
                f"[{configuration}] {npc} {reply.probe.check} {number}/{of} "
                f"{'ok  ' if reply.passed else 'FAIL'} {reply.seconds:.1f} s"
                + (f" ({', '.join(failed)})" if failed else "")
            )
            if verbose:
                out.print(f"[{configuration}] {npc} <- {reply.probe.question}")
                out.print(f"    -> {reply.error or reply.text!r}")

        started = time.perf_counter()
        code = code_version()  # before the run: a commit made during it is not what it ran
        runs, model = asyncio.run(
            run_quality(settings, plan, configurations, seed=seed, parallel=parallel, on_reply=show)
        )
        report = scorecard(
            plan, runs, model=model, seconds=time.perf_counter() - started, code=code
        )
    out.print("")
    for line in table(report):
        out.print(line)
    if out_file is None:
        err.print("every reply with its checks: --out bench/results/eval_quality.json")
        return report
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        partial = out_file.with_name(out_file.name + ".partial")
        partial.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        partial.replace(out_file)
    except OSError as exc:
        raise MythicError(f"cannot write {out_file}: {exc.strerror or exc}") from None
    err.print(f"wrote {out_file}")
    return report
