"""The tier policy, the breaker, the fallback chain and the job payloads, without a model.

The chain is exercised with scripted endpoints (what a remote server can do to a request:
answer, refuse, fail before or during the stream, stall); the real engine and a real remote
server are in tests/integration/test_route.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mythic.config import (
    ConfigError,
    EndpointSettings,
    MythicSettings,
    effective_route,
    load_settings,
)
from mythic.engine import (
    ChatMessage,
    Completion,
    ContextOverflowError,
    Delta,
    GenerationRequest,
    Timing,
)
from mythic.jobs import JobError, validate_job
from mythic.knowledge import CHARS_PER_TOKEN
from mythic.route import (
    Breaker,
    BreakerState,
    Endpoint,
    EndpointError,
    EndpointRejectedError,
    NoEndpointError,
    OpenAIEndpoint,
    Router,
    TierPolicy,
    UnknownKindError,
    canned_line,
)

pytestmark = pytest.mark.unit


def route_settings(**route: Any) -> MythicSettings:
    return MythicSettings(route=route)


def test_default_routing_table() -> None:
    policy = TierPolicy(effective_route(MythicSettings()))
    table = {kind: policy.decide(kind).tier for kind in ("intent", "bark", "tool_decision")}
    assert table == {"intent": "gold", "bark": "gold", "tool_decision": "silver"}
    assert policy.decide("dialogue").tier == "silver"
    assert policy.decide("tool_dialogue").tier == "silver"
    for kind in ("summary", "story", "lore_gen", "quest"):
        assert policy.decide(kind).tier == "bronze"
    with pytest.raises(UnknownKindError, match="unknown request kind 'poetry'"):
        policy.decide("poetry")


def test_the_gold_engine_is_sized_for_decisions_and_endpoints_on_one_model_share_the_largest() -> (
    None
):
    from mythic.config._mythic import GOLD_N_CTX, GOLD_SEQUENCES
    from mythic.route import engine_sizes

    settings = MythicSettings()
    engine = settings.engine
    sizes = engine_sizes(effective_route(settings).endpoints.values(), engine)
    assert sizes[engine.intent_model] == {"n_ctx": GOLD_N_CTX, "max_sequences": GOLD_SEQUENCES}
    assert sizes[engine.dialogue_model] == {
        "n_ctx": engine.n_ctx,
        "max_sequences": engine.max_sequences,
    }
    # Gold on the dialogue model: one engine, which keeps the dialogue tier's size.
    same = MythicSettings(engine={"intent_model": engine.dialogue_model})
    sizes = engine_sizes(effective_route(same).endpoints.values(), same.engine)
    assert sizes == {engine.dialogue_model: {"n_ctx": 2048, "max_sequences": 16}}
    # A prompt longer than gold's engine holds goes to silver even when a rule says gold.
    policy = TierPolicy(
        effective_route(route_settings(rules=[{"tier": "gold", "kinds": ["dialogue"]}]))
    )
    assert policy.decide("dialogue", context_tokens=200).tier == "gold"
    assert policy.decide("dialogue", context_tokens=GOLD_N_CTX).tier == "silver"
    # Sizes are the embedded engine's: a remote endpoint with them is refused, by name.
    with pytest.raises(ValueError, match="n_ctx and max_sequences size an embedded engine"):
        EndpointSettings(model="m", url="http://10.0.0.9:8000/v1", n_ctx=1024)


def test_rules_match_archetype_deadline_cost_and_context_size() -> None:
    settings = route_settings(
        endpoints={"big": {"model": "m", "url": "http://10.0.0.9:8000/v1"}},
        tiers={
            "silver": {"endpoints": ["embedded-silver"], "tools": True, "max_context_tokens": 500},
            "premium": {"endpoints": ["big"], "tools": True},
        },
        rules=[
            {"tier": "premium", "kinds": ["dialogue"], "archetypes": ["lich"]},
            {"tier": "gold", "kinds": ["dialogue"], "max_deadline_s": 0.2},
            {"tier": "premium", "kinds": ["dialogue"], "min_cost": 5},
        ],
    )
    policy = TierPolicy(effective_route(settings))
    assert policy.decide("dialogue", archetype="lich").tier == "premium"
    assert policy.decide("dialogue", archetype="zombie").tier == "silver"
    assert policy.decide("dialogue", deadline_s=0.1).tier == "gold"
    assert policy.decide("dialogue", deadline_s=1.0).tier == "silver"
    assert policy.decide("dialogue", cost=9).tier == "premium"
    # Longer than silver takes: the next tier up that takes it (bronze has no limit).
    decision = policy.decide("dialogue", context_tokens=800)
    assert decision.tier == "bronze"
    assert "800 tokens > silver's 500" in decision.reason
    # A tool kind never moves to a tier without tools.
    assert policy.decide("tool_dialogue", context_tokens=800).tier == "premium"


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"tiers": {"silver": {"endpoints": ["nowhere"]}}}, "unknown endpoints"),
        ({"tiers": {"gold": {"endpoints": ["embedded-gold"], "tools": True}}}, "never calls"),
        ({"rules": [{"tier": "platinum", "kinds": ["dialogue"]}]}, "unknown tier 'platinum'"),
        ({"rules": [{"tier": "gold", "kinds": ["tool_decision"]}]}, "does not allow tools"),
        ({"rules": [{"tier": "gold", "kinds": ["sonnet"]}]}, "unknown request kinds"),
        ({"endpoints": {"x": {"model": "m", "url": "ftp://x"}}}, "route.endpoints.x.url"),
    ],
)
def test_bad_route_config_is_refused_by_name(
    no_config_env: Any, route: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(route=route)


def test_breaker_opens_half_opens_and_closes() -> None:
    now = [0.0]
    breaker = Breaker(failures=2, cooldown_s=5.0, clock=lambda: now[0])
    breaker.failure()
    assert breaker.state is BreakerState.CLOSED and breaker.available()
    breaker.failure()
    assert breaker.state is BreakerState.OPEN and not breaker.available()
    now[0] = 5.0
    assert breaker.available()
    breaker.acquire()  # the probe
    assert breaker.state is BreakerState.HALF_OPEN and not breaker.available()
    breaker.failure()  # the probe failed: open again, a new cooldown
    assert breaker.state is BreakerState.OPEN and breaker.opens == 2
    now[0] = 10.0
    breaker.acquire()
    breaker.success()
    assert breaker.state is BreakerState.CLOSED and breaker.available()


# -- the chain, with scripted endpoints --------------------------------------------------------


class Scripted(Endpoint):
    """An endpoint that does what its script says: `ok`, `fail` (before any text),
    `drop` (after some text), `invalid`, `overflow` or `stall`."""

    kind = "scripted"

    def __init__(self, name: str, script: list[str], *, can_continue: bool = True) -> None:
        super().__init__(name, EndpointSettings(model=name))
        self.script = script
        self.can_continue = can_continue
        self.seen: list[GenerationRequest] = []

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        self.seen.append(request)
        step = self.script.pop(0) if self.script else "ok"
        timing = Timing(0.0, 0.0, 0.0, 0.0)
        if step == "fail":
            raise EndpointError(f"{self.name}: connection refused")
        if step == "invalid":
            raise ContextOverflowError(f"{self.name}: too long")
        if step == "stall":
            await asyncio.sleep(3600)
        yield Delta(request.request_id, f"[{self.name}]", 1, timing)
        if step == "drop":
            raise EndpointError(f"{self.name}: the stream broke off")
        yield Delta(request.request_id, " done", 1, timing, finish_reason="stop", prompt_tokens=7)

    async def check(self) -> bool:
        return True


def router_for(tier: dict[str, Any], endpoints: list[Scripted], **route: Any) -> Router:
    names = {e.name: {"model": e.name} for e in endpoints}
    settings = route_settings(endpoints=names, tiers={"silver": {"tools": True, **tier}}, **route)
    built = effective_route(settings)
    objects: dict[str, Endpoint] = {name: Scripted(name, []) for name in built.endpoints}
    objects.update({e.name: e for e in endpoints})
    return Router(built, objects)


def request(**kw: Any) -> GenerationRequest:
    return GenerationRequest(npc_id="marla", messages=[ChatMessage("user", "Hi")], **kw)


async def test_retryable_failure_is_retried_then_served() -> None:
    a = Scripted("a", ["fail", "ok"])
    router = router_for({"endpoints": ["a"], "retries": 1, "backoff_s": 0}, [a])
    done = await router.complete(request(), "dialogue", canned="...")
    assert done.text == "[a] done"
    assert router.retries["silver"] == 1
    usage = router.usage.summary()
    assert usage["tiers"]["silver"]["outcomes"] == {"ok": 1}
    assert usage["npcs"]["marla"]["prompt_tokens"] == 7


async def test_a_dropped_stream_is_continued_by_the_fallback() -> None:
    a, b = Scripted("a", ["drop"]), Scripted("b", ["ok"])
    router = router_for({"endpoints": ["a"], "fallback": ["b"], "retries": 0}, [a, b])
    stream = await router.open(request(), "dialogue", canned="...")
    async with stream:
        done = await stream.collect()
    assert done.text == "[a][b] done"
    assert b.seen[0].continue_text == "[a]"  # the fallback continued what was said
    assert stream.served_by == "b"
    assert stream.attempts == [("a", "failed"), ("b", "ok")]
    assert router.fallbacks[("silver", "b")] == 1


async def test_an_endpoint_that_cannot_continue_is_skipped_then_the_line_is_canned() -> None:
    a, b = Scripted("a", ["drop"]), Scripted("b", ["ok"], can_continue=False)
    router = router_for({"endpoints": ["a"], "fallback": ["b"], "retries": 0}, [a, b])
    done = await router.complete(request(), "dialogue", canned="Hm. Give me a moment.")
    assert done.text == "[a] Hm. Give me a moment."
    assert done.finish_reason == "stop"
    assert not b.seen


async def test_a_reply_given_its_start_keeps_it_through_a_fallback() -> None:
    # A greeting's reply begins with a catchphrase the model continues; an endpoint that
    # fails mid-stream hands the fallback that start and what it said after it.
    a, b = Scripted("a", ["drop"]), Scripted("b", ["ok"])
    router = router_for({"endpoints": ["a"], "fallback": ["b"], "retries": 0}, [a, b])
    done = await router.complete(request(continue_text="Sugar,"), "dialogue", canned="...")
    assert done.text == "[a][b] done"
    assert a.seen[0].continue_text == "Sugar,"
    assert b.seen[0].continue_text == "Sugar,[a]"
    # An endpoint that cannot continue a reply is not given one that has a start.
    c = Scripted("c", ["ok"], can_continue=False)
    router = router_for({"endpoints": ["c"], "retries": 0}, [c])
    done = await router.complete(request(continue_text="Sugar,"), "dialogue", canned="Hm.")
    assert done.text == " Hm." and not c.seen
    assert not router.can_continue("dialogue")  # so the NPC gives no start to such a tier
    a, b = Scripted("a", []), Scripted("b", [])
    assert router_for({"endpoints": ["a"], "fallback": ["b"]}, [a, b]).can_continue("dialogue")
    # The canned line after a given start is a sentence of its own: "Sugar, Hm."
    d = Scripted("d", ["fail"])
    router = router_for({"endpoints": ["d"], "retries": 0}, [d])
    done = await router.complete(request(continue_text="Sugar,"), "dialogue", canned="Hm.")
    assert done.text == " Hm."


async def test_invalid_requests_are_not_retried_and_raise_when_all_refuse() -> None:
    a, b = Scripted("a", ["invalid", "invalid"]), Scripted("b", ["invalid"])
    router = router_for({"endpoints": ["a"], "fallback": ["b"], "retries": 3}, [a, b])
    with pytest.raises(ContextOverflowError):
        await router.complete(request(), "dialogue", canned="...")
    assert len(a.seen) == 1 and len(b.seen) == 1  # refused: not retried on the same endpoint
    assert router.states["a"].breaker.failures == 0  # not the endpoint's fault


async def test_every_endpoint_down_gives_the_canned_line_or_a_typed_error() -> None:
    a = Scripted("a", ["fail"] * 10)
    router = router_for({"endpoints": ["a"], "retries": 1, "backoff_s": 0}, [a])
    done = await router.complete(request(), "dialogue", canned="The night is long.")
    assert done.text == "The night is long."
    with pytest.raises(NoEndpointError, match="no endpoint of tier silver answered"):
        await router.complete(request(), "dialogue")


async def test_breaker_skips_a_failing_endpoint() -> None:
    a, b = Scripted("a", ["fail"] * 10), Scripted("b", [])
    router = router_for(
        {"endpoints": ["a"], "fallback": ["b"], "retries": 0},
        [a, b],
        breaker_failures=2,
        breaker_cooldown_s=60,
    )
    for _ in range(4):
        assert (await router.complete(request(), "dialogue")).text == "[b] done"
    assert len(a.seen) == 2  # opened after two failures: skipped since
    assert router.states["a"].breaker.state is BreakerState.OPEN


async def test_deadline_ends_in_the_canned_output_at_once() -> None:
    a = Scripted("a", ["stall"])
    router = router_for({"endpoints": ["a"], "retries": 0}, [a])
    done = await router.complete(request(deadline_s=0.05), "dialogue", canned='{"intent": "x"}')
    assert done.text == '{"intent": "x"}'
    assert router.usage.summary()["tiers"]["silver"]["outcomes"] == {"canned": 1}


async def test_least_outstanding_endpoint_is_picked_and_max_tokens_capped() -> None:
    a, b = Scripted("a", ["stall"]), Scripted("b", ["ok"])
    router = router_for({"endpoints": ["a", "b"], "max_tokens": 16}, [a, b])
    first = asyncio.create_task(router.complete(request(), "dialogue", canned="..."))
    while not a.seen:  # noqa: ASYNC110 - a plain list: nothing to wait on
        await asyncio.sleep(0)
    done = await router.complete(request(), "dialogue", canned="...")
    assert done.text == "[b] done"  # a is busy with the first request
    assert b.seen[0].sampling.max_tokens == 16
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.sleep(0)
    assert router.states["a"].endpoint.outstanding == 0  # released on cancel


def test_openai_request_body() -> None:
    settings = EndpointSettings(
        model="Qwen/Qwen2.5-7B-Instruct",
        url="http://10.0.0.5:8000/v1",
        adapters={"vampire": "vampire-lora"},
        continue_final_message=True,
    )
    endpoint = OpenAIEndpoint("gpu-a", settings)
    schema = {"type": "object", "properties": {"intent": {"enum": ["a"]}}}
    body = endpoint.body(
        request(json_schema=schema, adapters={"vampire": 1.0}, continue_text="Well")
    )
    assert body["model"] == "vampire-lora"  # multi-LoRA: the adapter is chosen by model name
    assert body["stream"] is True
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert body["messages"][-1] == {"role": "assistant", "content": "Well"}
    assert body["continue_final_message"] is True
    llama = OpenAIEndpoint(
        "cpp", EndpointSettings(model="m", url="http://h/v1", json_schema="llama.cpp")
    )
    assert llama.body(request(json_schema=schema))["response_format"] == {
        "type": "json_object",
        "schema": schema,
    }


@pytest.mark.parametrize(
    ("usage", "tokens", "prompt_tokens"),
    [
        # The server's count wins over the chunks' (here two tokens came in one chunk).
        ({"prompt_tokens": 11, "completion_tokens": 4}, 4, 11),
        # A server that sends no usage: a token a chunk, and the prompt estimated.
        (None, 3, len("Hi") // CHARS_PER_TOKEN + 4),
    ],
)
async def test_a_remote_reply_counts_the_tokens_its_server_reports(
    usage: dict[str, int] | None, tokens: int, prompt_tokens: int
) -> None:
    events = [
        {"choices": [{"delta": {"content": text}, "finish_reason": None}]}
        for text in ("Evening", ", friend", ".")
    ]
    events.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    if usage is not None:
        events.append({"choices": [], "usage": usage})  # after the text, as OpenAI sends it
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    seen: list[dict[str, Any]] = []

    def serve(call: httpx.Request) -> httpx.Response:
        seen.append(json.loads(call.content))
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
        settings = EndpointSettings(model="m", url="http://gpu-a/v1")
        endpoint = OpenAIEndpoint("gpu-a", settings, client=client)
        deltas = [d async for d in endpoint.stream(request())]
    done = Completion.from_deltas("r", deltas)
    assert seen[0]["stream_options"] == {"include_usage": True}
    assert done.text == "Evening, friend." and done.finish_reason == "stop"
    assert (done.tokens, done.prompt_tokens) == (tokens, prompt_tokens)


@pytest.mark.parametrize(
    ("status", "body"),
    [(200, "not json"), (200, '{"id": 0}'), (500, "[]"), (200, '[{"id": "zero"}]')],
    ids=["not-json", "not-a-list", "server-error", "no-usable-entry"],
)
async def test_llama_server_adapters_that_cannot_be_read_are_a_typed_error(
    status: int, body: str
) -> None:
    def serve(call: httpx.Request) -> httpx.Response:
        assert call.url.path == "/lora-adapters"  # no completion is sent without the ids
        return httpx.Response(status, text=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
        settings = EndpointSettings(model="m", url="http://gpu-a/v1", lora="llama.cpp")
        endpoint = OpenAIEndpoint("gpu-a", settings, client=client)
        with pytest.raises((EndpointError, EndpointRejectedError)):
            _ = [d async for d in endpoint.stream(request(adapters={"vampire": 1.0}))]


def test_canned_lines_are_in_character_and_stable() -> None:
    assert canned_line("vampire", "t-1") == canned_line("vampire", "t-1")
    assert canned_line("zombie", "x") in ("Hnnngh... wait...", "Uuurgh. Brain... slow...")
    assert canned_line("unknown-thing", "x")


@pytest.mark.parametrize(
    ("kind", "payload", "message"),
    [
        ("poem", {}, "unknown job kind 'poem'"),
        ("lore", {}, "topic: Field required"),
        ("lore", {"topic": "x", "zone": "Not A Slug"}, "zone"),
        ("quest", {"npc_id": "marla", "reward": "gold"}, "reward: Extra inputs"),
        ("summary", {"npc_id": "marla", "text": ""}, "text"),
        ("lore", ["topic"], "payload is an object"),
    ],
)
def test_job_payloads_are_checked(kind: str, payload: Any, message: str) -> None:
    with pytest.raises(JobError, match=message):
        validate_job(kind, payload)


async def test_a_full_tier_past_the_deadline_gives_the_canned_output() -> None:
    a = Scripted("a", ["stall"])
    router = router_for({"endpoints": ["a"], "max_batch": 1}, [a])
    busy = asyncio.create_task(router.complete(request(), "dialogue", canned="..."))
    while not a.seen:  # noqa: ASYNC110 - a plain list: nothing to wait on
        await asyncio.sleep(0)
    done = await router.complete(request(deadline_s=0.05), "dialogue", canned="Hm.")
    assert done.text == "Hm."  # waited for a slot until the deadline, then the canned line
    busy.cancel()
    with pytest.raises(asyncio.CancelledError):
        await busy
