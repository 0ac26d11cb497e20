"""`mythic serve` as a user runs it: a real process on loopback, talked to by `mythic chat
--server`, the example client script, and plain HTTP; Ctrl-C shuts it down cleanly."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import EXAMPLE_WORLD, ROOT
from tests.e2e.test_cli import mythic

pytestmark = pytest.mark.e2e

# SmolLM2 talks (fast), and so decides too: the server as a user starts it with one model.
ENV = {
    "MYTHIC_ENGINE__DIALOGUE_MODEL": "smollm2-135m-instruct",
    "MYTHIC_CHAT__MAX_TOKENS": "32",
    "MYTHIC_CHAT__TEMPERATURE": "0",
}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    # stderr goes to a file: llama.cpp logs a lot, and a full pipe would block the server.
    log = (tmp_path_factory.mktemp("serve") / "stderr.log").open("w+b")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mythic", "serve", "--world", str(EXAMPLE_WORLD), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=ROOT,
        env={**os.environ, **ENV},
    )
    assert proc.stdout is not None
    proc.stderr = log  # type: ignore[assignment]  # read back by the Ctrl-C test
    try:
        seen = b""
        deadline = time.monotonic() + 180
        while b"NPCs: " not in seen:  # the last line of the announcement
            assert proc.poll() is None, seen.decode()
            assert time.monotonic() < deadline, seen.decode()
            ready, _, _ = select.select([proc.stdout], [], [], 5)
            if ready:
                seen += os.read(proc.stdout.fileno(), 4096)
        found = re.search(rb"on http://([\d.]+:\d+)", seen)
        assert found is not None and b"mythic chat --server ws://" in seen, seen.decode()
        address = found.group(1).decode()
        with httpx.Client(base_url=f"http://{address}") as http:
            while http.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, "the server never became ready"
                time.sleep(0.1)
        yield address, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stdout.close()
        log.close()


def test_chat_through_the_server(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    address, _ = served
    result = mythic(
        "chat",
        "--server",
        f"ws://{address}/v1/ws",
        "--npc",
        "marla",
        "--say",
        "Good evening!",
        "--say",
        "Is the tavern open tonight?",
        env=ENV,
    )
    assert result.returncode == 0, result.stderr
    replies = [line for line in result.stdout.splitlines() if line.startswith("marla: ")]
    assert len(replies) == 2 and all(len(r) > len("marla: ") for r in replies), result.stdout


def test_the_example_client_script(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    address, _ = served
    result = subprocess.run(
        [
            sys.executable,
            "examples/talk_to_npc.py",
            f"ws://{address}/v1/ws",
            "marla",
            "Which way to Blackfen Marsh? Set a waypoint to blackfen_marsh for me.",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '<game> set_waypoint {"target": "blackfen_marsh"}' in result.stdout, result.stdout
    assert "[stop]" in result.stdout or "[length]" in result.stdout
    assert "<intent> marla navigation" in result.stdout


def test_the_tavern_scene_example(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    """examples/tavern_scene.py: the player's lines answered by the NPC named or faced, an
    NPC leaving and coming back, the NPCs talking among themselves, the scene ended."""
    address, _ = served
    result = subprocess.run(
        [sys.executable, "examples/tavern_scene.py", f"ws://{address}/v1/ws"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "in the tavern: marla, captain_strand, countess_isolde" in out, out
    assert "  captain_strand (name): " in out and "  countess_isolde (to): " in out, out
    assert "the captain leaves: marla, countess_isolde" in out, out
    assert "  marla (ambient): " in out, out
    assert "the captain is back: marla, countess_isolde, captain_strand" in out, out
    assert "scene over: the player left the tavern" in out, out
    assert out.count("[stop]") + out.count("[length]") >= 4, out


def test_http_say_and_a_bad_request(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    address, _ = served
    with httpx.Client(base_url=f"http://{address}", timeout=240) as http:
        reply = http.post("/v1/npcs/bran/say", json={"text": "Hello!"})
        assert reply.status_code == 200 and reply.json()["text"]
        assert http.post("/v1/npcs/nobody/say", json={"text": "Hello!"}).status_code == 404
        assert http.post("/v1/npcs/bran/say", json={"txt": "Hello!"}).status_code == 422
        assert "mythic_turns_total" in http.get("/metrics").text


def test_ctrl_c_stops_the_server_cleanly(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    _, proc = served
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert proc.stderr is not None
    proc.stderr.seek(0)
    logged = proc.stderr.read()
    assert b"Traceback" not in logged
    # server.log_level info: Mythic's own records, with their time, level and source.
    assert re.search(rb"\d\d:\d\d:\d\d,\d+ INFO +mythic\.server\._app: warmed up", logged), logged


def test_serve_refuses_a_port_in_use() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = mythic(
            "serve", "--world", str(EXAMPLE_WORLD), "--port", str(port), env=ENV, timeout=120
        )
    assert result.returncode == 2
    assert "cannot listen on 127.0.0.1" in result.stderr


def test_serve_refuses_a_bad_log_level() -> None:
    result = mythic("serve", "--world", str(EXAMPLE_WORLD), "--log-level", "loud", timeout=60)
    assert result.returncode == 2
    assert "log_level" in result.stderr and "Traceback" not in result.stderr
