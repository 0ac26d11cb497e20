"""`observability`: the traces of each turn, and where they are sent."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from mythic.config._section import Section

TRACES_PATH = "/v1/traces"
"""What OTLP/HTTP appends to a collector's base URL for traces."""


def check_url(url: str) -> str:
    """`url` if it is an http:// or https:// URL with a host.

    Raises:
        ValueError: it is not.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{url!r} is not an http:// or https:// URL with a host, like http://localhost:4318"
        )
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise ValueError(f"{url!r} has a port that is not a number") from None
    return url


class ObservabilitySettings(Section):
    """What Mythic reports about itself beyond /metrics: an OpenTelemetry trace per turn."""

    otlp_endpoint: str | None = None
    """Where to send the turns' traces, over OTLP/HTTP (protobuf): a collector's base URL,
    `/v1/traces` appended (Jaeger, Grafana Tempo and the OpenTelemetry Collector take it on
    port 4318: `http://localhost:4318`). None: the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    (the whole URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL) environment variable, when
    set; else nothing is exported. Spans go out in batches from a thread of their own: a slow
    or unreachable collector never delays a turn (what it cannot take is dropped)."""

    otlp_headers: dict[str, str] = Field(default_factory=dict)
    """Headers sent with each export (a collector's API key); empty: the standard
    `OTEL_EXPORTER_OTLP_HEADERS` variable, if set."""

    otlp_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """How long one export may wait for the collector before its batch is dropped."""

    service_name: str = Field(default="mythic", min_length=1, max_length=128)
    """The `service.name` the traces carry (one per server, to tell a cluster's apart)."""

    recent_turns: int = Field(default=200, ge=1, le=100_000)
    """Turns whose trace the server keeps in memory, whether or not it exports them (the
    dashboard's recent turns)."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint_is_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)

    @model_validator(mode="after")
    def _environment_is_url(self) -> ObservabilitySettings:
        # The standard variables are checked when the settings are built, so that a bad one is
        # a settings error (naming the variable), not an export failing later.
        self.traces_url()
        return self

    def traces_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The URL the traces are sent to: `otlp_endpoint` with `/v1/traces`, else the
        standard OTLP variables of `environ` (default: the process's); None: not exported.

        Raises:
            ValueError: the variable that names it holds no http(s) URL (checked when the
                settings are built, too).
        """
        if self.otlp_endpoint is not None:
            return self.otlp_endpoint.rstrip("/") + TRACES_PATH
        env = os.environ if environ is None else environ
        if url := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
            return _from_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
        if url := env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
            return _from_env("OTEL_EXPORTER_OTLP_ENDPOINT", url).rstrip("/") + TRACES_PATH
        return None


def _from_env(name: str, url: str) -> str:
    try:
        return check_url(url)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
