"""The TypeScript SDK (`clients/typescript`): its generated message types match the server's
JSON Schema, it compiles, and its Node tests pass: the scripted-peer tests and the whole
conformance suite against a real `mythic serve` on loopback (one server for all scenarios).

Node and npm are the toolchain (`make setup` installs them as Debian packages when root):
where they are missing these tests skip, and fail under CI=true.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, unavailable
from tests.integration.conformance import CONFORMANCE

pytestmark = pytest.mark.integration

PACKAGE = ROOT / "clients" / "typescript"
DOC = ROOT / "docs" / "engines" / "typescript.md"
EXAMPLE = PACKAGE / "examples" / "first_npc.ts"
TAVERN = PACKAGE / "examples" / "tavern.ts"
GENERATED = PACKAGE / "src" / "generated"


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run a command in the package; its output, or a failure that shows it."""
    result = subprocess.run(
        args,
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert result.returncode == 0, (
        f"{' '.join(args)}:\n{result.stdout[-8000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


def _export_schema(out: Path) -> None:
    """The server's JSON Schema, as `mythic schema export --out` writes it."""
    subprocess.run(
        [sys.executable, "-m", "mythic", "schema", "export", "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def npm() -> str:
    """npm, with the package's locked dependencies installed (`npm ci`)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("the TypeScript SDK needs Node 20+ and npm: sudo apt-get install nodejs npm")
    assert npm is not None
    major = int(_run("node", "--version").strip().lstrip("v").split(".")[0])
    if major < 20:
        unavailable(f"the TypeScript SDK needs Node 20 or newer, this is Node {major}")
    _run(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
    return npm


def test_the_generated_types_match_the_schema(npm: str, tmp_path: Path) -> None:
    """Regenerating from `mythic schema export` gives the checked-in files, byte for byte: a
    contract changed without `npm run generate` fails here."""
    del npm
    schema, out = tmp_path / "schema", tmp_path / "generated"
    _export_schema(schema)
    _run("node", "scripts/generate.mjs", "--schema", str(schema), "--out", str(out))
    checked_in = sorted(p.name for p in GENERATED.iterdir())
    assert sorted(p.name for p in out.iterdir()) == checked_in
    _, drifted, missing = filecmp.cmpfiles(GENERATED, out, checked_in, shallow=False)
    assert not drifted and not missing, (
        f"{drifted + missing} differ from `mythic schema export`: in clients/typescript run "
        "`mythic schema export --out /tmp/schema && node scripts/generate.mjs --schema /tmp/schema`"
    )


def test_a_message_added_to_the_schema_is_a_message_of_the_sdk(npm: str, tmp_path: Path) -> None:
    """`ClientMessage` and `ServerMessage` come from the generated types and schemas: a server
    message added to the schema is a `ServerMessage` once regenerated, and not a
    `ClientMessage`, with no list in the SDK's code to edit (the package compiles with it)."""
    del npm
    schema, package = tmp_path / "schema", tmp_path / "package"
    _export_schema(schema)
    for name in ("mythic-v1.schema.json", "mythic-v1-server.schema.json"):
        doc = json.loads((schema / name).read_text())
        emote = json.loads(json.dumps(doc["$defs"]["NPCState"]).replace("NPCState", "Emote"))
        doc["$defs"]["Emote"] = emote
        doc["oneOf"].append({"$ref": "#/$defs/Emote"})
        doc["discriminator"]["mapping"]["Emote"] = "#/$defs/Emote"
        (schema / name).write_text(json.dumps(doc))
    shutil.copytree(PACKAGE / "src", package / "src", ignore=shutil.ignore_patterns("generated"))
    shutil.copy(PACKAGE / "tsconfig.json", package)
    (package / "node_modules").symlink_to(PACKAGE / "node_modules")
    _run(
        "node",
        "scripts/generate.mjs",
        "--schema",
        str(schema),
        "--out",
        str(package / "src" / "generated"),
    )
    (package / "src" / "emote.ts").write_text(
        textwrap.dedent("""\
            import type { ClientMessage, ServerMessage } from "./index.js";
            const emote = {
              schema_version: "v1", type: "Emote", npc_id: "marla", state: "idle",
            } as const;
            export const heard: ServerMessage = emote;
            // @ts-expect-error a message of the server is not one a client sends
            export const sent: ClientMessage = emote;
        """)
    )
    _run(
        "node",
        str(PACKAGE / "node_modules" / "typescript" / "bin" / "tsc"),
        "-p",
        str(package),
        "--noEmit",
    )


# The server's start (speech models included), the clips, and every scenario: a long test.
@pytest.mark.timeout(1500)
def test_the_sdk_builds_and_plays_the_conformance_suite(
    npm: str, conformance_url: str, conformance_audio: Path
) -> None:
    """`npm test` compiles the package (`dist/`, as published) and its tests, then runs them."""
    env = {
        "MYTHIC_URL": conformance_url,
        "MYTHIC_CONFORMANCE_DIR": str(CONFORMANCE / "scenarios"),
        "MYTHIC_CONFORMANCE_AUDIO": str(conformance_audio),
    }
    report = _run(npm, "test", env=env, timeout=900)
    passed = set(re.findall(r"^ok \d+ - conformance: (\w+)$", report, re.MULTILINE))
    assert passed == {p.stem for p in (CONFORMANCE / "scenarios").glob("*.json")}, report[-4000:]
    assert "# fail 0" in report, report[-4000:]


def test_the_docs_code_is_the_tested_example() -> None:
    """Each marked region of the examples (run by `example.test.ts`, `tavern.test.ts`;
    `lip-sync` by `lipsync.test.ts`) is a code block of the engine page, as it is: the page
    shows code that ran."""
    source = EXAMPLE.read_text() + TAVERN.read_text()
    regions = re.findall(
        r"// --8<-- \[start:([\w-]+)\]\n(.*?)\n\s*// --8<-- \[end:\1\]", source, re.DOTALL
    )
    blocks = re.findall(r"```ts\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert [name for name, _ in regions] == ["tool-handler", "first-line", "lip-sync", "tavern"]
    assert [textwrap.dedent(code).strip() for _, code in regions] == [b.strip() for b in blocks]
