"""Provisioning on first use: the server's provisioner runs the real `mythic archetypes
provision` process on a tiny budget, and the chain router sees the registered adapter."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import yaml

from mythic.archetypes import ChainRouter, open_registry
from mythic.server._provision import Provisioner, ProvisionRun
from tests.conftest import EXAMPLE_WORLD, unavailable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _train_extra() -> None:
    try:
        import peft  # noqa: F401
    except ImportError as exc:
        unavailable(f"the train extra is not installed: {exc}")


async def test_a_missing_adapter_is_trained_registered_and_routed(tmp_path: Path) -> None:
    world = tmp_path / "world"
    shutil.copytree(EXAMPLE_WORLD, world, ignore=shutil.ignore_patterns("probes"))
    registry = str(world / "archetypes.yaml")
    config = tmp_path / "lenient.yaml"  # any adapter passes: the flow, not the quality
    config.write_text(
        yaml.safe_dump(
            {"archetypes": {"gate": {"min_gain": -1.0, "min_score": 0.0, "max_violations": 99}}}
        )
    )
    chains = ChainRouter(open_registry(registry))
    await chains.refresh()
    assert chains.adapters_for("zombie", "action_policy", base_model="smollm2-135m-instruct") == {}
    done: asyncio.Queue[ProvisionRun] = asyncio.Queue()
    provisioner = Provisioner(
        chains,
        world,
        registry,
        steps=2,
        extra_args=["--model", "smollm2-135m-instruct", "--batch", "2", "--rank", "4",
                    "--out", str(tmp_path / "adapters"), "--config", str(config)],
        on_done=done.put_nowait,
    )  # fmt: skip
    assert chains.on_missing == provisioner.request
    provisioner.request("zombie", "action_policy")
    provisioner.request("zombie", "action_policy")  # once per pair
    provisioner.request("zombie", "juggling")  # no recipe: never queued
    assert provisioner.queue.qsize() == 1
    worker = asyncio.create_task(provisioner.run())
    try:
        async with asyncio.timeout(900):
            run = await done.get()
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await chains.aclose()
    assert run.registered, "\n".join(run.tail)
    # The registry was reread: the router knows the adapter (it loads into an engine when
    # one is attached; here none is, so it is reported as registered but not resident).
    chain = chains.chains["zombie"]
    info = chain.adapter("action_policy")
    assert info is not None and info.base_model == "smollm2-135m-instruct"
    assert await asyncio.to_thread(Path(info.path).is_file)
