"""What every command shares: the consoles, errors as messages, the settings, a server's API."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from mythic._errors import MythicError
from mythic.config import MythicSettings, load_settings

# markup=False: NPC names, player lines and paths may contain [brackets] that are not markup.
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

T = TypeVar("T")


def load_config(config: Path | None) -> MythicSettings:
    """The settings from `config` (or the default file), the environment and the defaults."""
    return guard(lambda: load_settings(config))


def guard(fn: Callable[[], T]) -> T:
    """Run `fn`; a Mythic or validation error becomes a clear message and exit status 2, not
    a traceback."""
    try:
        return fn()
    except MythicError as exc:
        err.print(f"error: {exc}", style="bold red")
        raise typer.Exit(2) from None
    except ValidationError as exc:
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "value"
            err.print(f"error: {where}: {e['msg']}", style="bold red")
        raise typer.Exit(2) from None


def log_to_stderr(level: str) -> None:
    """Mythic's own log records at `level` and above to stderr, with their time and source;
    other libraries' at warning and above."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("mythic").setLevel(level.upper())


def call_server(method: str, url: str, body: Any = None) -> Any:
    """A running server's JSON answer to `method url`; a failure is printed, exit status 2."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        err.print(f"error: {url}: {exc.code} {exc.read().decode(errors='replace')}", style="red")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        err.print(f"error: {url}: {exc}", style="bold red")
    raise typer.Exit(2)
