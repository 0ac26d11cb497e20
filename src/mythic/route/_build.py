"""Building a router from settings: one embedded engine per distinct model, remote endpoints
over HTTP."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from mythic.config import EndpointSettings, EngineSettings, MythicSettings, effective_route
from mythic.engine import PACKAGED_MODELS, Engine, ModelStore
from mythic.route._endpoints import EmbeddedEndpoint, Endpoint, OpenAIEndpoint
from mythic.route._router import Router

log = logging.getLogger(__name__)


def resolve_model(model: str, engine: EngineSettings) -> str:
    """A model name with `auto` (bronze) resolved: the largest packaged chat model that is
    fetched and verified, else the dialogue model."""
    if model != "auto":
        return model
    store = ModelStore(engine.models_dir)
    for spec in sorted(PACKAGED_MODELS, key=lambda m: m.size, reverse=True):
        if spec.chat_format is not None and store.status(spec).verified:
            return spec.name
    return engine.dialogue_model


def engine_sizes(
    endpoints: Iterable[EndpointSettings], engine: EngineSettings
) -> dict[str, dict[str, int]]:
    """`n_ctx` and `max_sequences` of each embedded model's engine: the largest its endpoints
    ask for, an endpoint that sets neither asking for the engine settings' own."""
    sizes: dict[str, dict[str, int]] = {}
    for endpoint in endpoints:
        if endpoint.url is not None:
            continue
        size = sizes.setdefault(resolve_model(endpoint.model, engine), {})
        for key, value, default in (
            ("n_ctx", endpoint.n_ctx, engine.n_ctx),
            ("max_sequences", endpoint.max_sequences, engine.max_sequences),
        ):
            size[key] = max(size.get(key, 0), default if value is None else value)
    return sizes


def open_router(
    settings: MythicSettings, *, engines: Mapping[str, Engine] | None = None
) -> tuple[Router, list[Engine]]:
    """The router of `settings.route` (with the embedded defaults), and the engines it loaded
    (the caller closes them after the router).

    `engines` maps model names to engines already loaded; they are used instead of loading
    the model again, and are not in the returned list.

    Raises:
        ModelError: an embedded model cannot be loaded.
    """
    route = effective_route(settings)
    loaded: dict[str, Engine] = dict(engines or {})
    owned: list[Engine] = []
    endpoints: dict[str, Endpoint] = {}
    sizes = engine_sizes(route.endpoints.values(), settings.engine)
    try:
        for name, endpoint in route.endpoints.items():
            if endpoint.url is not None:
                endpoints[name] = OpenAIEndpoint(name, endpoint)
                continue
            model = resolve_model(endpoint.model, settings.engine)
            engine = loaded.get(model)
            if engine is None:
                log.info("loading %s for endpoint %s", model, name)
                engine = Engine.load(settings.engine.model_copy(update=sizes[model]), model)
                loaded[model] = engine
                owned.append(engine)
            endpoints[name] = EmbeddedEndpoint(name, endpoint, engine)
    except BaseException:
        for engine in owned:
            engine.close()
        raise
    return Router(route, endpoints), owned


def local_router(
    settings: MythicSettings, engine: Engine, intent_engine: Engine | None = None
) -> Router:
    """A router over engines the caller loaded: every embedded endpoint on `engine`, except
    gold's default on `intent_engine` when given. Remote endpoints as configured."""
    route = effective_route(settings)
    endpoints: dict[str, Endpoint] = {}
    for name, endpoint in route.endpoints.items():
        endpoints[name] = _endpoint(name, endpoint, engine, intent_engine)
    return Router(route, endpoints)


def _endpoint(
    name: str, settings: EndpointSettings, engine: Engine, intent_engine: Engine | None
) -> Endpoint:
    if settings.url is not None:
        return OpenAIEndpoint(name, settings)
    if name == "embedded-gold" and intent_engine is not None:
        return EmbeddedEndpoint(name, settings, intent_engine)
    return EmbeddedEndpoint(name, settings, engine)
