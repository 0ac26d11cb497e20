"""The `mythic` command driven as a user would: a real process, real models, real files."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_WORLD, ROOT

pytestmark = pytest.mark.e2e

SMALL = "smollm2-135m-instruct"


def mythic(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mythic", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        check=False,
    )


def test_models_verify_reports_every_packaged_model_ok() -> None:
    result = mythic("models", "verify")
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma3-270m"):
        assert f"{name}: OK" in result.stdout


def test_models_list_shows_sizes_licences_and_status() -> None:
    result = mythic("models", "list")
    assert result.returncode == 0, result.stderr
    assert "qwen2.5-coder-0.5b-instruct" in result.stdout
    assert "Apache-2.0" in result.stdout and "Gemma Terms of Use" in result.stdout
    assert "verified" in result.stdout


def test_fetch_is_idempotent() -> None:
    result = mythic("models", "fetch")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ready") == 3


def test_config_show_merges_file_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "m.yaml"
    config.write_text("chat:\n  max_tokens: 77\nengine:\n  n_ctx: 2048\n")
    result = mythic("config", "show", "--config", str(config), env={"MYTHIC_ENGINE__N_CTX": "1024"})
    assert result.returncode == 0, result.stderr
    assert "max_tokens: 77" in result.stdout
    assert "n_ctx: 1024" in result.stdout


def test_world_check_reports_the_file_and_line_without_a_traceback(tmp_path: Path) -> None:
    ok = mythic("world", "check", str(EXAMPLE_WORLD))
    assert ok.returncode == 0 and "OK" in ok.stdout
    (tmp_path / "npcs").mkdir()
    (tmp_path / "world.yaml").write_text("name: W\ndescription: d\n")
    (tmp_path / "npcs" / "bob.yaml").write_text("name: Bob\narchetype: human\nsytle: rude\n")
    bad = mythic("world", "check", str(tmp_path))
    assert bad.returncode == 2
    assert "bob.yaml:3: sytle" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_chat_streams_a_reply_for_each_line() -> None:
    result = mythic(
        "chat",
        "--world",
        str(EXAMPLE_WORLD),
        "--npc",
        "marla",
        "--model",
        SMALL,
        stdin="Good evening!\n\nWhat do you serve?\n/quit\nnever read\n",
        env={"MYTHIC_CHAT__MAX_TOKENS": "30"},
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.count("Marla, the Barkeep:") == 3
    )  # the empty line gets an error, then goes on
    assert "say something" in result.stderr
    assert "never read" not in result.stdout


def test_chat_with_the_default_dialogue_model() -> None:
    result = mythic(
        "chat",
        "--world",
        str(EXAMPLE_WORLD),
        "--npc",
        "marla",
        "--say",
        "Who are you?",
        env={"MYTHIC_CHAT__MAX_TOKENS": "30"},
    )
    assert result.returncode == 0, result.stderr
    assert "qwen2.5-coder-0.5b-instruct" in result.stderr
    reply = result.stdout.split("Marla, the Barkeep:", 1)[1]
    assert reply.strip()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--npc", "nobody"], "no NPC 'nobody'"),
        (["--npc", "marla", "--model", "/etc/hostname"], "not a GGUF model file"),
        (["--npc", "marla", "--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--npc", "marla", "--model", "gemma3-270m"], "no chat template"),
    ],
)
def test_chat_errors_are_clear(args: list[str], message: str) -> None:
    result = mythic("chat", "--world", str(EXAMPLE_WORLD), *args, "--say", "hi")
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_model_names_the_fix(tmp_path: Path) -> None:
    result = mythic(
        "chat",
        "--world",
        str(EXAMPLE_WORLD),
        "--npc",
        "marla",
        "--say",
        "hi",
        env={"MYTHIC_ENGINE__MODELS_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "mythic models fetch qwen2.5-coder-0.5b-instruct" in result.stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cuts_the_npc_off_and_the_chat_goes_on() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mythic", "chat", "--world", str(EXAMPLE_WORLD), "--npc", "marla"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "MYTHIC_CHAT__MAX_TOKENS": "400", "MYTHIC_CHAT__TEMPERATURE": "0"},
        # Ctrl-C as a terminal sends it, even where this suite runs with SIGINT ignored (a
        # background job of a script: the chat would inherit that and never hear it).
        preexec_fn=_default_sigint,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"Tell me the whole history of Ravenmoor, every year of it.\n")
        proc.stdin.flush()
        seen = b""
        deadline = time.monotonic() + 120
        # Interrupt the turn once it is under way (the NPC's name is printed, and flushed, as
        # it begins; its reply is a few seconds long): a short reply can stream whole faster
        # than a signal sent after its first words arrives.
        while b"Barkeep: " not in seen:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([proc.stdout], [], [], 5)
            if ready:
                seen += os.read(proc.stdout.fileno(), 4096)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(b"Thanks.\n/quit\n", timeout=120)
    finally:
        proc.kill()
    text = (seen + out).decode()
    assert proc.returncode == 0, err.decode()
    assert "[cut off]" in text
    assert text.count("Marla, the Barkeep:") == 2  # the next line is answered
