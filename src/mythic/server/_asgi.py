"""The FastAPI app of a gateway: its HTTP and WebSocket routes, the one handler of the errors
they raise, and a lifespan that runs the gateway."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from mythic.server._app import Gateway
from mythic.server._dashboard import dashboard_routes
from mythic.server._proposals import mount_proposals
from mythic.server._routes_http import HTTP_STATUS, refuse, routes
from mythic.server._socket import socket_routes


def create_app(gateway: Gateway, *, warm: bool = True) -> FastAPI:
    """The FastAPI app of `gateway`. With `warm`, the engines are warmed at startup and
    `/readyz` turns 200 when that is done."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with gateway.run(warm=warm):
            yield

    app = FastAPI(
        title="Mythic",
        summary="NPCs that talk, remember and act: the v1 protocol over WebSocket and HTTP.",
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    for error in HTTP_STATUS:
        app.add_exception_handler(error, refuse)
    app.include_router(routes)
    app.include_router(socket_routes)
    mount_proposals(app)
    app.include_router(dashboard_routes)
    return app
