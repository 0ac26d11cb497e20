"""`mythic eval quality` as a user runs it: a real server on loopback, a real model, the tiny
test world (2 NPCs, 2 lore documents), both configurations in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mythic.cli._quality import CHECKS
from tests.conftest import ROOT
from tests.e2e.test_cli import SMALL, mythic

pytestmark = pytest.mark.e2e

TINY = ROOT / "tests" / "worlds" / "tinyvale"


@pytest.mark.timeout(900)  # 40 replies: about 45 s on 2 idle cores, minutes on a busy machine
def test_the_scorecard_runs_every_check_against_the_baseline(tmp_path: Path) -> None:
    # The smallest packaged model and short replies: this tests the command, not the model.
    config = tmp_path / "fast.yaml"
    config.write_text(f"engine:\n  dialogue_model: {SMALL}\nchat:\n  max_tokens: 40\n")
    out = tmp_path / "quality.json"
    result = mythic(
        "eval", "quality", "--world", str(TINY), "--turns", "4", "--limit", "1",
        "--config", str(config), "--out", str(out),
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["kind"] == "quality" and report["world"] == "Tinyvale"
    assert report["model"] and report["npcs"] == ["corwin", "hilda"]
    assert list(report["configurations"]) == ["mythic", "baseline"]
    baseline = report["configurations"]["baseline"]["settings"]
    assert baseline["retrieval"] == "off" and baseline["adapters"].startswith("none")
    assert baseline["line_filter"] in (False, None)  # off, where the server has one
    not_checked = {(n["npc"], n["check"]) for n in report["not_checked"]}
    assert ("corwin", "actions") in not_checked  # no trade tool on his card
    for name, configuration in report["configurations"].items():
        totals = configuration["totals"]
        assert set(report["targets"]) <= set(totals)
        replies = [r for npc in configuration["npcs"].values() for r in npc["replies"]]
        assert totals["replies"] == len(replies) > 0
        for reply in replies:
            assert {"check", "question", "source", "reply", "checks"} <= set(reply), reply
        ran = {r["check"] for r in replies} | ({"assistant_speak"} if replies else set())
        for check in CHECKS:
            assert check in ran or any(n["check"] == check for n in report["not_checked"]), (
                name,
                check,
            )
        for npc in ("corwin", "hilda"):
            talk = configuration["npcs"][npc]["long_conversation"]
            assert talk["turns"] == 4 and "distinct_2" in talk and "verbatim_repeats" in talk
    assert report["targets"]["lore"]["target"] == ">= 85%"
    for line in ("lore questions answered correctly", "taboos kept", "action coherence",
                 "per NPC (mythic / baseline)", "not checked"):  # fmt: skip
        assert line in result.stdout
    assert "Traceback" not in result.stderr


def test_an_unknown_npc_or_check_is_a_clear_error() -> None:
    result = mythic("eval", "quality", "--world", str(TINY), "--npc", "nobody")
    assert result.returncode == 2 and "no NPC 'nobody'" in result.stderr
    result = mythic("eval", "quality", "--world", str(TINY), "--checks", "lore,vibes")
    assert result.returncode == 2 and "unknown checks vibes" in result.stderr
    assert "Traceback" not in result.stderr
