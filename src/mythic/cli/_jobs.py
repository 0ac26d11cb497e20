"""`mythic jobs submit|list|show|work`: bronze jobs."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from mythic.cli._console import call_server, err, guard, load_config, out
from mythic.cli._options import ConfigOption, JsonOption

jobs_app = typer.Typer(help="Bronze jobs (lore, quest, summary): submit, list, show, work.")

JobsServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        "-s",
        help="A running server's HTTP address (http://HOST:PORT). Default: the configured "
        "queue directly (jobs.url, or the embedded SQLite queue).",
    ),
]


def _with_jobs(config: Path | None, work: Callable[[Any], Any]) -> Any:
    """Run `work(queue)` on the configured job queue."""
    import asyncio

    from mythic.jobs import open_queue

    settings = load_config(config)

    async def run() -> Any:
        queue = open_queue(settings.jobs, settings.memory.data_dir)
        try:
            return await work(queue)
        finally:
            await queue.aclose()

    return guard(lambda: asyncio.run(run()))


def _print_job(job: dict[str, Any]) -> None:
    out.print(
        f"{job['job_id']}  {job['kind']:<8} {job['status']:<8} attempts {job['attempts']}/"
        f"{job['max_attempts']}" + (f"  error: {job['error']}" if job.get("error") else "")
    )


@jobs_app.command("submit")
def jobs_submit(
    kind: Annotated[str, typer.Argument(help="lore (worldbuilding), quest or summary.")],
    topic: Annotated[str | None, typer.Option(help="lore: what the entry is about.")] = None,
    zone: Annotated[str | None, typer.Option(help="lore: the zone it belongs to.")] = None,
    npc: Annotated[
        str | None, typer.Option("--npc", help="quest, summary (and lore): the NPC.")
    ] = None,
    hint: Annotated[str | None, typer.Option(help="Notes for the model.")] = None,
    text: Annotated[str | None, typer.Option(help="summary: the text to summarize.")] = None,
    title: Annotated[str | None, typer.Option(help="summary: its title.")] = None,
    job_id: Annotated[
        str | None, typer.Option("--id", help="Idempotency key (default: a new id).")
    ] = None,
    server: JobsServerOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Queue a bronze job; a worker generates its artifact and the NPCs learn it."""
    given = {"topic": topic, "zone": zone, "npc_id": npc, "hint": hint, "text": text}
    payload = {k: v for k, v in (given | {"title": title}).items() if v is not None}
    if server:
        body = {"kind": kind, "payload": payload, "job_id": job_id}
        data = call_server("POST", f"{server.rstrip('/')}/v1/jobs", body)
    else:

        async def work(queue: Any) -> Any:
            job, created = await queue.submit(kind, payload, job_id=job_id)
            return {**job.to_dict(), "created": created}

        data = _with_jobs(config, work)
    if as_json:
        out.print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_job(data)
    if not data["created"]:
        out.print("  (already queued under this id: not queued again)")


@jobs_app.command("list")
def jobs_list(
    status: Annotated[
        str | None, typer.Option(help="queued, running, done or dead (the dead letters).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    server: JobsServerOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Jobs, newest first."""
    if status is not None and status not in ("queued", "running", "done", "dead"):
        err.print(f"error: unknown status {status!r}: queued, running, done or dead", style="red")
        raise typer.Exit(2)
    if server:
        query = f"?limit={limit}" + (f"&status={status}" if status else "")
        jobs = call_server("GET", f"{server.rstrip('/')}/v1/jobs{query}")["jobs"]
    else:

        async def work(queue: Any) -> Any:
            return [job.to_dict() for job in await queue.list(status, limit=limit)]

        jobs = _with_jobs(config, work)
    if as_json:
        out.print(json.dumps(jobs, indent=2, ensure_ascii=False))
        return
    for job in jobs:
        _print_job(job)
    if not jobs:
        out.print("no jobs")


@jobs_app.command("show")
def jobs_show(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    server: JobsServerOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """One job and its artifact."""
    if server:
        data = call_server("GET", f"{server.rstrip('/')}/v1/jobs/{job_id}")
    else:

        async def work(queue: Any) -> Any:
            found = await queue.get(job_id)
            if found is None:
                return None
            job, artifact = found
            return {**job.to_dict(), "artifact": artifact.to_dict() if artifact else None}

        data = _with_jobs(config, work)
        if data is None:
            err.print(f"error: no job {job_id!r}", style="red")
            raise typer.Exit(1)
    if as_json:
        out.print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_job(data)
    out.print(f"  payload: {json.dumps(data['payload'], ensure_ascii=False)}")
    artifact = data.get("artifact")
    if artifact:
        out.print(f"  artifact: {artifact['title']}")
        out.print(f"    {artifact['text']}")
    if "applied" in data:
        out.print(f"  in the NPCs' knowledge: {'yes' if data['applied'] else 'not yet'}")


@jobs_app.command("work")
def jobs_work(
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")],
    once: Annotated[bool, typer.Option("--once", help="Work one due job, then exit.")] = False,
    config: ConfigOption = None,
) -> None:
    """Run a bronze worker outside the server (scale out: as many as you like, on the
    PostgreSQL queue). The server picks up the artifacts."""
    import asyncio

    from mythic.jobs import JobWorker, open_queue
    from mythic.knowledge import load_world
    from mythic.route import open_router

    settings = load_config(config)
    loaded = guard(partial(load_world, world))

    async def run() -> None:
        router, engines = open_router(settings)
        queue = open_queue(settings.jobs, settings.memory.data_dir)
        worker = JobWorker(queue, router, lambda: loaded, settings.jobs)
        router.start()
        err.print(f"worker {worker.name} on {queue.where}")
        try:
            if once:
                job = await worker.run_once()
                out.print(f"{job.job_id}: {dict(worker.counts)}" if job else "no job due")
            else:
                await worker.run()
        finally:
            await router.aclose()
            await queue.aclose()
            for engine in engines:
                engine.close()

    try:
        guard(lambda: asyncio.run(run()))
    except KeyboardInterrupt:
        err.print("Stopped.")
