"""The archetype chain registry: its models, the YAML registry and `mythic archetypes`."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from datetime import datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from mythic.archetypes import (
    SERVED_TASKS,
    AdapterInfo,
    AdapterTask,
    ArchetypeChain,
    InvalidAdapterError,
    RankBudgetError,
    RegistryError,
    RegistryFormatError,
    RegistryUnavailableError,
    TrainingData,
    UnknownArchetypeError,
    YamlRegistry,
    inspect_adapter,
    open_registry,
)
from mythic.cli._archetypes import archetypes_app
from mythic.knowledge import load_world
from tests.conftest import EXAMPLE_WORLD

pytestmark = pytest.mark.unit


def adapter(task: str = "personality", rank: int = 8, **fields: object) -> AdapterInfo:
    values: dict[str, object] = {
        "task": task,
        "path": f"adapters/{task}.gguf",
        "format": "gguf",
        "base_model": "qwen2.5-coder-0.5b-instruct",
        "rank": rank,
    }
    return AdapterInfo.model_validate(values | fields)


def write_gguf_lora(path: Path, *, rank: int = 4, alpha: float = 8.0, n: int = 16) -> Path:
    """A tiny GGUF LoRA adapter: two blocks' query and value projections, random weights."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for block in range(2):
        for module in ("attn_q", "attn_v"):
            name = f"blk.{block}.{module}.weight"
            writer.add_tensor(f"{name}.lora_a", rng.normal(size=(rank, n)).astype(np.float32))
            writer.add_tensor(f"{name}.lora_b", rng.normal(size=(2 * n, rank)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- models ---------------------------------------------------------------------------------------


def test_adapter_info_defaults_and_validation() -> None:
    info = adapter(rank=16)
    assert info.alpha == 16  # alpha left out: the rank
    assert info.version == 1
    assert info.created_at.tzinfo is not None
    assert adapter(alpha=32).alpha == 32
    assert info.resolve(Path("/w")) == Path("/w/adapters/personality.gguf")
    assert adapter(path="/abs/a.gguf").resolve(Path("/w")) == Path("/abs/a.gguf")
    bad: list[dict[str, object]] = [
        {"task": "flirting"},
        {"rank": 0},
        {"format": "safetensors"},
        {"metrics": {"loss": float("nan")}},
        {"metrics": {"bad name": 1.0}},
        {"created_at": datetime(2025, 1, 1)},  # naive: whose midnight?
        {"colour": "red"},
        {"trained_on": {"description": "lore", "sha256": "abc"}},
    ]
    for fields in bad:
        with pytest.raises(ValidationError):
            adapter(**fields)
    data = TrainingData(description="lore", examples=3, sha256="AB" * 32)
    assert data.sha256 == "ab" * 32


def test_chain_validation() -> None:
    chain = ArchetypeChain(archetype="vampire", adapters={"personality": adapter()})
    found = chain.adapter("personality")
    assert found is not None and found.rank == 8
    assert chain.adapter(AdapterTask.ACTION_POLICY) is None
    assert AdapterTask.PERSONALITY not in chain.missing and len(chain.missing) == 6
    with pytest.raises(ValidationError, match="is for task personality"):
        ArchetypeChain(archetype="vampire", adapters={"action_policy": adapter()})
    with pytest.raises(ValidationError, match="exceeds max_total_rank 8"):
        ArchetypeChain(
            archetype="vampire", max_total_rank=8, adapters={"personality": adapter(rank=16)}
        )
    with pytest.raises(ValidationError, match="servers listed twice: a"):
        ArchetypeChain(archetype="vampire", servers=("a", "b", "a"))
    for name in ("Vampire", "vamp ire", "", "-x"):
        with pytest.raises(ValidationError):
            ArchetypeChain(archetype=name)
    with pytest.raises(ValidationError):
        chain.changed(voice="Not A Voice")
    assert chain.changed(voice="vampire").voice == "vampire"


def test_stack_stays_within_the_rank_budget() -> None:
    chain = ArchetypeChain(
        archetype="vampire",
        adapters={
            "personality": adapter("personality", 16),
            "dialogue_style": adapter("dialogue_style", 16),
            "action_policy": adapter("action_policy", 16),
        },
    )
    delta = adapter("personality", 16, path="npcs/isolde.gguf")
    stacked = chain.stack(
        ["dialogue_style", "personality", "world_knowledge", "personality"], delta
    )
    # In the order asked, tasks without an adapter left to the base model, the delta last.
    assert [(a.task.value, a.path) for a in stacked] == [
        ("dialogue_style", "adapters/dialogue_style.gguf"),
        ("personality", "adapters/personality.gguf"),
        ("personality", "npcs/isolde.gguf"),
    ]
    assert len(chain.stack(list(AdapterTask), delta)) == 4  # 64: exactly the budget
    with pytest.raises(RankBudgetError) as info:
        chain.stack(list(AdapterTask), adapter("personality", 17))
    assert (info.value.total, info.value.limit) == (65, 64)
    assert "over the budget of 64" in str(info.value) and info.value.fix
    with pytest.raises(InvalidAdapterError, match="unknown adapter task 'flirting'"):
        chain.stack(["flirting"])
    with pytest.raises(InvalidAdapterError, match="different base models"):
        chain.stack(["personality"], adapter("personality", 4, base_model="smollm2-135m"))
    assert chain.stack([]) == []


# -- the YAML registry ----------------------------------------------------------------------------


async def test_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "archetypes.yaml"
    registry = YamlRegistry(path)
    assert await registry.list() == []
    assert not path.exists()
    await registry.put(ArchetypeChain(archetype="zombie", voice="zombie", servers=("embedded",)))
    info = adapter(
        "action_policy",
        12,
        alpha=24.0,
        target_modules=("attn_q", "attn_v"),
        size_bytes=123_456,
        trained_on=TrainingData(description="ravenmoor lore", examples=1200, sha256="0" * 64),
        metrics={"loss": 1.2345678901234567, "action_validity": 0.97},
    )
    registered = await registry.register_adapter("vampire", info)
    assert registered == info.model_copy(update={"version": 1})

    reloaded = YamlRegistry(tmp_path)  # a folder means its archetypes.yaml
    assert reloaded.path == path
    assert await reloaded.list() == await registry.list()
    assert [c.archetype for c in await reloaded.list()] == ["vampire", "zombie"]
    vampire = await reloaded.get("vampire")
    assert vampire is not None and vampire.adapters[AdapterTask.ACTION_POLICY] == registered
    assert await reloaded.adapter_for("vampire", "action_policy") == registered
    assert await reloaded.adapter_for("vampire", "personality") is None
    assert await reloaded.adapter_for("werewolf", "personality") is None
    assert await reloaded.get("werewolf") is None
    assert path.read_text().startswith("# Archetype chains")
    assert os.listdir(tmp_path) == ["archetypes.yaml"]  # no temporary file left behind


async def test_a_task_nothing_serves_is_registered_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34: of the seven tasks only two are trained and applied; the others are kept."""
    assert {t for t in AdapterTask if t.served} == SERVED_TASKS
    assert {AdapterTask.DIALOGUE_STYLE, AdapterTask.ACTION_POLICY} == SERVED_TASKS
    registry = YamlRegistry(tmp_path / "archetypes.yaml")
    with caplog.at_level(logging.WARNING, logger="mythic.archetypes"):
        kept = await registry.register_adapter("ghoul", adapter("social_dynamics", 4))
        await registry.register_adapter("ghoul", adapter("dialogue_style", 4))
    assert await registry.adapter_for("ghoul", "social_dynamics") == kept
    assert [r.getMessage() for r in caplog.records] == [
        "ghoul social_dynamics v1 is registered but not served: Mythic applies only "
        "action_policy and dialogue_style adapters"
    ]


async def test_versions_and_history(tmp_path: Path) -> None:
    registry = YamlRegistry(tmp_path / "archetypes.yaml")
    for rank in (4, 8, 16):
        await registry.register_adapter("ghoul", adapter("personality", rank))
    await registry.register_adapter("ghoul", adapter("social_dynamics", 4))
    versions = await YamlRegistry(tmp_path).history("ghoul", "personality")
    assert [(a.version, a.rank) for a in versions] == [(1, 4), (2, 8), (3, 16)]
    assert [a.version for a in await registry.history("ghoul", "social_dynamics")] == [1]
    assert await registry.history("ghoul", "action_policy") == []
    with pytest.raises(UnknownArchetypeError, match=r"registered: ghoul"):
        await registry.history("lich", "personality")

    # A whole chain put over it keeps the adapters it replaces or drops in the history...
    chain = await registry.require("ghoul")
    await registry.put(chain.changed(adapters={"personality": chain.adapters["personality"]}))
    assert [a.version for a in await registry.history("ghoul", "social_dynamics")] == [1]
    assert await registry.adapter_for("ghoul", "social_dynamics") is None
    # ...and the next registration continues the numbering.
    again = await registry.register_adapter("ghoul", adapter("social_dynamics", 8))
    assert again.version == 2

    assert await registry.remove("ghoul") is True
    assert await registry.remove("ghoul") is False
    assert await registry.list() == []


async def test_update_changes_the_profile_and_keeps_the_adapters(tmp_path: Path) -> None:
    registry = YamlRegistry(tmp_path / "archetypes.yaml")
    await registry.register_adapter("lich", adapter())
    first = await registry.require("lich")
    chain = await registry.update("lich", lambda c: c.changed(voice="lich", servers=("gpu-1",)))
    assert (chain.voice, chain.servers) == ("lich", ("gpu-1",))
    assert chain.adapters == first.adapters
    assert chain.updated_at >= first.updated_at
    created = await registry.update("wraith", lambda c: c.changed(voice="whisper_01"))
    assert created.archetype == "wraith" and created.adapters == {}
    with pytest.raises(RegistryError, match="cannot rename"):
        await registry.update("lich", lambda c: c.changed(archetype="ghoul"))
    with pytest.raises(RegistryError, match="not an archetype name"):
        await registry.get("Lich")


async def test_rank_budget_is_checked_at_registration(tmp_path: Path) -> None:
    path = tmp_path / "archetypes.yaml"
    registry = YamlRegistry(path)
    await registry.put(ArchetypeChain(archetype="zombie", max_total_rank=16))
    before = path.read_bytes()
    with pytest.raises(RankBudgetError, match="rank 32, over the budget of 16"):
        await registry.register_adapter("zombie", adapter(rank=32))
    assert path.read_bytes() == before
    with pytest.raises(InvalidAdapterError):
        await registry.register_adapter("zombie", {"task": "personality"})  # type: ignore[arg-type]


MALFORMED = """\
schema_version: 1
archetypes:
  vampire:
    voice: vampire
    servers: [a, a]
    adapters:
      personality:
        task: personality
        path: a.gguf
        format: gguf
        base_model: qwen
        rank: -3
      flirting:
        task: personality
        path: b.gguf
        format: gguf
        base_model: qwen
        rank: 4
  Werewolf:
    voice: werewolf
  zombie:
    colour: green
"""


async def test_malformed_file_lists_every_problem_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "archetypes.yaml"
    path.write_text(MALFORMED)
    registry = YamlRegistry(path)
    with pytest.raises(RegistryFormatError) as info:
        await registry.list()
    found = {(p.line, p.field) for p in info.value.problems}
    assert found == {
        (5, "archetypes.vampire.servers"),
        (12, "archetypes.vampire.adapters.personality.rank"),
        (13, "archetypes.vampire.adapters.flirting"),
        (19, "archetypes.Werewolf"),
        (22, "archetypes.zombie.colour"),
    }, info.value.problems
    assert all(p.source == str(path) for p in info.value.problems)
    assert f"{path}:12: archetypes.vampire.adapters.personality.rank" in str(info.value)
    assert "5 problems" in str(info.value)

    # Nothing is written over a file that could not be read: it stays as it was.
    with pytest.raises(RegistryFormatError):
        await registry.register_adapter("zombie", adapter())
    with pytest.raises(RegistryFormatError):
        await registry.remove("vampire")
    assert path.read_text() == MALFORMED


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("archetypes:\n  vampire: {voice: [\n", 3, "invalid YAML"),
        ("- a list\n", 1, "expected a mapping"),
        ("schema_version: 2\n", 1, "Input should be 1"),
        ("archetypes:\n  vampire:\n    archetype: lich\n", 3, "names the archetype 'lich'"),
    ],
)
async def test_unusable_files(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "archetypes.yaml"
    path.write_text(text)
    with pytest.raises(RegistryFormatError, match=message) as info:
        await YamlRegistry(path).get("vampire")
    assert info.value.problems[0].line == line


async def test_empty_file_is_an_empty_registry(tmp_path: Path) -> None:
    (tmp_path / "archetypes.yaml").write_text("# nothing yet\n")
    assert await YamlRegistry(tmp_path).list() == []


async def test_failed_write_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "archetypes.yaml"
    registry = YamlRegistry(path)
    await registry.register_adapter("vampire", adapter())
    before = path.read_bytes()

    def full_disk(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(RegistryUnavailableError, match="No space left") as info:
        await registry.register_adapter("vampire", adapter(rank=16))
    assert info.value.retryable
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["archetypes.yaml"]
    assert [a.version for a in await registry.history("vampire", "personality")] == [1]


async def test_writers_on_one_file_take_turns(tmp_path: Path) -> None:
    # Two registries on one file (as two processes would be): every registration lands.
    one, two = YamlRegistry(tmp_path), YamlRegistry(tmp_path)
    tasks = list(AdapterTask)
    async with asyncio.timeout(30):
        await asyncio.gather(
            *(
                (one if i % 2 else two).register_adapter("werewolf", adapter(task.value))
                for i, task in enumerate(tasks)
            ),
            *(one.register_adapter("werewolf", adapter("personality", 4)) for _ in range(3)),
        )
    chain = await YamlRegistry(tmp_path).require("werewolf")
    assert set(chain.adapters) == set(tasks)
    assert [a.version for a in await two.history("werewolf", "personality")] == [1, 2, 3, 4]


def test_open_registry_picks_the_backend(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "chains.yaml")
    assert isinstance(registry, YamlRegistry) and registry.path == tmp_path / "chains.yaml"


async def test_example_world_has_a_chain_for_each_archetype() -> None:
    world = load_world(EXAMPLE_WORLD)  # archetypes.yaml does not upset the world loader
    chains = {c.archetype: c for c in await YamlRegistry(EXAMPLE_WORLD).list()}
    assert {npc.archetype for npc in world.npcs.values()} <= set(chains)
    from mythic.speech import Voices

    voices = Voices()
    for chain in chains.values():
        assert chain.voice in voices
        assert chain.servers == ("embedded",)


# -- adapter files --------------------------------------------------------------------------------


def test_inspect_a_gguf_lora(tmp_path: Path) -> None:
    path = write_gguf_lora(tmp_path / "a.gguf", rank=4, alpha=8.0)
    found = inspect_adapter(path)
    assert (found.format, found.rank, found.alpha) == ("gguf", 4, 8.0)
    assert found.target_modules == ("attn_q", "attn_v")
    assert found.size_bytes == path.stat().st_size
    assert found.base_model is None

    import gguf

    model = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "llama")
    model.add_type("model")
    model.write_header_to_file()
    model.write_kv_data_to_file()
    model.write_tensors_to_file()
    model.close()
    with pytest.raises(InvalidAdapterError, match="not a LoRA adapter"):
        inspect_adapter(tmp_path / "model.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(InvalidAdapterError, match="not a readable GGUF"):
        inspect_adapter(tmp_path / "junk.gguf")
    with pytest.raises(InvalidAdapterError, match="no adapter at"):
        inspect_adapter(tmp_path / "missing.gguf")


def test_inspect_a_peft_folder(tmp_path: Path) -> None:
    folder = tmp_path / "peft"
    folder.mkdir()
    with pytest.raises(InvalidAdapterError, match="without adapter_config"):
        inspect_adapter(folder)
    config = {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "rank_pattern": {"q_proj": 12},
        "target_modules": ["v_proj", "q_proj"],
        "base_model_name_or_path": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidAdapterError, match="no adapter_model"):
        inspect_adapter(folder)
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 1000)
    found = inspect_adapter(folder)
    assert (found.format, found.rank, found.alpha, found.size_bytes) == ("peft", 12, 16.0, 1000)
    assert found.target_modules == ("q_proj", "v_proj")
    assert found.base_model == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(InvalidAdapterError, match="IA3 adapter, not a LoRA"):
        inspect_adapter(folder)


# -- the command line -----------------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(archetypes_app, list(args))
    return result.exit_code, result.output


def test_cli_register_list_show(tmp_path: Path) -> None:
    world = tmp_path / "world"
    (world / "adapters").mkdir(parents=True)
    lora = write_gguf_lora(world / "adapters" / "vampire-personality.gguf", rank=4, alpha=8.0)
    w = ("--world", str(world))

    code, output = invoke("register", "vampire", "--voice", "vampire", "--server", "embedded", *w)
    assert code == 0, output
    assert "created vampire: voice vampire" in output
    code, output = invoke(
        "register",
        "vampire",
        "--task",
        "personality",
        "--path",
        str(lora),
        "--base",
        "qwen2.5-coder-0.5b-instruct",
        "--data",
        "ravenmoor lore",
        "--examples",
        "40",
        "--metric",
        "loss=1.5",
        *w,
    )
    assert code == 0, output
    assert "registered vampire personality v1" in output and "rank 4" in output
    code, output = invoke(
        "register", "vampire", "-t", "personality", "-p", str(lora), "--base", "qwen", *w
    )
    assert code == 0 and "v2" in output, output

    chain = YamlRegistry(world).path.read_text()
    assert "path: adapters/vampire-personality.gguf" in chain  # relative to the registry

    code, output = invoke("list", *w)
    assert code == 0, output
    assert "vampire" in output and "personality v2 r4" in output
    assert "1 archetype chains in" in output

    code, output = invoke("show", "vampire", "--history", *w)
    assert code == 0, output
    assert "personality          v2" in output
    assert "was v1" in output
    assert "dialogue_style       base model" in output

    code, output = invoke("show", "vampire", "--json", "--history", *w)
    data = json.loads(output)
    assert data["adapters"]["personality"]["alpha"] == 8.0
    assert [a["version"] for a in data["history"]["personality"]] == [1, 2]

    code, output = invoke("list", "--json", "--registry", str(world / "archetypes.yaml"))
    assert [c["archetype"] for c in json.loads(output)] == ["vampire"]


def test_cli_errors(tmp_path: Path) -> None:
    w = ("--world", str(tmp_path))
    lora = write_gguf_lora(tmp_path / "big.gguf", rank=32)
    code, output = invoke("register", "zombie", "--max-total-rank", "16", *w)
    assert code == 0, output
    code, output = invoke("register", "zombie", "-t", "personality", "-p", str(lora), *w)
    assert code == 2 and "--base" in output, output
    code, output = invoke(
        "register", "zombie", "-t", "personality", "-p", str(lora), "--base", "q", *w
    )
    assert code == 2 and "over the budget of 16" in output, output
    code, output = invoke("register", "zombie", "-t", "flirting", "-p", str(lora), *w)
    assert code == 2 and "task" in output, output
    code, output = invoke("register", "zombie", "--task", "personality", *w)
    assert code == 2 and "go together" in output, output
    code, output = invoke("register", "zombie", "--voice", "No Voice", *w)
    assert code == 2 and "voice" in output, output
    code, output = invoke("show", "ghoul", *w)
    assert code == 2 and "registered: zombie" in output, output
    code, output = invoke("list", "--world", str(tmp_path / "nowhere"))
    assert code == 2 and "no world folder" in output, output
    # Not on this machine: recorded as given.
    code, output = invoke(
        "register", "zombie", "-t", "goal_prioritization", "-p", "/srv/a.gguf",
        "--rank", "8", "--base", "q", *w,
    )  # fmt: skip
    assert code == 0 and "not on this machine" in output, output
