"""`mythic voice` and `mythic chat --voice`, run as a user would."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_WORLD
from tests.e2e.test_cli import mythic
from tests.integration.test_voice import _speech_available

pytestmark = pytest.mark.e2e


def _seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        return wav.getnframes() / wav.getframerate()


def test_voice_list_and_preview(tmp_path: Path) -> None:
    _speech_available()
    listed = mythic("voice", "list")
    assert listed.returncode == 0, listed.stderr
    for voice in ("human", "vampire", "zombie", "lich", "werewolf"):
        assert re.search(rf"^{voice}\s", listed.stdout, re.M), listed.stdout
    out = tmp_path / "vampire.wav"
    made = mythic("voice", "preview", "vampire", "Good evening, traveller.", "-o", str(out))
    assert made.returncode == 0, made.stderr
    assert 0.8 < _seconds(out) < 10
    bad = mythic("voice", "preview", "nobody", "Hello.", "-o", str(tmp_path / "x.wav"))
    assert bad.returncode == 2 and "unknown voice 'nobody'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_chat_by_voice_hears_the_question_and_writes_the_spoken_reply(tmp_path: Path) -> None:
    _speech_available()
    question = tmp_path / "question.wav"
    made = mythic("voice", "preview", "human", "Is the tavern open tonight?", "-o", str(question))
    assert made.returncode == 0, made.stderr
    reply = tmp_path / "reply.wav"
    result = mythic(
        "chat",
        "--world",
        str(EXAMPLE_WORLD),
        "--npc",
        "marla",
        "--voice",
        str(question),
        "-o",
        str(reply),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"you \(heard\)> .*tavern", result.stdout, re.I), result.stdout
    assert re.search(r"^marla> \S", result.stdout, re.M), result.stdout
    assert "first_audio" in result.stdout
    assert _seconds(reply) > 0.3
