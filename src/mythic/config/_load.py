"""Loading the settings: a YAML file, the environment and the defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mythic._errors import MythicError
from mythic.config._mythic import MythicSettings, file_values

DEFAULT_CONFIG_FILE = Path("mythic.yaml")


class ConfigError(MythicError):
    """The configuration file or an environment variable holds an invalid value."""


def _resolve_config_file(config_file: str | Path | None) -> Path | None:
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"configuration file {path} does not exist")
        return path
    env = os.environ.get("MYTHIC_CONFIG")
    if env:
        return _resolve_config_file(env)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (engine:, chat:, world:), "
            f"got a {type(data).__name__}"
        )
    return data


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> MythicSettings:
    """Build the effective settings.

    Args:
        config_file: a YAML file; default `MYTHIC_CONFIG`, else `./mythic.yaml` if present.
        **overrides: section values that win over everything else.

    Raises:
        ConfigError: the file is not valid YAML or a value is invalid; the message names the
            file and the setting.
    """
    path = _resolve_config_file(config_file)
    where = f"{path}" if path else "environment"
    token = file_values.set(_read_yaml(path) if path else {})
    try:
        return MythicSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration ({where}): {problems}") from exc
    finally:
        file_values.reset(token)
