"""`mythic db migrate` and `mythic memory show|forget` as a user runs them, on the real
PostgreSQL and Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from mythic.config import MemorySettings
from mythic.memory import Fact, Memory
from tests.e2e.test_cli import mythic
from tests.integration.services import REDIS_URL, postgres_dsn, redis_prefix

pytestmark = pytest.mark.e2e
__all__ = ["postgres_dsn", "redis_prefix"]  # fixtures


async def test_migrate_show_and_forget_a_player_in_every_tier(
    tmp_path: Path, postgres_dsn: str, redis_prefix: str
) -> None:
    env = {
        "MYTHIC_MEMORY__DATA_DIR": str(tmp_path),
        "MYTHIC_MEMORY__COLD_URL": postgres_dsn,
        "MYTHIC_MEMORY__WARM_URL": REDIS_URL,
        "MYTHIC_MEMORY__WARM_PREFIX": redis_prefix,
        "MYTHIC_MEMORY__AUTO_MIGRATE": "false",
    }
    first = mythic("db", "migrate", env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_history" in first.stdout and "up to date" in first.stdout
    again = mythic("db", "migrate", env=env, timeout=60)
    assert again.returncode == 0 and "applied" not in again.stdout

    settings = MemorySettings(
        data_dir=tmp_path,
        cold_url=postgres_dsn,
        warm_url=REDIS_URL,
        warm_prefix=redis_prefix,
        auto_migrate=False,
        summaries=False,
    )
    async with Memory(settings) as memory:
        for player in ("ada", "bob"):
            memory.record_turn("marla", player, "s1", "player", f"I am {player}, remember me.")
            memory.record_turn("marla", player, "s1", "npc", "I will.")
        memory.record_event("marla", "ada", "s1", "gift", fact=Fact("Ada gave a rose", 6, "gift"))
        memory.summarize("marla", "ada", "s1")
        await memory.settle()

    shown = mythic("memory", "show", "--player", "ada", env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "warm: 1 NPCs" in shown.stdout and "marla: 2 turns, 1 summaries, 1 facts" in shown.stdout
    assert "Ada gave a rose" in shown.stdout and "cold: 6 events archived" in shown.stdout

    forgot = mythic("memory", "forget", "--player", "ada", "--yes", env=env, timeout=60)
    assert forgot.returncode == 0, forgot.stderr
    assert "1 warm NPC entries, 6 archived events" in forgot.stdout
    gone = mythic("memory", "show", "--player", "ada", "--json", env=env, timeout=60)
    assert '"events": 0' in gone.stdout and '"warm": {}' in gone.stdout
    kept = mythic("memory", "show", "--player", "bob", env=env, timeout=60)
    assert "cold: 2 events archived" in kept.stdout


def test_a_bad_archive_url_is_a_clear_error(tmp_path: Path) -> None:
    env = {"MYTHIC_MEMORY__DATA_DIR": str(tmp_path), "MYTHIC_MEMORY__COLD_URL": "mysql://x/y"}
    result = mythic("db", "migrate", env=env, timeout=60)
    assert result.returncode == 2
    assert "expected postgresql://" in result.stderr and "Traceback" not in result.stderr
    missing = mythic("memory", "show", env=env, timeout=60)
    assert missing.returncode == 2 and "--player" in missing.stderr
