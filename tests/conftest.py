"""Test categories and shared fixtures.

Every test module declares exactly one category marker (`pytestmark = pytest.mark.unit`,
`integration` or `e2e`); collection fails otherwise. Integration and e2e tests use the real
packaged models: where one is missing they skip, except under `CI=true`, where they fail.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from mythic.config import MythicSettings, load_settings

CATEGORIES = ("unit", "integration", "e2e")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Servers started by tests (in-process and spawned) do not warm NPC prompts in the background
# at start: tests count prompt tokens and cached tokens right after start. The warm-up has a
# test of its own that turns it on.
os.environ.setdefault("MYTHIC_SERVER__WARM_NPCS", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = sorted(
        {
            str(item.path.relative_to(ROOT))
            for item in items
            if sum(1 for c in CATEGORIES if item.get_closest_marker(c)) != 1
        }
    )
    if unmarked:
        raise pytest.UsageError(
            "test modules must declare exactly one category marker (unit, integration, e2e): "
            + ", ".join(unmarked)
        )


def unavailable(reason: str) -> None:
    """Skip, or fail under CI=true where every real component must be there."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing component fails the run)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def settings() -> MythicSettings:
    return load_settings()


@pytest.fixture(scope="session")
def example_world() -> Path:
    return EXAMPLE_WORLD


@pytest.fixture
def no_config_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Run from an empty folder with no MYTHIC_* variables, so no outside setting leaks in."""
    for key in list(os.environ):
        if key.startswith("MYTHIC_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def served_address(proc: subprocess.Popen[bytes], deadline: float, what: str) -> str:
    """The `host:port` a starting `mythic serve` (`proc`, stdout piped) announces, once its
    `/readyz` answers; fails if it exits, or is not ready by `deadline` (`time.monotonic()`)."""
    assert proc.stdout is not None
    seen = b""
    while b"NPCs: " not in seen:  # the last line of the announcement
        assert proc.poll() is None, f"{what} exited: {seen.decode()}"
        assert time.monotonic() < deadline, f"{what} never announced itself: {seen.decode()}"
        ready, _, _ = select.select([proc.stdout], [], [], 5)
        if ready:
            seen += os.read(proc.stdout.fileno(), 4096)
    found = re.search(rb"on http://([\d.]+:\d+)", seen)
    assert found is not None, seen.decode()
    address = found.group(1).decode()
    with httpx.Client(base_url=f"http://{address}") as http:
        while http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, f"{what} never became ready"
            time.sleep(0.1)
    return address
