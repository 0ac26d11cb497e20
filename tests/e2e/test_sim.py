"""`mythic sim`: the headless region, with and without the model's intents over a server."""

from __future__ import annotations

import re

import pytest

from tests.conftest import EXAMPLE_WORLD
from tests.e2e.test_cli import mythic

pytestmark = pytest.mark.e2e


def _numbers(text: str, label: str) -> int:
    found = re.search(rf"{label} (\d+)", text)
    assert found is not None, text
    return int(found.group(1))


def test_sim_without_the_model_runs_and_reports_frame_times() -> None:
    result = mythic("sim", "--no-model", "--npcs", "400", "--horde", "120", "--seconds", "3")
    assert result.returncode == 0, result.stderr
    assert _numbers(result.stdout, "frames") > 100
    assert re.search(r"frame p50 [\d.]+ ms {2}p99 [\d.]+ ms", result.stdout), result.stdout
    assert _numbers(result.stdout, "intents sent") == 0


def test_sim_gets_intents_from_its_own_server_and_applies_them() -> None:
    result = mythic(
        "sim",
        "--world",
        str(EXAMPLE_WORLD),
        "--npcs",
        "300",
        "--horde",
        "80",
        "--seconds",
        "25",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _numbers(result.stdout, "intents sent") > 0
    assert _numbers(result.stdout, "applied") > 0, result.stdout
    assert _numbers(result.stdout, "gold") > 0


def test_sim_refuses_bad_numbers_with_a_message() -> None:
    result = mythic("sim", "--no-model", "--npcs", "10", "--horde", "20", "--seconds", "1")
    assert result.returncode == 2
    assert "horde" in result.stderr
    assert "Traceback" not in result.stderr
