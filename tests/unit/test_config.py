from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mythic.config import ChatSettings, ConfigError, load_settings

pytestmark = pytest.mark.unit


def test_defaults(no_config_env: Path) -> None:
    settings = load_settings()
    assert settings.engine.dialogue_model == "qwen2.5-coder-0.5b-instruct"
    assert settings.engine.intent_model == "smollm2-135m-instruct"
    assert settings.engine.bronze_model == "auto"
    assert settings.chat.history_turns == 16
    assert settings.world.path is None


def test_yaml_file_then_environment_then_code(
    no_config_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (no_config_env / "mythic.yaml").write_text(
        "engine:\n  n_ctx: 3072\n  dialogue_model: smollm2-135m-instruct\nchat:\n  max_tokens: 64\n"
    )
    settings = load_settings()  # ./mythic.yaml is picked up
    assert settings.engine.n_ctx == 3072
    assert settings.chat.max_tokens == 64
    monkeypatch.setenv("MYTHIC_ENGINE__N_CTX", "1024")
    settings = load_settings()
    assert settings.engine.n_ctx == 1024  # environment wins over the file
    assert settings.engine.dialogue_model == "smollm2-135m-instruct"  # the rest of the file stays
    assert load_settings(world={"path": "w"}).world.path == Path("w")


def test_explicit_file_and_mythic_config(
    no_config_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = no_config_env / "other.yaml"
    other.write_text("chat:\n  temperature: 0.2\n")
    assert load_settings(other).chat.temperature == 0.2
    monkeypatch.setenv("MYTHIC_CONFIG", str(other))
    assert load_settings().chat.temperature == 0.2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine:\n  n_ctx: lots\n", "engine.n_ctx"),
        ("engine:\n  n_ctx: 10\n", "engine.n_ctx"),
        ("engine:\n  warp_drive: true\n", "engine.warp_drive"),
        ("chat:\n  temperature: 9\n", "chat.temperature"),
        ("engine:\n  chat_format: alpaca\n", "engine.chat_format"),
        ("engine: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("just text\n", "expected a mapping"),
        ("engine: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("dialogue:\n  first_phrase_words: 2\n", r"dialogue\.first_phrase_words.*at least 3"),
        ("dialogue:\n  first_phrase_words: -1\n", r"dialogue\.first_phrase_words.*greater than"),
        ("dialogue:\n  prepare_step_tokens: -1\n", r"dialogue\.prepare_step_tokens.*greater"),
        ("dialogue:\n  prepare_step_tokens: 99999\n", r"dialogue\.prepare_step_tokens.*less"),
        ("dialogue:\n  prepare_step_tokens: lots\n", r"dialogue\.prepare_step_tokens"),
    ],
)
def test_invalid_files_name_the_setting(no_config_env: Path, text: str, message: str) -> None:
    path = no_config_env / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(path)
    assert "bad.yaml" in str(info.value)


def test_invalid_environment_value(no_config_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYTHIC_CHAT__MAX_TOKENS", "-5")
    with pytest.raises(ConfigError, match=r"chat\.max_tokens"):
        load_settings()


def test_missing_file(no_config_env: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(no_config_env / "nope.yaml")


def test_chat_dry_defaults_and_ranges(no_config_env: Path) -> None:
    chat = load_settings().chat
    assert chat.dry_multiplier == 0.8
    assert (chat.dry_base, chat.dry_allowed_length, chat.dry_penalty_last_n) == (1.75, 2, -1)
    assert chat.dry_sequence_breakers == ["\n", ":", '"', "*"]
    assert load_settings(chat={"dry_multiplier": 0}).chat.dry_multiplier == 0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"dry_multiplier": -0.1}, r"chat\.dry_multiplier.*greater than or equal to 0"),
        ({"dry_multiplier": "strong"}, r"chat\.dry_multiplier.*valid number"),
        ({"dry_base": 0.9}, r"chat\.dry_base.*greater than or equal to 1"),
        ({"dry_allowed_length": 0}, r"chat\.dry_allowed_length.*greater than or equal to 1"),
        ({"dry_penalty_last_n": -2}, r"chat\.dry_penalty_last_n.*greater than or equal to -1"),
        ({"dry_sequence_breakers": ["\n", ""]}, r"chat\.dry_sequence_breakers\.1.*at least 1"),
    ],
)
def test_invalid_dry_settings_name_the_setting(
    no_config_env: Path, values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match="(?s)" + message.removeprefix(r"chat\.")):
        ChatSettings(**values)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        load_settings(chat=values)
