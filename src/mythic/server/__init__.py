"""`mythic serve`: a world's NPCs over the v1 protocol on WebSocket (`/v1/ws`) and HTTP.

    from mythic.server import Gateway, create_app

    app = create_app(Gateway(settings, world, engine))   # any ASGI server runs it

`serve` loads the models and runs it on uvicorn. Needs the `server` extra.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from mythic._extras import require

if TYPE_CHECKING:
    from collections.abc import Callable

    from mythic.config import MythicSettings

require("fastapi", package="fastapi", extra="server")
require("uvicorn", package="uvicorn", extra="server")
require("prometheus_client", package="prometheus-client", extra="server")

from mythic.server._app import Gateway, GatewayMetrics, SayReply, SayRequest, create_app  # noqa: E402
from mythic.server._sessions import Session, SessionError, Sessions  # noqa: E402

__all__ = [
    "Gateway",
    "GatewayMetrics",
    "SayReply",
    "SayRequest",
    "Session",
    "SessionError",
    "Sessions",
    "bind",
    "create_app",
    "serve",
]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    settings: MythicSettings,
    world_path: str,
    *,
    announce: Callable[[str], None] = print,
) -> None:
    """Load the world and models, then serve until interrupted (Ctrl-C shuts down cleanly).

    Raises:
        WorldLoadError, ModelError: the world or a model cannot be loaded.
        OSError: the address is in use.
    """
    import uvicorn

    from mythic.engine import Engine
    from mythic.knowledge import load_world

    world = load_world(world_path)
    server_settings = settings.server
    sock = bind(server_settings.host, server_settings.port)
    engine = Engine.load(settings.engine)
    intent_engine = None
    try:
        if settings.engine.intent_model != settings.engine.dialogue_model:
            intent_engine = Engine.load(settings.engine, settings.engine.intent_model)
        gateway = Gateway(settings, world, engine, intent_engine)
        app = create_app(gateway)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        announce(f"Mythic is serving {world.name} on http://{shown}:{port}")
        announce(f"  WebSocket: ws://{shown}:{port}/v1/ws   (v1 protocol; SessionStart first)")
        first = sorted(world.npcs)[0] if world.npcs else "npc"
        announce(
            f"  talk:      mythic chat --server ws://{shown}:{port}/v1/ws --npc {first}\n"
            f"  or:        curl -s -X POST http://{shown}:{port}/v1/npcs/{first}/say "
            "-H 'content-type: application/json' -d '{\"text\": \"Hello\"}'\n"
            f"  NPCs: {', '.join(sorted(world.npcs))}"
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            ws_max_size=4 * server_settings.max_frame_bytes,
            ws_ping_interval=20,
            ws_ping_timeout=20,
            timeout_graceful_shutdown=5,
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        engine.close()
        if intent_engine is not None:
            intent_engine.close()
