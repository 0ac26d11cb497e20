"""`mythic sim`: the headless region, with and without the model's intents over a server."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

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


def test_sim_writes_a_replay_page_of_the_run(tmp_path: Path) -> None:
    page = tmp_path / "replay.html"
    result = mythic(
        "sim", "--no-model", "--npcs", "250", "--horde", "60", "--seconds", "2", "--view", str(page)
    )
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    data = json.loads(
        re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S).group(1)
    )  # type: ignore[union-attr]
    assert len(data["times"]) >= 10  # 10 samples a second
    assert data["times"] == sorted(data["times"])
    assert set(data["counts"]) == {250}
    assert len(base64.b64decode(data["pos"])) == 250 * 2 * 2 * len(data["times"])
    assert "zombie" in data["names"] and not data["truncated"]
    assert "http" not in text.split("<script", 1)[0]  # nothing fetched from anywhere


def test_sim_gets_intents_from_its_own_server_and_applies_them() -> None:
    """Intents from its own server, and a scene beside them (--scene: three NPCs, a line to
    each by name, their ambient talk) from a client process of its own."""
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
        "--realtime",
        "--scene",
        "--scene-npcs",
        "marla,captain_strand,countess_isolde",
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    linux = hasattr(os, "sched_getaffinity") and hasattr(os, "geteuid")
    if linux and os.geteuid() == 0 and len(os.sched_getaffinity(0)) > 1:  # allowed: it says so
        assert re.search(r"frame loop on core\(s\) \[[\d, ]+\], real-time", result.stderr)
    assert _numbers(result.stdout, "intents sent") > 0
    assert _numbers(result.stdout, "applied") > 0, result.stdout
    assert _numbers(result.stdout, "gold") > 0
    scene = "scene marla, captain_strand, countess_isolde: 3 lines, 3 answered by the NPC named"
    assert scene in result.stdout, result.stdout
    assert re.search(r"scene ambient \d/4 lines said", result.stdout), result.stdout


def test_sim_refuses_bad_numbers_with_a_message() -> None:
    result = mythic("sim", "--no-model", "--npcs", "10", "--horde", "20", "--seconds", "1")
    assert result.returncode == 2
    assert "horde" in result.stderr
    assert "Traceback" not in result.stderr


def test_sim_refuses_a_scene_it_cannot_hold() -> None:
    for args, said in (
        (("--no-model", "--scene"), "--scene needs the model"),
        (("--scene", "--scene-npcs", "marla,nobody_here"), "nobody_here not in Ravenmoor"),
        (("--scene", "--scene-npcs", "marla"), "two NPCs or more"),
    ):
        result = mythic("sim", "--world", str(EXAMPLE_WORLD), "--seconds", "1", *args)
        assert result.returncode == 2, result.stderr
        assert said in result.stderr and "Traceback" not in result.stderr


def test_sim_runs_far_off_npcs_every_frame_or_every_other_and_refuses_zero() -> None:
    for every in ("1", "3"):
        result = mythic(
            "sim", "--no-model", "--npcs", "300", "--horde", "60", "--seconds", "2",
            "--bronze-every", every, "--bronze-per-frame", "0" if every == "1" else "100",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert _numbers(result.stdout, "frames") > 100
        cadence = int(result.stdout.split("(policies every ")[1].split()[0])
        assert cadence == 1 if every == "1" else cadence >= 3
    result = mythic("sim", "--no-model", "--npcs", "300", "--seconds", "1", "--bronze-every", "0")
    assert result.returncode == 2
    assert "bronze_every" in result.stderr
    assert "Traceback" not in result.stderr
    result = mythic(
        "sim", "--no-model", "--npcs", "300", "--seconds", "1", "--bronze-per-frame", "-5"
    )  # fmt: skip
    assert result.returncode == 2
    assert "bronze_per_frame" in result.stderr and "Traceback" not in result.stderr
