"""The Godot addon (`clients/godot`): its generated message definitions match the server's JSON
Schema, and its headless tests pass under Godot 3: the unit tests (validation, frames, lip-sync
on a recorded line of the server's voice), the peer tests (the client against a scripted
server: what a real one never sends), the whole conformance suite and the example of
docs/engines/godot.md against a real `mythic serve` on loopback (one server for all players).

Godot 3's headless runtime is the toolchain (Debian `godot3-server`): where it is missing these
tests skip, and fail under CI=true.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import ROOT, unavailable
from tests.integration.conformance import CONFORMANCE

pytestmark = pytest.mark.integration

PROJECT = ROOT / "clients" / "godot"
GENERATOR = PROJECT / "tools" / "generate_messages.py"
GENERATED = PROJECT / "addons" / "mythic" / "generated" / "messages.gd"
SOCKET = PROJECT / "addons" / "mythic" / "mythic_socket.gd"
DOC = ROOT / "docs" / "engines" / "godot.md"
# The examples whose marked regions are the page's code, in the page's order.
EXAMPLES = (
    PROJECT / "examples" / "first_npc.gd",
    PROJECT / "examples" / "talking_face.gd",
    PROJECT / "examples" / "tavern.gd",
)
UNIT_TESTS = PROJECT / "test" / "unit_tests.gd"
PEER_TESTS = PROJECT / "test" / "peer_tests.gd"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_messages", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's JSON Schema, as `mythic schema export` writes it."""
    out = tmp_path_factory.mktemp("schema")
    subprocess.run(
        [sys.executable, "-m", "mythic", "schema", "export", "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return out


def test_the_generated_definitions_match_the_schema(schema: Path, tmp_path: Path) -> None:
    """Regenerating from `mythic schema export` gives the checked-in file, byte for byte: a
    contract changed without regenerating fails here."""
    out = tmp_path / "messages.gd"
    subprocess.run(
        [sys.executable, str(GENERATOR), "--schema", str(schema), "--out", str(out)],
        check=True,
        cwd=ROOT,
    )
    assert out.read_bytes() == GENERATED.read_bytes(), (
        "clients/godot/addons/mythic/generated/messages.gd differs from `mythic schema export`: "
        "run `mythic schema export --out /tmp/schema && python "
        "clients/godot/tools/generate_messages.py --schema /tmp/schema`"
    )


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(protocol: dict[str, Any]) -> None:
        node: Any = protocol["$defs"]
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            _set(("Cutoff", "properties", "turn_id", "format"), "uuid"),
            "Cutoff.turn_id: the keyword 'format' is not translated",
        ),
        (_set(("Ack", "minProperties"), 2), "Ack: the keyword 'minProperties' is not translated"),
        (
            _set(("Ack", "allOf", 0, "unevaluatedProperties"), False),
            "Ack.allOf[0]: the keyword 'unevaluatedProperties' is not translated",
        ),
        (
            _set(("Ack", "allOf", 0, "then", "minProperties"), 2),
            "Ack.allOf[0].then: the keyword 'minProperties' is not translated",
        ),
        (
            _set(("Ack", "allOf", 0, "then"), None),
            "Ack.allOf[0]: a rule is an if with a then or an else",
        ),
    ],
    ids=["field", "definition", "rule", "rule part", "rule without then"],
)
def test_the_generator_refuses_what_it_cannot_translate(
    schema: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None], error: str
) -> None:
    """A keyword the generator does not know fails the generation: it is never dropped (a
    field's, a definition's, a cross-field rule's)."""
    protocol = json.loads((schema / "mythic-v1.schema.json").read_text())
    change(protocol)
    for name in ("mythic-v1-client.schema.json", "mythic-v1-server.schema.json"):
        shutil.copy(schema / name, tmp_path / name)
    (tmp_path / "mythic-v1.schema.json").write_text(json.dumps(protocol))
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--schema", str(tmp_path), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert error in result.stderr
    assert not (tmp_path / "x").exists()


def test_only_patterns_a_greedy_run_check_gets_right_become_segments() -> None:
    generator = _generator()
    assert generator._segments("^[A-Za-z][A-Za-z0-9_.]{0,63}$") == [
        ["ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", 1, 1],
        ["ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.", 0, 63],
    ]
    assert generator._segments("^[a-c]{1,3}[c]$") is None  # greedy would take the c
    assert generator._segments("^([01][0-9]|2[0-3]):[0-5][0-9]$") is None
    assert generator._segments("\\S") is None


@pytest.fixture(scope="module")
def godot() -> str:
    """Godot 3's headless runtime (Debian's godot3-server)."""
    found = shutil.which("godot3-server")
    if found is None:
        unavailable(
            "the Godot addon's tests need Godot 3 headless: sudo apt-get install godot3-server"
        )
    assert found is not None
    return found


# The server's start (speech models included), the clips, and every scenario: a long test.
@pytest.mark.timeout(1800)
def test_the_addon_passes_its_tests_and_plays_the_conformance_suite(
    godot: str, conformance_url: str, conformance_audio: Path
) -> None:
    """The headless runner prints one line per test; every unit and peer test, every scenario
    and the example pass, and no script error was raised on the way (the addon never crashes the
    game's loop, whatever the server sends)."""
    result = subprocess.run(
        [godot, "--no-window", "--path", str(PROJECT), "-s", "res://test/run_tests.gd"],
        capture_output=True,
        text=True,
        timeout=1500,
        env={
            **os.environ,
            "MYTHIC_URL": conformance_url,
            "MYTHIC_CONFORMANCE_DIR": str(CONFORMANCE / "scenarios"),
            "MYTHIC_CONFORMANCE_AUDIO": str(conformance_audio),
        },
        check=False,
    )
    report = result.stdout + result.stderr
    passed = set(re.findall(r"^ok - conformance: (\w+)$", report, re.MULTILINE))
    assert passed == {p.stem for p in (CONFORMANCE / "scenarios").glob("*.json")}, report[-6000:]
    for kind, tests in (("unit", UNIT_TESTS), ("peer", PEER_TESTS)):
        ran = set(re.findall(rf"^ok - {kind}: (\w+)$", report, re.MULTILINE))
        assert ran == set(re.findall(r"^func test_(\w+)\(", tests.read_text(), re.MULTILINE))
    assert "ok - example: a first NPC line with a tool handler" in report, report[-6000:]
    assert "ok - example: a tavern scene" in report, report[-6000:]
    assert "# fail 0" in report and result.returncode == 0, report[-6000:]
    assert "SCRIPT ERROR" not in report, report[-6000:]


def _public_funcs(source: str) -> set[str]:
    return {f for f in re.findall(r"^func (\w+)\(", source, re.MULTILINE) if f[0] != "_"}


def test_the_docs_code_is_the_tested_example() -> None:
    """Each marked region of the examples (run by the test above: the first line against the
    server, the talking face on a recorded line) is a code block of the engine page, as it is;
    the page's Godot 4 socket has the methods of the Godot 3 one the addon uses."""
    regions = [
        region
        for example in EXAMPLES
        for region in re.findall(
            r"# --8<-- \[start:([\w-]+)\]\n(.*?)\n\s*# --8<-- \[end:\1\]",
            example.read_text(),
            re.DOTALL,
        )
    ]
    page, godot4 = DOC.read_text().split("\n## Godot 4\n")
    blocks = re.findall(r"```gdscript\n(.*?)```", page, re.DOTALL)
    assert [name for name, _ in regions] == ["tool-handler", "first-line", "lip-sync", "tavern"]
    assert [textwrap.dedent(code).strip() for _, code in regions] == [b.strip() for b in blocks]
    (socket4,) = re.findall(r"```gdscript\n(.*?)```", godot4, re.DOTALL)
    assert _public_funcs(socket4) == _public_funcs(SOCKET.read_text())
