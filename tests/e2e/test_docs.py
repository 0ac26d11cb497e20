"""The docs as a newcomer follows them, and the README's numbers against their results files.

Every fenced block of a docs page that follows a `<!-- tested -->` line runs here against the
installed package and the example world: `bash` blocks with the virtual environment's `bin`
first on the PATH, `python` blocks with this interpreter. The one block marked
`<!-- tested: server -->` (the quickstart's `make run`) is started as a process, waited for
until `/readyz` answers, talked to by the other blocks (the pages' `127.0.0.1:8765` becomes its
address), then stopped with Ctrl-C. Blocks run in a scratch folder that links to `examples/`,
so a page that writes a world writes it there; a block that starts with `make` runs in the
checkout, where the Makefile is. The model is SmolLM2 with short replies, to keep the pages'
runtime small; the pages are about the commands, not the replies.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tools.docs_gen import README, readme_with_summary

from tests.conftest import ROOT, served_address

pytestmark = pytest.mark.e2e

DOCS = ROOT / "docs"
# The newcomer's path, in the order a newcomer reads it: later pages use the quickstart's server.
PATH = ("quickstart.md", "talk-to-an-npc.md", "add-an-npc.md", "connect-a-game.md")
DOCUMENTED_ADDRESS = "127.0.0.1:8765"
MARKED = re.compile(
    r"^<!-- tested(?:: (?P<how>server))? -->\n```(?P<lang>\w+)\n(?P<code>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)
ENV = {
    "MYTHIC_ENGINE__DIALOGUE_MODEL": "smollm2-135m-instruct",
    "MYTHIC_CHAT__MAX_TOKENS": "24",
    "MYTHIC_CHAT__TEMPERATURE": "0",
    "MYTHIC_SERVER__PORT": "0",
    "NO_MKDOCS_2_WARNING": "1",
}
BLOCK_TIMEOUT_S = 240


@dataclass(frozen=True, slots=True)
class Block:
    """A tested block of a page: its language, its code, and whether it is the server."""

    page: str
    line: int
    lang: str
    code: str
    server: bool

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line}"


def marked_blocks(page: str) -> list[Block]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return [
        Block(
            page,
            text.count("\n", 0, found.start()) + 1,
            found["lang"],
            found["code"],
            found["how"] == "server",
        )
        for found in MARKED.finditer(text)
    ]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A newcomer's folder: the repository's examples, and room to write a world."""
    folder = tmp_path_factory.mktemp("newcomer")
    (folder / "examples").symlink_to(ROOT / "examples")
    return folder


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    data = tmp_path_factory.mktemp("data")
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        **ENV,
        "MYTHIC_MEMORY__DATA_DIR": str(data),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _server_block() -> Block:
    servers = [b for page in PATH for b in marked_blocks(page) if b.server]
    assert len(servers) == 1, f"one block of the newcomer's path starts the server: {servers}"
    return servers[0]


@pytest.fixture(scope="module")
def address(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The quickstart's server, started with the page's own command."""
    block = _server_block()
    # stderr goes to a file: llama.cpp logs a lot, and a full pipe would block the server.
    log = (tmp_path_factory.mktemp("server") / "stderr.log").open("w+b")
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,  # make and the server it starts stop together
    )
    assert proc.stdout is not None
    try:
        served = served_address(proc, time.monotonic() + 300, str(block))
        yield served
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the page says
        proc.wait(60)  # make reports the interrupt in its exit status; the server's log says
        log.seek(0)
        assert b"Traceback" not in log.read(), "Ctrl-C did not stop the server cleanly"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        proc.stdout.close()
        log.close()


def run_block(block: Block, cwd: Path, env: dict[str, str], address: str) -> str:
    code = block.code.replace(DOCUMENTED_ADDRESS, address)
    if block.lang == "python":
        script = cwd / f"{Path(block.page).stem}_{block.line}.py"
        script.write_text(code, encoding="utf-8")
        command = [sys.executable, str(script)]
    else:
        assert block.lang == "bash", f"{block}: only bash and python blocks can be tested"
        command = ["bash", "-euo", "pipefail", "-c", code]
    result = subprocess.run(
        command,
        cwd=ROOT if code.lstrip().startswith("make ") else cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"{block} failed:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, f"{block}:\n{result.stderr}"
    return result.stdout


def test_the_newcomers_path_is_tested() -> None:
    """Each page of the path has tested blocks, and the quickstart starts the server."""
    for page in PATH:
        assert marked_blocks(page), f"docs/{page} has no tested block"
    assert _server_block().page == "quickstart.md"


# What each page's blocks print, all together, when they work as the page says (an NPC's line
# is shown under its id or its card's name: either way, the name is in it).
PRINTS = {
    "quickstart.md": ("200", "marla"),
    "talk-to-an-npc.md": ("marla", '"text":', "["),
    "add-an-npc.md": ("OK", "wren"),
    "connect-a-game.md": ('<game> set_waypoint {"target": "blackfen_marsh"}', "grisk means to:"),
}


@pytest.mark.parametrize("page", PATH)
def test_page(page: str, workdir: Path, env: dict[str, str], address: str) -> None:
    printed = "".join(
        run_block(block, workdir, env, address) for block in marked_blocks(page) if not block.server
    )
    for text in PRINTS[page]:
        assert text.lower() in printed.lower(), f"docs/{page}: {text!r} not in\n{printed}"


def test_readme_performance_summary_matches_the_results() -> None:
    """Every number of the README's summary is what `bench/results/` says today."""
    readme = README.read_text(encoding="utf-8")
    assert readme_with_summary(readme) == readme, (
        "the README's performance summary differs from bench/results: "
        "run `python tools/docs_gen.py --readme`"
    )


def test_readme_is_short() -> None:
    assert len(README.read_bytes()) < 12_000


def test_the_code_the_docs_name_exists() -> None:
    """Every `mythic.package.Name` the README, ARCHITECTURE.md or a docs page names imports."""
    pages = [README, ROOT / "ARCHITECTURE.md", *DOCS.rglob("*.md")]
    named = {
        (found[1], page.name)
        for page in pages
        for found in re.finditer(r"`(mythic(?:\.\w+)+)(?:\(\))?`", page.read_text("utf-8"))
        if not found[1].endswith(".yaml")
    }
    missing = [(name, page) for name, page in sorted(named) if not _resolves(name)]
    assert not missing, f"the docs name code that does not exist: {missing}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False
