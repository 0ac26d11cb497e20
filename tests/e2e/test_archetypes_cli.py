"""Archetype adapters from the command line, on a tiny training budget: provision (curate,
train, evaluate, gate, register), then the registry and the evaluation see the adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLE_WORLD, unavailable
from tests.e2e.test_cli import mythic

pytestmark = [
    pytest.mark.e2e,
    # Training, evaluating and registering an adapter (twice): within the default 300 s on an
    # AVX-512 machine, over it on a 2-core AVX2-only one, where the default cut it off.
    pytest.mark.timeout(1500),
]


@pytest.fixture(scope="module", autouse=True)
def _train_extra() -> None:
    try:
        import peft  # noqa: F401
    except ImportError as exc:
        unavailable(f"the train extra is not installed: {exc}")


TINY = ("--steps", "3", "--batch", "2", "--rank", "4", "--model", "smollm2-135m-instruct")


def _world(tmp_path: Path) -> Path:
    world = tmp_path / "world"
    shutil.copytree(EXAMPLE_WORLD, world, ignore=shutil.ignore_patterns("probes"))
    return world


def _config(tmp_path: Path, name: str, **gate: float) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"archetypes": {"gate": gate}}))
    return path


def test_provisioning_registers_an_adapter_that_passes_the_gate(tmp_path: Path) -> None:
    world = _world(tmp_path)
    # A gate any adapter passes, so the whole flow through registration is exercised.
    config = _config(tmp_path, "lenient", min_gain=-1.0, min_score=0.0, max_violations=99)
    result = mythic(
        "archetypes", "provision", "zombie", "--world", str(world), "--tasks", "action_policy",
        "--out", str(tmp_path / "adapters"), "--config", str(config), *TINY,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "zombie action_policy: PASS" in result.stdout
    assert "registered v1" in result.stdout and "actions" in result.stdout
    shown = mythic("archetypes", "show", "zombie", "--world", str(world), "--json")
    assert shown.returncode == 0, shown.stderr
    chain = json.loads(shown.stdout)
    info = chain["adapters"]["action_policy"]
    assert info["format"] == "gguf" and Path(info["path"]).is_file()
    assert info["base_model"] == "smollm2-135m-instruct" and info["rank"] == 4
    assert "eval.actions" in info["metrics"] and "held_out_loss" in info["metrics"]
    # A second provisioning skips the task that has its adapter now.
    again = mythic(
        "archetypes", "provision", "zombie", "--world", str(world), "--tasks", "action_policy",
        "--out", str(tmp_path / "adapters"), "--config", str(config), *TINY,
    )  # fmt: skip
    assert again.returncode == 0 and "already has adapters" in again.stdout
    # The evaluation finds the registered adapter by itself.
    evaluated = mythic(
        "eval", "archetype", "zombie", "--world", str(world), "--out", str(tmp_path / "e.json"),
        "--config", str(config), timeout=600,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    report = json.loads((tmp_path / "e.json").read_text())
    actions = next(p for p in report["probes"] if p["probe"] == "actions")
    assert actions["adapter"] and actions["adapter_score"] is not None


def test_an_adapter_that_fails_the_gate_is_kept_but_not_registered(tmp_path: Path) -> None:
    world = _world(tmp_path)
    config = _config(tmp_path, "strict", min_gain=1.0)  # nothing beats the base by 100%
    result = mythic(
        "archetypes", "provision", "zombie", "--world", str(world), "--tasks", "action_policy",
        "--out", str(tmp_path / "adapters"), "--config", str(config), *TINY,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "zombie action_policy: FAIL" in result.stdout and "not registered" in result.stdout
    shown = json.loads(
        mythic("archetypes", "show", "zombie", "--world", str(world), "--json").stdout
    )
    assert "action_policy" not in shown["adapters"]
    kept = list((tmp_path / "adapters").rglob("evaluation.json"))
    assert len(kept) == 1 and (kept[0].parent / "adapter.gguf").is_file()


def test_bad_provisioning_requests_get_clear_errors(tmp_path: Path) -> None:
    world = _world(tmp_path)
    result = mythic("archetypes", "provision", "banshee", "--world", str(world), *TINY)
    assert result.returncode == 2 and "no NPC of archetype 'banshee'" in result.stderr
    assert "Traceback" not in result.stderr
    result = mythic("archetypes", "provision", "zombie", "--world", str(world), "--tasks", "x")
    assert result.returncode == 2 and "unknown task(s) x" in result.stderr
    result = mythic("train", "adapter", "zombie", "--world", str(world), "--task", "juggling")
    assert result.returncode == 2 and "no training data recipe" in result.stderr
