"""Where Mythic keeps its files by default (the XDG base directories)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Mythic's cache: `$XDG_CACHE_HOME/mythic`, by default `~/.cache/mythic`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mythic"


def default_data_dir() -> Path:
    """Mythic's data: `$XDG_DATA_HOME/mythic`, by default `~/.local/share/mythic`."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mythic"
