"""A trace per turn: the hops' spans, their parents and ids, the recent turns kept in memory,
export only when configured, and the settings that say where to."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from mythic.config import ConfigError, MythicSettings, ObservabilitySettings, load_settings
from mythic.observability import Traces, current, hop, hop_of, playing, traced

pytestmark = pytest.mark.unit

IDS = ("s-1", "marla", "t-1")


@pytest.fixture
def exported() -> Iterator[tuple[Traces, InMemorySpanExporter]]:
    traces = Traces(keep=3)
    memory = InMemorySpanExporter()
    traces.export(memory)
    with traces.serving():
        yield traces, memory
    traces.close()


def _spans(traces: Traces, memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    assert traces.flush()
    return {span.name: span for span in memory.get_finished_spans()}


async def _turn(traces: Traces, ids: tuple[str, str, str] = IDS) -> None:
    """A turn as the server plays it: the line arrives, the actor plays it (retrieval, an
    engine request ended on the engine's thread), the reply is spoken, the final goes out."""
    session_id, npc_id, turn_id = ids
    traces.begin(session_id, npc_id, turn_id, source="websocket")
    with playing(session_id, npc_id, turn_id, priority="speaking") as actor:
        assert actor is not None
        with traced("retrieval") as retrieval:
            assert retrieval is not None
            await asyncio.to_thread(time.sleep, 0.001)
        engine = hop("engine", prompt_tokens=12)
        assert engine is not None

        def finish() -> None:  # as the engine's worker thread does
            engine.set(finish_reason="stop")
            engine.end()

        worker = threading.Thread(target=finish)
        worker.start()
        worker.join()
        tts = hop_of("tts", session_id, npc_id, turn_id, voice="human")
        assert tts is not None
        actor.set(finish_reason="stop")
    traces.end(session_id, npc_id, turn_id, finish_reason="stop")
    tts.end()  # speech goes on after the text is done


async def test_a_turn_is_one_trace_of_its_hops_each_with_the_turns_ids(
    exported: tuple[Traces, InMemorySpanExporter],
) -> None:
    traces, memory = exported
    before = time.time()
    await _turn(traces)
    spans = _spans(traces, memory)
    assert set(spans) == {"gateway", "actor", "retrieval", "engine", "tts"}
    trace_ids = {s.context.trace_id for s in spans.values() if s.context is not None}
    assert len(trace_ids) == 1
    for span in spans.values():
        attributes = dict(span.attributes or {})
        assert (attributes["session_id"], attributes["npc_id"], attributes["turn_id"]) == IDS

    def parent(name: str) -> str | None:
        span = spans[name]
        if span.parent is None:
            return None
        return next(
            n for n, s in spans.items() if s.context and s.context.span_id == span.parent.span_id
        )

    assert parent("gateway") is None
    assert parent("actor") == "gateway"
    assert {parent("retrieval"), parent("engine"), parent("tts")} == {"actor"}
    assert (spans["engine"].attributes or {})["finish_reason"] == "stop"
    assert (spans["actor"].attributes or {})["priority"] == "speaking"

    [kept] = traces.recent(10)
    assert kept.trace_id == f"{trace_ids.pop():032x}" and len(kept.trace_id) == 32
    assert (kept.session_id, kept.npc_id, kept.turn_id) == IDS
    assert before <= kept.started <= time.time()
    assert [name for name, _ in kept.spans] == ["gateway", "actor", "retrieval", "engine", "tts"]
    assert all(ms >= 0 for _, ms in kept.spans)


async def test_the_recent_turns_are_bounded_and_newest_first(
    exported: tuple[Traces, InMemorySpanExporter],
) -> None:
    traces, _ = exported
    for n in range(5):
        await _turn(traces, ("s-1", "marla", f"t-{n}"))
    assert [t.turn_id for t in traces.recent(10)] == ["t-4", "t-3", "t-2"]
    assert [t.turn_id for t in traces.recent(1)] == ["t-4"]
    assert traces.recent(0) == []


async def test_a_turn_without_a_gateway_hop_is_rooted_at_its_actor(
    exported: tuple[Traces, InMemorySpanExporter],
) -> None:
    traces, memory = exported
    with playing("s-1", "marla", "ambient-1") as actor:
        assert actor is not None
        engine = hop("engine")
        assert engine is not None
        engine.end()
    spans = _spans(traces, memory)
    assert spans["actor"].parent is None and spans["engine"].parent is not None
    assert [t.turn_id for t in traces.recent(5)] == ["ambient-1"]


async def test_work_outside_a_turn_and_without_a_server_is_not_traced(
    exported: tuple[Traces, InMemorySpanExporter],
) -> None:
    traces, memory = exported
    # A prefill, an intent, a warm-up: no turn is being played here.
    assert hop("engine") is None
    assert hop_of("tts", "s-1", "marla", "never-began") is None
    with traced("retrieval") as retrieval:
        assert retrieval is None
    traces.end("s-1", "marla", "never-began")  # nothing to end: nothing happens
    assert _spans(traces, memory) == {}
    assert traces.recent(5) == []


def test_nothing_traces_when_no_server_serves() -> None:
    assert current() is None
    with playing(*IDS) as actor:
        assert actor is None
        assert hop("engine") is None
    assert hop_of("tts", *IDS) is None


async def test_a_failed_hop_says_why_and_the_turn_goes_on(
    exported: tuple[Traces, InMemorySpanExporter],
) -> None:
    traces, memory = exported
    traces.begin(*IDS)
    with (
        pytest.raises(asyncio.CancelledError),
        playing(*IDS),
        traced("retrieval"),
    ):
        raise asyncio.CancelledError  # a barge-in while the lore was being looked up
    traces.end(*IDS, error="refused")
    spans = _spans(traces, memory)
    assert spans["retrieval"].status.description == "CancelledError"
    assert spans["actor"].status.description == "CancelledError"
    assert spans["gateway"].status.description == "refused"


async def test_a_reused_turn_id_ends_the_old_turn(
    exported: tuple[Traces, InMemorySpanExporter],
) -> None:
    traces, memory = exported
    traces.begin(*IDS)
    traces.begin(*IDS)
    traces.end(*IDS)
    assert traces.flush()
    ended = [s for s in memory.get_finished_spans() if s.name == "gateway"]
    assert len(ended) == 2
    assert len({s.context.trace_id for s in ended if s.context is not None}) == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_an_unreachable_collector_fails_no_turn() -> None:
    traces = Traces(url=f"http://127.0.0.1:{_closed_port()}/v1/traces", timeout_s=1.0)
    with traces.serving():
        for n in range(3):
            await _turn(traces, ("s-1", "marla", f"t-{n}"))
    assert [t.turn_id for t in traces.recent(5)] == ["t-2", "t-1", "t-0"]
    await asyncio.to_thread(traces.close)  # what could not be sent is dropped


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint", ["localhost:4318", "not a url", "ftp://collector:4318", "http://", "http://h:x"]
)
def test_an_otlp_endpoint_that_is_not_an_http_url_is_a_settings_error(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="otlp_endpoint"):
        MythicSettings(observability={"otlp_endpoint": endpoint})  # type: ignore[arg-type]


def test_a_bad_otlp_endpoint_in_the_config_file_names_the_setting(tmp_path: Any) -> None:
    config = tmp_path / "mythic.yaml"
    config.write_text("observability:\n  otlp_endpoint: collector\n")
    with pytest.raises(ConfigError, match=r"observability\.otlp_endpoint: .*http://"):
        load_settings(config)


def test_the_traces_url_honours_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert ObservabilitySettings().traces_url() is None
    configured = ObservabilitySettings(otlp_endpoint="http://tempo:4318/")
    assert configured.traces_url({}) == "http://tempo:4318/v1/traces"
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert ObservabilitySettings().traces_url(base) == "http://collector:4318/v1/traces"
    whole = {**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://x.example/otlp/traces"}
    assert ObservabilitySettings().traces_url(whole) == "https://x.example/otlp/traces"
    assert configured.traces_url(whole) == "http://tempo:4318/v1/traces"  # the setting wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")
    with pytest.raises(ValidationError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        ObservabilitySettings()
