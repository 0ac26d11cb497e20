"""Bronze jobs on the real queues (embedded SQLite and PostgreSQL): at-least-once delivery,
idempotent ids, leases that outlive a killed worker process, retries, dead letters, and an
artifact reaching the next dialogue turn through a real gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from mythic.config import JobSettings, MythicSettings
from mythic.engine import Engine
from mythic.jobs import Artifact, ArtifactFollower, JobQueue, JobWorker
from mythic.knowledge import Knowledge, load_world
from mythic.route import local_router
from mythic.server import Gateway, serving
from tests.conftest import EXAMPLE_WORLD
from tests.integration.services import fresh_schema
from tests.integration.test_route import stalling_server

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgres"])
async def queue_settings(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[JobSettings, Path]]:
    """Job settings on each real store, with short leases and backoff."""
    base = {"visibility_timeout_s": 1.5, "backoff_s": 0.2, "max_attempts": 3, "poll_s": 0.1}
    if request.param == "postgres":
        async with fresh_schema() as dsn:
            yield JobSettings(url=dsn, **base), tmp_path
    else:
        yield JobSettings(**base), tmp_path


def open_queue(settings: JobSettings, tmp: Path) -> JobQueue:
    return JobQueue(settings, path=None if settings.url else tmp / "jobs.sqlite3")


async def test_queue_delivers_at_least_once_and_stores_each_artifact_once(
    queue_settings: tuple[JobSettings, Path],
) -> None:
    settings, tmp = queue_settings
    queue = open_queue(settings, tmp)
    try:
        job, created = await queue.submit("lore", {"topic": "The Sunken Bell"}, job_id="bell-1")
        again, created_again = await queue.submit(
            "lore", {"topic": "The Sunken Bell"}, job_id="bell-1"
        )
        assert created and not created_again and again.job_id == job.job_id
        assert len(await queue.list()) == 1  # idempotent: queued once

        first = await queue.claim("w1")
        assert first is not None and first.attempts == 1 and first.status == "running"
        assert await queue.claim("w2") is None  # leased: invisible to others
        await asyncio.sleep(settings.visibility_timeout_s + 0.2)
        second = await queue.claim("w2")  # w1 went silent: delivered again
        assert second is not None and second.attempts == 2 and second.worker == "w2"

        art = Artifact(job_id="bell-1", kind="lore", title="The Sunken Bell", text="It rings.")
        assert not await queue.complete(first, art)  # w1's stale lease writes nothing
        assert await queue.complete(second, art)
        assert not await queue.complete(second, art)  # and only once
        assert [a.job_id for a in await queue.artifacts()] == ["bell-1"]
        done = await queue.get("bell-1")
        assert done is not None and done[0].status == "done" and done[1] is not None
    finally:
        await queue.aclose()


async def test_failures_back_off_then_dead_letter(
    queue_settings: tuple[JobSettings, Path],
) -> None:
    settings, tmp = queue_settings
    now = [time.time()]  # the queue's clock: the backoff passes when the test says so
    queue = JobQueue(
        settings, path=None if settings.url else tmp / "jobs.sqlite3", clock=lambda: now[0]
    )
    try:
        await queue.submit("quest", {"npc_id": "marla"}, job_id="q-1")
        for attempt in range(1, settings.max_attempts + 1):
            job = await queue.claim("w")
            assert job is not None and job.attempts == attempt
            status = await queue.fail(job, f"boom {attempt}")
            assert status == ("dead" if attempt == settings.max_attempts else "queued")
            if status == "queued":
                backoff = settings.backoff_s * 2 ** (attempt - 1)  # doubling each attempt
                now[0] += backoff * 0.99
                assert await queue.claim("w") is None  # backing off
                now[0] += backoff * 0.02
        dead = await queue.list("dead")
        assert [(j.job_id, j.error) for j in dead] == [("q-1", "boom 3")]
        assert await queue.claim("w") is None
    finally:
        await queue.aclose()


async def test_concurrent_claims_never_share_a_job(
    queue_settings: tuple[JobSettings, Path],
) -> None:
    settings, tmp = queue_settings
    queue = open_queue(settings, tmp)
    other = open_queue(settings, tmp)  # a second process's connection
    try:
        for i in range(20):
            await queue.submit("lore", {"topic": f"topic {i}"}, job_id=f"j{i}")
        claims = await asyncio.gather(
            *(q.claim(f"w{i}") for i in range(20) for q in (queue, other))
        )
        got = [job.job_id for job in claims if job is not None]
        assert len(got) == 20 and len(set(got)) == 20
    finally:
        await queue.aclose()
        await other.aclose()


async def test_a_job_survives_a_killed_worker_process_and_is_applied_once(
    queue_settings: tuple[JobSettings, Path], settings: MythicSettings, smollm: Engine
) -> None:
    jobs, tmp = queue_settings
    server, slow_url = await stalling_server()
    config = tmp / "worker.yaml"
    slow = {"model": "stalls", "url": slow_url, "first_token_timeout_s": 600}
    config.write_text(
        yaml.safe_dump(
            {
                "memory": {"data_dir": str(tmp)},
                "jobs": jobs.model_dump(mode="json"),
                "route": {
                    "endpoints": {"slow": slow},
                    "tiers": {
                        name: {"endpoints": ["slow"], "tools": name == "silver"}
                        for name in ("gold", "silver", "bronze")
                    },
                },
            }
        )
    )
    queue = open_queue(jobs, tmp)
    worker_process = None
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    try:
        await queue.submit(
            "lore", {"topic": "The Drowned Lantern", "zone": "old_town"}, job_id="l-1"
        )
        worker_process = subprocess.Popen(  # noqa: ASYNC220 - returns at once
            [
                sys.executable,
                "-m",
                "mythic",
                "jobs",
                "work",
                "--world",
                str(EXAMPLE_WORLD),
                "--once",
                "--config",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("MYTHIC_")},
        )
        deadline = time.monotonic() + 60
        while True:  # the worker claimed the job and waits on the stalling model
            found = await queue.get("l-1")
            assert found is not None
            if found[0].status == "running":
                break
            if worker_process.poll() is not None:
                log.seek(0)
                pytest.fail(f"the worker exited: {log.read().decode()[-2000:]}")
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        os.killpg(worker_process.pid, signal.SIGKILL)  # a crash: no cleanup, lease held
        worker_process.wait()
        stale = found[0]
        assert stale.attempts == 1

        world = load_world(EXAMPLE_WORLD)
        knowledge = Knowledge(world, settings.knowledge.model_copy(update={"retrieval": "bm25"}))
        follower = ArtifactFollower(queue, knowledge)
        router = local_router(settings, smollm)
        done: list[str] = []
        worker = JobWorker(
            queue, router, lambda: world, jobs, on_done=lambda j, _a: done.append(j.job_id)
        )
        assert await worker.run_once() is None  # the lease has not run out yet
        await asyncio.sleep(jobs.visibility_timeout_s)
        redelivered = await worker.run_once()
        assert redelivered is not None and redelivered.attempts == 2
        assert worker.counts == {"done": 1} and done == ["l-1"]

        # The crashed worker's lease cannot complete it again, even if it came back.
        assert not await queue.complete(stale, Artifact("l-1", "lore", "dup", "dup text"))
        artifacts = await queue.artifacts()
        assert len(artifacts) == 1 and artifacts[0].title == "The Drowned Lantern"
        assert await follower.catch_up() == 1
        assert await follower.catch_up() == 0  # applied once
        assert knowledge.added == 1
    finally:
        if worker_process is not None and worker_process.poll() is None:
            os.killpg(worker_process.pid, signal.SIGKILL)
            worker_process.wait()
        log.close()
        server.close()
        await queue.aclose()


async def test_a_bronze_artifact_is_known_at_the_next_dialogue_turn(
    settings: MythicSettings, smollm: Engine, tmp_path: Path
) -> None:
    jobs = JobSettings(workers=1, poll_s=0.2, max_tokens=160)
    effective = settings.model_copy(
        update={
            "jobs": jobs,
            "knowledge": settings.knowledge.model_copy(update={"watch": False}),
            "chat": settings.chat.model_copy(update={"max_tokens": 24, "temperature": 0.0}),
            "dialogue": settings.dialogue.model_copy(update={"decide": False}),
        }
    )
    queue = JobQueue(jobs, path=tmp_path / "jobs.sqlite3")
    world = load_world(EXAMPLE_WORLD)
    zone = world.npcs["marla"].zone
    gateway = Gateway(effective, world, router=local_router(effective, smollm), jobs=queue)
    async with serving(gateway) as (host, port), httpx.AsyncClient(timeout=120) as client:
        base = f"http://{host}:{port}"
        topic = "The Sunken Bell of Saint Orla"
        body: dict[str, Any] = {
            "kind": "lore",
            "payload": {"topic": topic, "zone": zone, "hint": "a bell that rings under water"},
            "job_id": "orla-bell",
        }
        reply = await client.post(f"{base}/v1/jobs", json=body)
        assert reply.status_code == 202, reply.text
        assert (await client.post(f"{base}/v1/jobs", json=body)).json()["created"] is False
        bad = await client.post(
            f"{base}/v1/jobs", json={"kind": "quest", "payload": {"npc_id": "nobody"}}
        )
        assert bad.status_code == 422 and "no NPC 'nobody'" in bad.text
        deadline = time.monotonic() + 120
        while True:
            job = (await client.get(f"{base}/v1/jobs/orla-bell")).json()
            if job["applied"]:
                break
            assert job["status"] != "dead", job
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.2)
        assert job["status"] == "done" and job["artifact"]["title"] == topic
        said = await client.post(
            f"{base}/v1/npcs/marla/say", json={"text": "What is the sunken bell of Saint Orla?"}
        )
        assert said.status_code == 200
        context = (await client.get(f"{base}/v1/npcs/marla")).json()["context"]
        assert f"From {topic}:" in context  # retrieved into the very next turn's prompt
        usage = (await client.get(f"{base}/v1/usage")).json()
        assert usage["tiers"]["bronze"]["kinds"] == {"lore_gen": 1}
        metrics = (await client.get(f"{base}/metrics")).text
        assert 'mythic_jobs_total{outcome="done"} 1.0' in metrics
        assert "mythic_jobs_artifacts_applied 1.0" in metrics
