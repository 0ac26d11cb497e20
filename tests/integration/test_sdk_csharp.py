"""The C# / Unity SDK (`clients/unity`): its generated message types match the server's JSON
Schema, its core compiles without Unity, and its NUnit tests pass on Mono: the scripted-peer
tests, the lip-sync tests on a recorded TTS chunk, the sample, and the whole conformance suite
against a real `mythic serve` on loopback (the server the other players meet).

Mono, its C# compiler, NUnit and Newtonsoft.Json are the toolchain (Debian packages
mono-devel, nunit-console, libnunit-cil-dev, libnewtonsoft-json-cil-dev); the generator needs
Node and npm. Where they are missing these tests skip, and fail under CI=true. The
MonoBehaviours (`Runtime/Unity`, the sample's `*Behaviour.cs`) need UnityEngine and are not
compiled here.
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.conftest import ROOT, unavailable
from tests.integration.conformance import CONFORMANCE

pytestmark = pytest.mark.integration

PACKAGE = ROOT / "clients" / "unity"
BUILD = PACKAGE / ".build"
GENERATOR = PACKAGE / "Generator~"
GENERATED = PACKAGE / "Runtime" / "Generated"
DOC = ROOT / "docs" / "engines" / "unity.md"
EXAMPLE = PACKAGE / "Samples~" / "FirstNpc" / "FirstNpc.cs"
TAVERN = PACKAGE / "Samples~" / "Tavern" / "Tavern.cs"
NEWTONSOFT = Path("/usr/lib/cli/Newtonsoft.Json-5.0/Newtonsoft.Json.dll")
NUNIT = Path("/usr/lib/cli/nunit.framework-2.6.3/nunit.framework.dll")
NETSTANDARD = Path("/usr/lib/mono/4.5/Facades/netstandard.dll")
UNITY_DECLARATIONS = ROOT / "tests" / "integration" / "csharp" / "UnityEngine.cs"
TOOLCHAIN = "mono-devel nunit-console libnunit-cil-dev libnewtonsoft-json-cil-dev"


def _run(*args: str, cwd: Path = PACKAGE, env: dict[str, str] | None = None) -> str:
    """Run a command; its output, or a failure that shows it."""
    result = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert result.returncode == 0, (
        f"{' '.join(args)}:\n{result.stdout[-8000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


def _unity_free(path: Path) -> bool:
    return "Unity" not in path.relative_to(PACKAGE).parts[:2] and not path.name.endswith(
        "Behaviour.cs"
    )


@pytest.fixture(scope="module")
def build() -> Path:
    """The core (`Mythic.Client.dll`) and the tests with the sample, compiled by Mono's C#
    compiler into `clients/unity/.build` (gitignored), warnings as errors."""
    tools = [shutil.which(t) for t in ("mcs", "mono", "nunit-console")]
    if None in tools or not all(p.exists() for p in (NEWTONSOFT, NUNIT, NETSTANDARD)):
        unavailable(f"the C# SDK needs Mono, NUnit, Newtonsoft.Json: apt-get install {TOOLCHAIN}")
    BUILD.mkdir(exist_ok=True)
    core = sorted(str(p) for p in (PACKAGE / "Runtime").rglob("*.cs") if _unity_free(p))
    tests = sorted(str(p) for p in (PACKAGE / "Tests").glob("*.cs"))
    sample = sorted(str(p) for p in (PACKAGE / "Samples~").rglob("*.cs") if _unity_free(p))
    refs = [f"-r:{NEWTONSOFT}", f"-r:{NETSTANDARD}"]
    flags = ["-target:library", "-warnaserror", "-debug"]
    _run("mcs", *flags, f"-out:{BUILD / 'Mythic.Client.dll'}", *refs, *core)
    _run(
        "mcs",
        *flags,
        f"-out:{BUILD / 'Mythic.Client.Tests.dll'}",
        f"-r:{BUILD / 'Mythic.Client.dll'}",
        f"-r:{NUNIT}",
        *refs,
        *tests,
        *sample,
    )
    for dll in (NEWTONSOFT, NUNIT):
        shutil.copy(dll, BUILD / dll.name)
    return BUILD


def test_the_core_uses_no_unity_types() -> None:
    """Everything but the thin MonoBehaviours compiles without UnityEngine (the `build`
    fixture compiles exactly these files); the MonoBehaviours are where Unity is."""
    sources = list(PACKAGE.rglob("*.cs"))  # (UnityEngine's declarations live outside it)
    unity = sorted(str(p.relative_to(PACKAGE)) for p in sources if "UnityEngine" in p.read_text())
    assert unity == [
        "Runtime/Unity/MythicConnection.cs",
        "Runtime/Unity/NPCSpeaker.cs",
        "Samples~/FirstNpc/FirstNpcBehaviour.cs",
    ]
    assert all(not _unity_free(PACKAGE / p) for p in unity)


def test_the_monobehaviours_and_the_sample_scene_script_compile_against_the_core(
    build: Path, tmp_path: Path
) -> None:
    """`MythicConnection`, `NPCSpeaker` and the sample's `FirstNpcBehaviour` compile against the
    core assembly built above: every call they make into the SDK is checked. Unity's own
    assemblies are not to be had here, so UnityEngine is the declarations of the members they
    use (`tests/integration/csharp/UnityEngine.cs`, from Unity's scripting reference)."""
    unity = tmp_path / "UnityEngine.dll"
    _run("mcs", "-target:library", "-warnaserror", f"-out:{unity}", str(UNITY_DECLARATIONS))
    scripts = sorted(str(p) for p in PACKAGE.rglob("*.cs") if "UnityEngine" in p.read_text())
    assert len(scripts) == 3, scripts
    _run(
        "mcs",
        "-target:library",
        "-warnaserror",
        f"-out:{tmp_path / 'Mythic.Client.Unity.dll'}",
        f"-r:{build / 'Mythic.Client.dll'}",
        f"-r:{unity}",
        f"-r:{NEWTONSOFT}",
        f"-r:{NETSTANDARD}",
        *scripts,
        str(EXAMPLE),  # the sample's plain C#, which its MonoBehaviour calls
    )


def test_the_generated_types_match_the_schema(tmp_path: Path) -> None:
    """Regenerating from `mythic schema export` gives the checked-in files, byte for byte: a
    contract changed without `node generate.mjs` fails here."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        unavailable("the C# SDK's generator needs Node 20+ and npm: apt-get install nodejs npm")
    _run("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", cwd=GENERATOR)
    schema, out = tmp_path / "schema", tmp_path / "generated"
    _run(sys.executable, "-m", "mythic", "schema", "export", "--out", str(schema), cwd=ROOT)
    _run("node", "generate.mjs", "--schema", str(schema), "--out", str(out), cwd=GENERATOR)
    # Unity's .meta files beside them are not the generator's (tools/unity_meta.py writes them).
    checked_in = sorted(p.name for p in GENERATED.iterdir() if p.suffix != ".meta")
    assert sorted(p.name for p in out.iterdir()) == checked_in
    _, drifted, missing = filecmp.cmpfiles(GENERATED, out, checked_in, shallow=False)
    assert not drifted and not missing, (
        f"{drifted + missing} differ from `mythic schema export`: in clients/unity/Generator~ run "
        "`mythic schema export --out /tmp/schema && node generate.mjs --schema /tmp/schema`"
    )


# The server's start (speech models included), the clips, and every scenario: a long test.
@pytest.mark.timeout(1500)
def test_the_sdk_passes_its_tests_and_plays_the_conformance_suite(
    build: Path, conformance_url: str, conformance_audio: Path
) -> None:
    """NUnit runs every test of the SDK against the real server: each passes, none is left
    out, and the conformance suite's every scenario is among them."""
    env = {
        "MYTHIC_URL": conformance_url,
        "MYTHIC_CONFORMANCE_DIR": str(CONFORMANCE / "scenarios"),
        "MYTHIC_UNITY_FIXTURES": str(PACKAGE / "Tests" / "Fixtures"),
        "MYTHIC_CONFORMANCE_AUDIO": str(conformance_audio),
    }
    result = build / "result.xml"
    result.unlink(missing_ok=True)
    report = _run(
        "nunit-console", "-nologo", "Mythic.Client.Tests.dll", f"-xml={result}", cwd=build, env=env
    )
    cases = ElementTree.parse(result).getroot().iter("test-case")
    outcomes = {case.get("name", ""): case.get("result") for case in cases}
    assert outcomes and set(outcomes.values()) == {"Success"}, (outcomes, report[-4000:])
    played = {
        Path(m.group(1)).stem
        for name in outcomes
        if (m := re.search(r'\.Conformance\("(.+)"\)$', name))
    }
    assert played == {p.stem for p in (CONFORMANCE / "scenarios").glob("*.json")}, outcomes


def test_the_docs_code_is_the_tested_example() -> None:
    """Each marked region of the samples (run by ExampleTests.cs) is a code block of the engine
    page, as it is: the page shows code that ran."""
    source = EXAMPLE.read_text() + TAVERN.read_text()
    regions = re.findall(
        r"// --8<-- \[start:([\w-]+)\]\n(.*?)\n\s*// --8<-- \[end:\1\]", source, re.DOTALL
    )
    blocks = re.findall(r"```csharp\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert [name for name, _ in regions] == [
        "connect",
        "tool-handler",
        "first-line",
        "lip-sync",
        "tavern",
    ]
    assert [textwrap.dedent(code).strip() for _, code in regions] == [b.strip() for b in blocks]
