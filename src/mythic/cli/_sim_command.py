"""`mythic sim`, declared apart from its region (`_sim.py`) so that starting `mythic` does not
import the game-side controller and NumPy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from mythic._errors import MythicError
from mythic.cli._console import err, guard, out
from mythic.observability import percentile


def sim(
    world: Annotated[
        Path, typer.Option("--world", "-w", help="World whose personas answer the intents.")
    ] = Path("examples/worlds/ravenmoor"),
    npcs: Annotated[int, typer.Option(help="NPCs in the region, the horde included.")] = 1000,
    horde: Annotated[int, typer.Option(help="Zombies in the horde.")] = 300,
    seconds: Annotated[float, typer.Option(help="How long to run, in real time.")] = 20.0,
    fps: Annotated[float, typer.Option(help="Frames per second to pace at.")] = 300.0,
    server: Annotated[
        str | None,
        typer.Option("--server", "-s", help="Ask a running server: ws://HOST:PORT/v1/ws"),
    ] = None,
    model: Annotated[
        bool, typer.Option("--model/--no-model", help="Intent updates from the model.")
    ] = True,
    threads: Annotated[
        int, typer.Option(help="Cores for the model when sim starts its own server.")
    ] = 1,
    intents: Annotated[
        str,
        typer.Option(
            help="Where the intent client runs: 'process' (its own, off the game's GIL) or "
            "'thread' (a thread of the game's process)."
        ),
    ] = "process",
    view: Annotated[
        Path | None,
        typer.Option(help="Also write a replay page (HTML) of the run to open in a browser."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the region and the steering.")] = 0,
    pin: Annotated[
        bool,
        typer.Option(
            "--pin/--no-pin",
            help="Pin the frame loop to cores of its own and the model's processes (server, "
            "intent client) to the --threads others (Linux, 2+ cores).",
        ),
    ] = True,
    bronze_every: Annotated[
        int,
        typer.Option(
            help="Frames between two runs of a far-off (bronze) NPC's micro-policy "
            "(ControlSettings.bronze_every; 1: every frame); more in a crowd with over "
            "--bronze-per-frame bronze NPCs."
        ),
    ] = 2,
    bronze_per_frame: Annotated[
        int,
        typer.Option(
            help="At most about this many bronze micro-policies a frame: past it, bronze NPCs "
            "run less often (ControlSettings.bronze_per_frame; 0: no cap)."
        ),
    ] = 2500,
    realtime: Annotated[
        bool,
        typer.Option(
            "--realtime/--no-realtime",
            help="With --pin, run the frame loop under the real-time FIFO policy where the OS "
            "allows it (Linux, root or an rtprio limit), so no ordinary process on its core "
            "makes a due frame wait.",
        ),
    ] = False,
    scene: Annotated[
        bool,
        typer.Option(
            "--scene/--no-scene",
            help="Also hold a scene while the region runs: the player at a table with three of "
            "the world's NPCs, a line to each by name, then the NPCs talk among themselves "
            "(a client process of its own, on the model's cores).",
        ),
    ] = False,
    scene_npcs: Annotated[
        str | None,
        typer.Option(help="The scene's NPCs, comma-separated (default: the world's first three)."),
    ] = None,
) -> None:
    """A headless region: a player walks through a town, its monsters and a zombie horde, every
    NPC steered at frame rate by the game-side controller while the NPCs near the player get
    intents from the model (a server of its own, or --server). Prints frame-time statistics."""
    guard(
        lambda: _sim(
            world,
            npcs,
            horde,
            seconds,
            fps,
            server,
            model,
            threads,
            intents,
            view,
            seed,
            pin,
            bronze_every,
            bronze_per_frame,
            realtime,
            scene,
            scene_npcs,
        )
    )


def _sim(
    world: Path,
    npcs: int,
    horde: int,
    seconds: float,
    fps: float,
    server: str | None,
    model: bool,
    threads: int,
    intents: str,
    view: Path | None,
    seed: int,
    pin: bool,
    bronze_every: int,
    bronze_per_frame: int,
    realtime: bool,
    scene: bool = False,
    scene_npcs: str | None = None,
) -> None:
    import contextlib
    import dataclasses

    from mythic.cli._replay import ReplayRecorder
    from mythic.cli._sim import (
        FRAME_BUDGET_S,
        RegionSpec,
        SourceKind,
        build_region,
        cpu_model_settings,
        intent_source,
        pinned,
        run_paced,
        runs_realtime,
        spawned_server,
        speakers,
    )
    from mythic.cli._sim_scene import describe, plan_scene, scene_player
    from mythic.control import Controller, split_cores

    if intents not in ("process", "thread"):
        raise MythicError(f"--intents must be 'process' or 'thread', not {intents!r}")
    if scene and not model:
        raise MythicError("--scene needs the model's replies: leave out --no-model")
    named = [n.strip() for n in (scene_npcs or "").split(",") if n.strip()]
    table = plan_scene(world, named or None) if scene else None
    try:
        spec = RegionSpec(npcs=npcs, horde=horde, seed=seed)
        settings = dataclasses.replace(
            cpu_model_settings(seed),
            bronze_every=bronze_every,
            bronze_per_frame=bronze_per_frame,
        )
    except ValueError as exc:
        raise MythicError(str(exc)) from None
    controller = Controller(settings=settings, capacity=npcs)
    path = build_region(controller, spec)
    recorder = ReplayRecorder(controller) if view is not None else None
    split = split_cores(threads) if pin and model else None
    model_cpus = split.model if split is not None else None
    with contextlib.ExitStack() as stack:
        if model:
            speaker_of = speakers(world)
            if server is None:
                err.print(f"starting a server for {world} ({threads} core(s) for the model)...")
                server = stack.enter_context(
                    spawned_server(world, threads=threads, cpus=model_cpus)
                )
            if split is not None and stack.enter_context(pinned(split.game, realtime=realtime)):
                fifo = ", real-time" if realtime and runs_realtime() else ""
                err.print(
                    f"frame loop on core(s) {sorted(split.game)}{fifo}, model's processes on "
                    f"{sorted(split.model)}"
                )
            kind: SourceKind = "process" if intents == "process" else "thread"
            stack.enter_context(
                intent_source(controller, server, speaker_of, kind, cpus=model_cpus)
            )
        scene_result = None
        scene_lines: list[str] = []
        if table is not None and server is not None:
            scene_result = stack.enter_context(scene_player(server, table, cpus=model_cpus))
            err.print(f"holding a scene with {', '.join(table.npcs)} beside the region")
        err.print(f"running {npcs} NPCs ({horde} in the horde) for {seconds:g} s at {fps:g} fps")
        run = run_paced(controller, path, seconds=seconds, fps=fps, recorder=recorder)
        if scene_result is not None and table is not None:
            err.print("the region is done; waiting for the scene to end...")
            scene_lines = describe(scene_result(), table)
    if recorder is not None and view is not None:
        recorder.write(view, title=f"mythic sim: {npcs} NPCs")
        err.print(f"wrote the replay to {view}")
    stats = run.stats
    ms = [s * 1000 for s in run.frame_s]
    p50, p99 = (math.nan if p is None else p for p in (percentile(ms, 0.5), percentile(ms, 0.99)))
    out.print(
        f"frames {len(ms)}  frame p50 {p50:.2f} ms  p99 {p99:.2f} ms  "
        f"max {max(ms, default=0):.2f} ms  over "
        f"{FRAME_BUDGET_S * 1000:.1f} ms: {run.over_budget} ({run.preempted} waiting for "
        f"the CPU, {run.by_traffic} put over by the model's traffic)"
    )
    out.print(
        f"tiers gold {stats.gold} silver {stats.silver} bronze {stats.bronze} (policies every "
        f"{stats.bronze_cadence} frames)  intents sent "
        f"{stats.requests_sent} applied {stats.applied} ({run.applied_per_s:.1f}/s) stale "
        f"{stats.dropped_stale} timed out {stats.timed_out} failed {stats.failed} shed "
        f"{stats.shed} (persona busy)"
    )
    hit = "-" if stats.prediction_hits + stats.prediction_misses == 0 else f"{stats.hit_rate:.2f}"
    out.print(
        f"interactions {stats.prediction_hits + stats.prediction_misses}  predicted {hit}  "
        f"prefetches {stats.prefetches}"
    )
    if table is not None:
        for line in scene_lines:
            out.print(line)
