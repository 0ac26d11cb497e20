"""`mythic serve` and `mythic usage`: serve a world's NPCs, and what a running server has done."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mythic._errors import MythicError
from mythic.cli._console import call_server, err, guard, load_config, log_to_stderr, out
from mythic.cli._options import ConfigOption, JsonOption
from mythic.config import ServerSettings


def serve(
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")],
    host: Annotated[
        str | None, typer.Option("--host", help="Interface (default: server.host).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="TCP port, 0 for any (default: server.port).")
    ] = None,
    voice: Annotated[
        bool | None,
        typer.Option(
            "--voice/--no-voice",
            help="Serve voice sessions: speech in and out (default: speech.enabled).",
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="debug, info, warning or error: what Mythic logs to stderr "
            "(default: server.log_level, info: each voice turn's latency trace).",
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Serve the world's NPCs over WebSocket (/v1/ws) and HTTP until Ctrl-C."""
    settings = load_config(config)
    server = settings.server.model_copy(
        update={k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    )
    if log_level is not None:
        update = server.model_dump() | {"log_level": log_level.lower()}
        server = guard(lambda: ServerSettings.model_validate(update))
    log_to_stderr(server.log_level)
    speech = settings.speech
    if voice is not None:
        speech = speech.model_copy(update={"enabled": voice})
    settings = settings.model_copy(update={"server": server, "speech": speech})

    def run() -> None:
        from mythic.server import serve as serve_world

        err.print(f"Loading {world} and {settings.engine.dialogue_model} ...")
        try:
            serve_world(settings, str(world), announce=lambda line: out.print(line))
        except KeyboardInterrupt:
            # uvicorn has shut down gracefully and re-raised Ctrl-C: that is a clean stop.
            err.print("Stopped.")
        except OSError as exc:
            raise MythicError(f"cannot listen on {server.host}:{server.port}: {exc}") from exc

    guard(run)


def usage(
    server: Annotated[
        str, typer.Option("--server", "-s", help="The server's HTTP address.")
    ] = "http://127.0.0.1:8765",
    as_json: JsonOption = False,
) -> None:
    """Requests, tokens and model time per tier and per NPC, from a running server."""
    data = call_server("GET", f"{server.rstrip('/')}/v1/usage")
    if as_json:
        out.print(json.dumps(data, indent=2))
        return
    for title, rows in (("tier", data["tiers"]), ("npc", data["npcs"])):
        out.print(
            f"{title:<16} {'requests':>9} {'prompt tok':>11} {'gen tok':>9} {'seconds':>9}"
            "  outcomes"
        )
        for name, row in rows.items():
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items()))
            out.print(
                f"{name:<16} {row['requests']:>9} {row['prompt_tokens']:>11} "
                f"{row['completion_tokens']:>9} {row['seconds']:>9.2f}  {outcomes}"
            )
        out.print("")
