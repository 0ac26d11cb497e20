"""`mythic eval lore|style` as a user runs it: a real server on loopback, the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_WORLD
from tests.e2e.test_cli import mythic

pytestmark = pytest.mark.e2e


def test_eval_lore_compares_retrieval_with_none_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "lore.json"
    world = str(EXAMPLE_WORLD)
    result = mythic(
        "eval", "lore", "--world", world, "--npc", "marla", "--limit", "3", "--out", str(out)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hybrid" in result.stdout and "off" in result.stdout
    assert "hybrid vs off:" in result.stdout
    report = json.loads(out.read_text())
    modes = [run["mode"] for run in report["runs"]]
    assert modes == ["hybrid", "off"]
    for run in report["runs"]:
        assert run["probes"] == 3 and 0.0 <= run["accuracy"] <= 1.0
        assert all(o["npc"] == "marla" and o["reply"] for o in run["outcomes"])


def test_eval_style_reports_each_check(tmp_path: Path) -> None:
    result = mythic("eval", "style", "--world", str(EXAMPLE_WORLD), "--limit", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("taboo_kept", "catchphrase_used", "length_kept"):
        assert check in result.stdout


def test_bad_probes_files_get_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "probes.yaml"
    bad.write_text("probes:\n  - npc: nobody\n    question: hi\n    expect: [x]\n")
    result = mythic("eval", "lore", "--world", str(EXAMPLE_WORLD), "--probes", str(bad))
    assert result.returncode == 2
    assert "nobody" in result.stderr and "Traceback" not in result.stderr
    bad.write_text("probes:\n  - npc: marla\n")
    result = mythic("eval", "lore", "--world", str(EXAMPLE_WORLD), "--probes", str(bad))
    assert result.returncode == 2 and "probe 1: question: Field required" in result.stderr
    result = mythic("eval", "lore", "--world", str(EXAMPLE_WORLD), "--modes", "magic")
    assert result.returncode == 2 and "unknown retrieval mode" in result.stderr
