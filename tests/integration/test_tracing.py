"""A trace per turn over the real server, the real models and the example world: a spoken
turn's hops in one trace (an in-memory exporter, the SDK's own), a text turn's spans received
by a real OTLP/HTTP collector on loopback (its protobuf decoded with opentelemetry-proto),
nothing exported when nothing is configured, and a collector that never answers delaying no
turn."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mythic.client import MythicClient
from mythic.config import MythicSettings
from mythic.contracts import VoiceFormat
from mythic.engine import Engine
from mythic.observability import Traces, TurnTrace
from tests.integration.test_server import engines, running, until
from tests.integration.test_voice import said, voice_server

pytestmark = pytest.mark.integration
__all__ = ["engines"]  # the fixture, used by name

OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
TEXT_CHAT = {"max_tokens": 24, "temperature": 0.0}


@pytest.fixture(autouse=True)
def _no_collector_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver on loopback: each POST to /v1/traces decoded."""

    url: str
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def spans(self) -> list[dict[str, Any]]:
        """Every span received: its name, ids (hex) and attributes, and its resource's."""
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = _values(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        out.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex() or None,
                                "attributes": _values(span.attributes),
                                "resource": resource,
                            }
                        )
        return out


def _values(attributes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for kv in attributes:
        kind = kv.value.WhichOneof("value")
        values[kv.key] = getattr(kv.value, kind) if kind else None
    return values


@contextlib.contextmanager
def collector() -> Iterator[Collector]:
    received = Collector(url="")

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received.paths.append(self.path)
            received.requests.append(ExportTraceServiceRequest.FromString(body))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    received.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Blackhole:
    """A collector that takes connections and never answers."""

    url: str
    accepted: threading.Event = field(default_factory=threading.Event)


@contextlib.contextmanager
def blackhole() -> Iterator[Blackhole]:
    listener = socket.create_server(("127.0.0.1", 0))
    hole = Blackhole(url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)  # read nothing, answer nothing
            hole.accepted.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield hole
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def _trace_of(traces: Traces, turn_id: str, *hops: str) -> TurnTrace | None:
    """The turn's kept trace once its `hops` have ended, else None."""
    for trace in traces.recent(50):
        if trace.turn_id == turn_id and set(hops) <= {name for name, _ in trace.spans}:
            return trace
    return None


async def _kept(traces: Traces, turn_id: str, *hops: str) -> TurnTrace:
    await until(lambda: _trace_of(traces, turn_id, *hops) is not None, timeout_s=60)
    trace = _trace_of(traces, turn_id, *hops)
    assert trace is not None
    return trace


def _parents(spans: list[ReadableSpan]) -> dict[str, set[str | None]]:
    """Hop -> the hops its spans are children of."""
    names = {s.context.span_id: s.name for s in spans if s.context is not None}
    parents: dict[str, set[str | None]] = {}
    for span in spans:
        parent = None if span.parent is None else names.get(span.parent.span_id, "?")
        parents.setdefault(span.name, set()).add(parent)
    return parents


async def test_a_spoken_turn_is_one_trace_of_every_hop(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    memory = InMemorySpanExporter()
    async with (
        # A reply started at the player's pause (preemptive) is traced from its actor hop:
        # this turn is answered once the player's line is final, through every hop.
        voice_server(engines, settings, dialogue={"preempt_spoken_lines": False}) as (
            address,
            gateway,
        ),
        MythicClient(f"ws://{address}/v1/ws", voice=VoiceFormat(), timeout_s=60) as client,
        asyncio.timeout(300),
    ):
        gateway.traces.export(memory)
        question = await said(gateway, "Is the tavern open tonight?")
        turn = await client.talk("marla", question)
        await turn.wait(180)
        kept = await _kept(gateway.traces, turn.turn_id, "gateway", "actor", "tts")
        assert await asyncio.to_thread(gateway.traces.flush)
    assert turn.text.strip() and turn.chunks  # the turn was spoken
    spans = [
        s
        for s in memory.get_finished_spans()
        if (s.attributes or {}).get("turn_id") == turn.turn_id
    ]
    hops = {s.name for s in spans}
    assert {"gateway", "asr", "actor", "retrieval", "engine", "tts"} <= hops, hops
    assert {s.context.trace_id for s in spans if s.context is not None} == {int(kept.trace_id, 16)}
    for span in spans:
        attributes = span.attributes or {}
        assert attributes["session_id"] == client.session_id
        assert attributes["npc_id"] == "marla"
    parents = _parents(spans)
    assert parents["gateway"] == {None}
    assert parents["asr"] == {"gateway"} and parents["actor"] == {"gateway"}
    assert parents["retrieval"] == parents["engine"] == parents["tts"] == {"actor"}
    root = next(s for s in spans if s.name == "gateway")
    assert (root.attributes or {})["source"] == "voice"
    tts = next(s for s in spans if s.name == "tts")
    assert [e.name for e in tts.events] == ["first_audio"]
    assert (tts.attributes or {})["chunks"] == len(turn.chunks)
    assert [name for name, _ in kept.spans][:2] == ["gateway", "asr"]  # in start order


async def test_a_text_turns_spans_reach_a_real_otlp_collector(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    with collector() as otlp:
        async with running(
            engines, settings, chat=TEXT_CHAT, observability={"otlp_endpoint": otlp.url}
        ) as (address, gateway):
            assert gateway.traces.url == f"{otlp.url}/v1/traces"
            async with MythicClient(f"ws://{address}/v1/ws") as client, asyncio.timeout(180):
                turn = await client.say("marla", "Is the tavern open tonight?")
                await turn.reply()
            kept = await _kept(gateway.traces, turn.turn_id, "gateway", "actor", "engine")
            assert await asyncio.to_thread(gateway.traces.flush)
    assert set(otlp.paths) == {"/v1/traces"}
    spans = [s for s in otlp.spans() if s["attributes"].get("turn_id") == turn.turn_id]
    assert {"gateway", "actor", "retrieval", "engine"} <= {s["name"] for s in spans}
    assert {s["trace_id"] for s in spans} == {kept.trace_id}
    by_id = {s["span_id"]: s["name"] for s in spans}
    for span in spans:
        assert span["attributes"]["session_id"] == client.session_id
        assert span["attributes"]["npc_id"] == "marla"
        assert span["resource"]["service.name"] == "mythic"
        expected = {"gateway": None, "actor": "gateway"}.get(span["name"], "actor")
        assert (by_id.get(span["parent"]) if span["parent"] else None) == expected, span
    engine = next(s for s in spans if s["name"] == "engine" and s["attributes"]["finish_reason"])
    assert engine["attributes"]["prompt_tokens"] > 0
    assert engine["attributes"]["priority"] in {"gold", "speaking", "silver"}


async def test_without_otlp_nothing_is_exported_and_turns_go_on(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    with collector() as otlp:  # listening, but named by no setting and no variable
        async with running(engines, settings, chat=TEXT_CHAT) as (address, gateway):
            assert gateway.traces.url is None
            async with MythicClient(f"ws://{address}/v1/ws") as client, asyncio.timeout(180):
                turn = await client.say("marla", "Good evening!")
                await turn.reply()
                async with httpx.AsyncClient(base_url=f"http://{address}", timeout=120) as http:
                    said_over_http = (
                        await http.post("/v1/npcs/marla/say", json={"text": "And to you?"})
                    ).json()
            await _kept(gateway.traces, turn.turn_id, "gateway", "actor", "engine")
            over_http = await _kept(gateway.traces, said_over_http["turn_id"], "gateway", "actor")
            assert await asyncio.to_thread(gateway.traces.flush)
    assert turn.text.strip() and said_over_http["text"]
    assert over_http.npc_id == "marla" and len(over_http.trace_id) == 32
    assert otlp.requests == []


async def test_a_collector_that_never_answers_delays_no_turn(
    engines: tuple[Engine, Engine], settings: MythicSettings
) -> None:
    with blackhole() as hole:
        async with running(
            engines,
            settings,
            chat=TEXT_CHAT,
            observability={"otlp_endpoint": hole.url, "otlp_timeout_s": 3.0},
        ) as (address, gateway):
            async with MythicClient(f"ws://{address}/v1/ws") as client, asyncio.timeout(180):
                first = await client.say("marla", "Good evening!")
                await first.reply()
                # The first turn's spans are being exported now, to a collector that will
                # never answer; the next turn is played all the same.
                await until(hole.accepted.is_set, timeout_s=30)
                second = await client.say("marla", "Is the tavern open tonight?")
                await second.reply()
            for turn in (first, second):
                await _kept(gateway.traces, turn.turn_id, "gateway", "actor", "engine")
    assert first.finish_reason in {"stop", "length"}
    assert second.finish_reason in {"stop", "length"}
