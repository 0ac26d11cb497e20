"""`mythic serve`: a world's NPCs over the v1 protocol on WebSocket (`/v1/ws`) and HTTP.

    from mythic.server import Gateway, create_app

    app = create_app(Gateway(settings, world, engine))   # any ASGI server runs it

`serve` loads the models and runs it on uvicorn until Ctrl-C; `serving` runs a gateway on
uvicorn inside the running event loop (tests, benchmarks, a tool that embeds Mythic). Needs
the `server` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from mythic._extras import require

if TYPE_CHECKING:
    from collections.abc import Callable

    import uvicorn

    from mythic.config import MythicSettings

require("fastapi", package="fastapi", extra="server")
require("uvicorn", package="uvicorn", extra="server")
require("prometheus_client", package="prometheus-client", extra="server")

from mythic.server._app import Gateway, GatewayMetrics, SayReply, SayRequest  # noqa: E402
from mythic.server._asgi import create_app  # noqa: E402
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
    "serving",
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


def _uvicorn_config(app: Any, gateway: Gateway) -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(
        app,
        log_level="warning",
        # Frames up to 4x the protocol's cap still arrive, to be answered `frame_too_large`.
        ws_max_size=4 * gateway.settings.server.max_frame_bytes,
        ws_ping_interval=20,
        ws_ping_timeout=20,
        timeout_graceful_shutdown=5,
    )


@contextlib.asynccontextmanager
async def serving(
    gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0, ready_timeout_s: float = 120
) -> AsyncIterator[tuple[str, int]]:
    """Serve `gateway` on uvicorn in the running event loop; yields the bound (host, port)
    once it accepts connections and its engines are warmed, and shuts it down on exit.

    Raises:
        TimeoutError: the server was not ready within `ready_timeout_s`.
        OSError: the address is in use.
    """
    import uvicorn

    sock = bind(host, port)
    server = uvicorn.Server(_uvicorn_config(create_app(gateway), gateway))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(ready_timeout_s):
            while not (server.started and gateway.ready):
                if task.done():
                    task.result()  # startup failed: raise its error
                    raise RuntimeError("uvicorn stopped during startup")
                await asyncio.sleep(0.01)
        bound_host, bound_port = sock.getsockname()[:2]
        yield bound_host, bound_port
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(30):
                await task
        finally:
            sock.close()


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

    from mythic.jobs import open_queue
    from mythic.knowledge import load_world
    from mythic.route import open_router

    world = load_world(world_path, max_lore_bytes=settings.knowledge.max_lore_bytes)
    for problem in world.skipped:
        announce(f"lore skipped: {problem}")
    server_settings = settings.server
    sock = bind(server_settings.host, server_settings.port)
    engines: list[Any] = []
    try:
        router, engines = open_router(settings)
        for name, tier in router.route.tiers.items():
            where = ", ".join(_describe(router, e) for e in tier.endpoints)
            announce(f"  tier {name}: {where}")
        memory = None
        if settings.memory.enabled:
            from mythic.memory import Memory

            memory = Memory(settings.memory)
        jobs = open_queue(settings.jobs, settings.memory.data_dir)
        gateway = Gateway(settings, world, router=router, jobs=jobs, memory=memory)
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
            f"  jobs:      mythic jobs submit lore --topic 'The Sunken Bell'   ({jobs.where})\n"
            f"  NPCs: {', '.join(sorted(world.npcs))}"
        )
        uvicorn.Server(_uvicorn_config(app, gateway)).run(sockets=[sock])
    finally:
        sock.close()
        for engine in engines:
            engine.close()


def _describe(router: Any, name: str) -> str:
    endpoint = router.states[name].endpoint
    if endpoint.settings.url:
        return f"{name} ({endpoint.settings.model} at {endpoint.settings.url})"
    return f"{name} ({endpoint.engine.backend.name}, embedded)"
