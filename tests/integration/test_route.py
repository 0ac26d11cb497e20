"""Tiers against real peers: llama.cpp's OpenAI-compatible server on loopback (a real remote
endpoint, killed and cut off mid-stream), a deliberately stalling endpoint, the embedded engine
as the fallback, and a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mythic.config import EndpointSettings, MythicSettings, effective_route
from mythic.engine import ChatMessage, Engine, GenerationRequest, ModelStore, Sampling
from mythic.knowledge import load_world
from mythic.route import (
    BreakerState,
    EmbeddedEndpoint,
    Endpoint,
    EndpointRejectedError,
    OpenAIEndpoint,
    Router,
    local_router,
)
from mythic.route._endpoints import approx_prompt_tokens
from mythic.server import Gateway, serving
from tests.conftest import EXAMPLE_WORLD, unavailable
from tests.integration.services import cutoff

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """`python -m llama_cpp.server` on a packaged model, on a loopback port."""

    def __init__(self, model: Path, port: int | None = None) -> None:
        self.model = model
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen[bytes] | None = None
        self.log: Any = None

    async def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            "2048",
            "--n_threads",
            "1",
            "--model_alias",
            "smollm2",
        ]
        # The server logs a lot while loading: into a file, so a full pipe cannot stall it.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(  # noqa: ASYNC220 - returns at once
            command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        async with httpx.AsyncClient() as client:
            for _ in range(600):
                if self.process.poll() is not None:
                    self.log.seek(0)
                    pytest.fail(f"llama_cpp.server exited: {self.log.read().decode()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/models", timeout=1)).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        self.stop()
        pytest.fail("llama_cpp.server did not start in 60 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.log is not None:
            self.log.close()
            self.log = None


@pytest.fixture(scope="module")
def smollm_path(settings: MythicSettings) -> Path:
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        unavailable(f"llama-cpp-python[server] is not installed: {exc}")
    try:
        return ModelStore(settings.engine.models_dir).resolve("smollm2-135m-instruct").path
    except Exception as exc:
        unavailable(f"smollm2-135m-instruct is not available: {exc}")
        raise


@pytest.fixture
async def remote(smollm_path: Path) -> AsyncIterator[LlamaServer]:
    server = LlamaServer(smollm_path)
    await server.start()
    try:
        yield server
    finally:
        server.stop()


def routed(
    settings: MythicSettings,
    engines: dict[str, Engine],
    route: dict[str, Any],
    remotes: dict[str, str],
) -> Router:
    """A router of `route` settings: embedded endpoints on `engines` by model name, remote
    ones (`remotes`: name -> URL) with llama.cpp's JSON-schema dialect and short timeouts."""
    endpoints = {
        name: {
            "model": "smollm2",
            "url": url,
            "json_schema": "llama.cpp",
            "first_token_timeout_s": 3,
            "token_timeout_s": 2,
        }
        for name, url in remotes.items()
    }
    endpoints |= {name: {"model": model} for name, model in route.pop("local", {}).items()}
    effective = effective_route(
        settings.model_copy(update={"route": type(settings.route)(endpoints=endpoints, **route)})
    )
    objects: dict[str, Endpoint] = {}
    for name, endpoint in effective.endpoints.items():
        if endpoint.url is not None:
            objects[name] = OpenAIEndpoint(name, endpoint)
        else:
            engine = engines.get(endpoint.model) or next(iter(engines.values()))
            objects[name] = EmbeddedEndpoint(name, endpoint, engine)
    return Router(effective, objects)


def dialogue(max_tokens: int = 48, **kw: Any) -> GenerationRequest:
    return GenerationRequest(
        npc_id="marla",
        messages=[
            ChatMessage("system", "You are Marla, a barkeep. Answer in a few sentences."),
            ChatMessage("user", "Tell me a long story about the old town and its river."),
        ],
        sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        **kw,
    )


async def test_remote_endpoint_streams_a_constrained_reply(
    settings: MythicSettings, smollm: Engine, remote: LlamaServer
) -> None:
    router = routed(
        settings,
        {"smollm2-135m-instruct": smollm},
        {"tiers": {"gold": {"endpoints": ["remote"], "retrieval": False}}},
        {"remote": remote.url},
    )
    schema = {
        "type": "object",
        "properties": {"intent": {"enum": ["chitchat", "trade", "combat"]}},
        "required": ["intent"],
        "additionalProperties": False,
    }
    request = dialogue(max_tokens=24, json_schema=schema)
    endpoint = router.states["remote"].endpoint
    assert isinstance(endpoint, OpenAIEndpoint)
    # The same request whole first, straight to the server: its own usage to check against,
    # and its grammar set up (seconds on a fresh server, past the short first-token timeout).
    whole = endpoint.body(request) | {"stream": False}
    del whole["stream_options"]
    async with httpx.AsyncClient(timeout=120) as client:
        answer = (await client.post(f"{remote.url}/chat/completions", json=whole)).json()
    stream = await router.open(request, "intent")
    async with stream:
        done = await stream.collect()
    assert stream.served_by == "remote"
    assert json.loads(done.text)["intent"] in ("chitchat", "trade", "combat")
    assert done.text == answer["choices"][0]["message"]["content"]
    # This server (llama-cpp-python's) sends no usage while streaming: a token a chunk, as many
    # as it reports for the request whole, and the prompt estimated.
    assert done.tokens == answer["usage"]["completion_tokens"]
    assert done.prompt_tokens == approx_prompt_tokens(request)
    assert router.usage.summary()["tiers"]["gold"]["outcomes"] == {"ok": 1}
    await router.aclose()


async def test_failover_when_the_remote_is_killed_mid_stream(
    settings: MythicSettings, smollm: Engine, remote: LlamaServer
) -> None:
    router = routed(
        settings,
        {"smollm2-135m-instruct": smollm},
        {
            "tiers": {
                "silver": {"endpoints": ["remote"], "fallback": ["local"], "tools": True},
            },
            "local": {"local": "smollm2-135m-instruct"},
        },
        {"remote": remote.url},
    )
    stream = await router.open(dialogue(max_tokens=120), "dialogue", canned="Hm.")
    pieces: list[str] = []
    finish = None
    async with stream:
        async for delta in stream:
            pieces.append(delta.text)
            if len(pieces) == 3:
                remote.kill()  # SIGKILL: the connection drops mid-reply
            finish = delta.finish_reason
    assert finish in ("stop", "length")
    assert stream.attempts[0] == ("remote", "failed")
    assert stream.served_by == "local"  # the embedded engine continued the reply
    said = "".join(pieces)
    assert len(said) > len("".join(pieces[:3]))
    assert router.fallbacks[("silver", "local")] == 1
    assert router.usage.summary()["tiers"]["silver"]["outcomes"] == {"fallback": 1}
    await router.aclose()


async def test_breaker_opens_and_recovers(
    settings: MythicSettings, smollm: Engine, remote: LlamaServer
) -> None:
    async with cutoff(remote.url) as proxy:
        router = routed(
            settings,
            {"smollm2-135m-instruct": smollm},
            {
                "tiers": {
                    "silver": {
                        "endpoints": ["remote"],
                        "fallback": ["local"],
                        "retries": 0,
                        "tools": True,
                    }
                },
                "local": {"local": "smollm2-135m-instruct"},
                "breaker_failures": 2,
                "breaker_cooldown_s": 60,
            },
            {"remote": proxy.url(remote.url)},
        )
        breaker = router.states["remote"].breaker
        now = [0.0]  # the breaker's clock: the cooldown passes when the test says so
        breaker.clock = lambda: now[0]
        done = await router.complete(dialogue(8), "dialogue")
        assert router.states["remote"].requests == 1 and done.text
        await proxy.cut()  # the remote is unreachable now
        for _ in range(2):
            await router.complete(dialogue(8), "dialogue")  # served by the fallback
        assert breaker.state is BreakerState.OPEN
        tried = router.states["remote"].requests
        await router.complete(dialogue(8), "dialogue")
        assert router.states["remote"].requests == tried  # open: not even tried
        await proxy.restore()
        now[0] += 59.0
        assert not breaker.available()  # still cooling down
        now[0] += 1.0  # the cooldown passes; the next request probes
        stream = await router.open(dialogue(8), "dialogue")
        async with stream:
            await stream.collect()
        assert stream.served_by == "remote"
        assert breaker.state is BreakerState.CLOSED
        assert breaker.opens == 1
        await router.aclose()


async def stalling_server() -> tuple[asyncio.Server, str]:
    """A deliberately slow endpoint: answers 200 with an event stream, then never sends."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            await writer.drain()
            await asyncio.sleep(3600)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"


async def test_a_stalling_endpoint_times_out_into_the_fallback_and_gold_gets_its_canned_answer(
    settings: MythicSettings, smollm: Engine
) -> None:
    server, url = await stalling_server()
    try:
        router = routed(
            settings,
            {"smollm2-135m-instruct": smollm},
            {
                "tiers": {
                    "gold": {"endpoints": ["slow"], "deadline_s": 0.3, "retrieval": False},
                    "silver": {
                        "endpoints": ["slow"],
                        "fallback": ["local"],
                        "retries": 0,
                        "tools": True,
                    },
                },
                "local": {"local": "smollm2-135m-instruct"},
            },
            {"slow": url},
        )
        stream = await router.open(dialogue(8), "dialogue", canned="Hm.")
        async with stream:
            await stream.collect()
        assert stream.attempts == [("slow", "failed"), ("local", "ok")]
        # Gold has a deadline: the canned output comes at once, not after the timeout.
        canned = '{"intent": "chitchat"}'
        done = await router.complete(dialogue(8), "intent", canned=canned)
        assert done.text == canned
        await router.aclose()
    finally:
        server.close()


async def misbehaving_server(reply: bytes) -> tuple[asyncio.Server, str]:
    """A peer that answers every request with `reply` (raw HTTP) and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


@pytest.mark.parametrize(
    ("reply", "counted"),
    [
        (SSE + b"data: {not json\n\n", True),  # garbage events
        (SSE + b'data: {"error": "model crashed"}\n\n', True),  # an error event
        (SSE + b'data: {"choices": [{"delta": {"content": "Hal"}}]}\n\n', True),  # cut short
        (b"HTTP/1.1 503 Busy\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbusy", True),
        (b"HTTP/1.1 400 Bad\r\ncontent-length: 3\r\nconnection: close\r\n\r\nno!", False),
    ],
)
async def test_a_misbehaving_remote_falls_back_without_an_error(
    settings: MythicSettings, smollm: Engine, reply: bytes, counted: bool
) -> None:
    server, url = await misbehaving_server(reply)
    try:
        router = routed(
            settings,
            {"smollm2-135m-instruct": smollm},
            {
                "tiers": {
                    "silver": {
                        "endpoints": ["bad"],
                        "fallback": ["local"],
                        "retries": 0,
                        "tools": True,
                    }
                },
                "local": {"local": "smollm2-135m-instruct"},
            },
            {"bad": url},
        )
        stream = await router.open(dialogue(8), "dialogue", canned="Hm.")
        async with stream:
            done = await stream.collect()
        assert done.text and stream.served_by == "local"
        assert stream.attempts[0] == ("bad", "failed" if counted else "invalid")
        # Failures count against the breaker; a refused (4xx) request does not.
        assert router.states["bad"].breaker.failures == int(counted)
        await router.aclose()
    finally:
        server.close()


async def test_gateway_routes_by_tier_and_the_npc_answers_with_the_remote_down(
    settings: MythicSettings, smollm: Engine, qwen: Engine
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: connection refused
    router = routed(
        settings,
        {"smollm2-135m-instruct": smollm, "qwen2.5-coder-0.5b-instruct": qwen},
        {
            "tiers": {
                "gold": {"endpoints": ["local-small"], "retrieval": False},
                "silver": {"endpoints": ["remote"], "fallback": ["local-small"], "tools": True},
                "decide": {"endpoints": ["local-qwen"], "tools": True},
            },
            "rules": [{"tier": "decide", "kinds": ["tool_decision"]}],
            "local": {
                "local-small": "smollm2-135m-instruct",
                "local-qwen": "qwen2.5-coder-0.5b-instruct",
            },
        },
        {"remote": dead},
    )
    # The line filter off: a try it catches would be one more dialogue request to count; the
    # model decides the line, so the decision is a request routed by its kind.
    dialogue = {"line_filter": False, "decider": "model"}
    effective = settings.model_copy(
        update={
            "knowledge": settings.knowledge.model_copy(update={"watch": False}),
            "dialogue": settings.dialogue.model_copy(update=dialogue),
        }
    )
    gateway = Gateway(effective, load_world(EXAMPLE_WORLD), router=router)
    async with serving(gateway) as (host, port), httpx.AsyncClient() as client:
        base = f"http://{host}:{port}"
        reply = await client.post(
            f"{base}/v1/npcs/marla/say", json={"text": "Good evening!"}, timeout=120
        )
        assert reply.status_code == 200
        assert reply.json()["text"]  # the fallback answered; the game saw no error
        usage = (await client.get(f"{base}/v1/usage")).json()
        assert usage["tiers"]["silver"]["kinds"] == {"dialogue": 1}
        assert usage["tiers"]["silver"]["outcomes"] == {"fallback": 1}
        assert usage["tiers"]["decide"]["kinds"] == {"tool_decision": 1}
        assert usage["npcs"]["marla"]["requests"] == 2
        route = (await client.get(f"{base}/v1/route")).json()
        assert route["endpoints"]["remote"]["healthy"] is False  # found by its health check
        metrics = (await client.get(f"{base}/metrics")).text
        assert 'mythic_usage_requests_total{kind="dialogue",npc="marla"' in metrics
        assert 'mythic_route_fallbacks_total{tier="silver",to="local-small"} 1.0' in metrics


def test_local_router_maps_gold_to_the_intent_engine(
    settings: MythicSettings, smollm: Engine, qwen: Engine
) -> None:
    router = local_router(settings, qwen, smollm)
    assert router.engine_for("intent") is smollm
    assert router.engine_for("dialogue") is qwen
    assert router.engine_for("summary") is qwen


# -- llama.cpp's own server: adapters by name, usage from the server ----------------------------


def llama_server_binary() -> Path:
    """The `llama-server` that `make llama-server` builds (`make test` builds it first)."""
    root = Path(__file__).resolve().parents[2]
    made = subprocess.run(
        ["make", "-s", "llama-server-path"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    binary = Path(made) if made else None
    if binary is None or not binary.is_file():
        unavailable(
            f"llama-server is not built ({made or 'make llama-server-path'}): run make llama-server"
        )
        raise AssertionError("unreachable")
    return binary


async def test_llama_server_serves_adapters_by_name_with_its_own_usage(
    smollm_path: Path, tmp_path: Path
) -> None:
    from tests.loras import write_lora

    vampire = write_lora(smollm_path, tmp_path / "vampire.gguf", seed=1, scale=0.2)
    ghoul = write_lora(smollm_path, tmp_path / "ghoul-v2.gguf", seed=2, scale=0.2)
    port = free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    process = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [
            str(llama_server_binary()),
            *("-m", str(smollm_path), "--host", "127.0.0.1", "--port", str(port)),
            *("--lora", str(vampire), "--lora", str(ghoul), "--lora-init-without-apply"),
            *("--ctx-size", "2048", "--threads", "1", "--no-webui", "--parallel", "2"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    root = f"http://127.0.0.1:{port}"
    endpoint = OpenAIEndpoint("llama-server", _llama_endpoint_settings(f"{root}/v1"))
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(600):
                if process.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"llama-server exited: {log.read().decode()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{root}/health", timeout=1)).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("llama-server did not start in 60 s")

            async def reply(**adapters: float) -> tuple[str, int, int]:
                deltas = [d async for d in endpoint.stream(dialogue(24, adapters=adapters))]
                return (
                    "".join(d.text for d in deltas),
                    sum(d.tokens for d in deltas),
                    deltas[-1].prompt_tokens,
                )

            base, base_tokens, prompt_tokens = await reply()
            as_vampire = await reply(vampire=1.0)
            # The ghoul's file is ghoul-v2.gguf: the endpoint's `adapters` maps the name.
            as_ghoul = await reply(ghoul=1.0)
            assert len({base, as_vampire[0], as_ghoul[0]}) == 3  # each adapter applied alone
            assert await reply(vampire=1.0) == as_vampire  # and no other left on after it
            assert await reply() == (base, base_tokens, prompt_tokens)
            # The counts are the server's own: its prompt is the chat template's tokens.
            templated = await client.post(
                f"{root}/apply-template", json={"messages": _wire(dialogue().messages)}
            )
            tokens = await client.post(
                f"{root}/tokenize", json={"content": templated.json()["prompt"]}
            )
            assert prompt_tokens == len(tokens.json()["tokens"])
            assert prompt_tokens != approx_prompt_tokens(dialogue())
            assert base_tokens == 24
            with pytest.raises(EndpointRejectedError, match="no LoRA adapter 'werewolf'"):
                await reply(werewolf=1.0)
    finally:
        process.terminate()
        process.wait(10)
        log.close()
        await endpoint.aclose()


def _llama_endpoint_settings(url: str) -> EndpointSettings:
    return EndpointSettings(
        model="smollm2",
        url=url,
        json_schema="llama.cpp",
        lora="llama.cpp",
        adapters={"ghoul": "ghoul-v2"},
    )


def _wire(messages: Any) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]
