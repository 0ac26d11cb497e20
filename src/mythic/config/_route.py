"""`route`: endpoints, tiers and the rules between them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mythic.config._section import Section

REQUEST_KINDS = (
    "intent",
    "bark",
    "tool_decision",
    "speaker",
    "dialogue",
    "tool_dialogue",
    "summary",
    "story",
    "lore_gen",
    "quest",
)
"""What a request is for; the routing rules map kinds (and more) to tiers."""

TOOL_KINDS = frozenset({"tool_decision", "tool_dialogue"})
"""Kinds whose output calls a game tool: only tiers with `tools: true` may serve them."""


class EndpointSettings(Section):
    """One place generation requests can go: the embedded engine on a model (no `url`), or a
    remote OpenAI-compatible server (vLLM, SGLang, TensorRT-LLM, llama.cpp's server)."""

    model: str = Field(min_length=1)
    """Embedded: a packaged model name or a GGUF path (`auto` for bronze: the largest fetched).
    Remote: the model name sent in each request."""
    url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    """Base URL of a remote server, up to and including `/v1`; unset: embedded."""
    api_key_env: str | None = None
    """Environment variable holding the remote server's API key (sent as a bearer token)."""
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    """Longest wait to connect to a remote server, and for its health check's answer."""
    first_token_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """A remote stream that sends nothing for this long fails (and the chain moves on)."""
    token_timeout_s: float = Field(default=5.0, gt=0, le=600)
    """A remote stream that stalls this long between tokens fails (a hung server)."""
    json_schema: Literal["openai", "llama.cpp", "none"] = "openai"
    """How constrained output is asked for: OpenAI's `response_format: json_schema` (vLLM,
    SGLang), llama.cpp's `json_object` with a schema, or not at all (constrained requests skip
    this endpoint)."""
    continue_final_message: bool = False
    """The server continues a partial assistant message (vLLM's `continue_final_message`):
    then it can take over a reply another endpoint dropped mid-stream."""
    adapters: dict[str, str] = Field(default_factory=dict)
    """LoRA adapter -> the model name that serves it (vLLM multi-LoRA: `--lora-modules`);
    an adapter not listed is sent under its own name. With `lora: llama.cpp`: adapter -> the
    file name (without `.gguf`) the server loaded it from, when that is not its name."""
    lora: Literal["model", "llama.cpp"] = "model"
    """How a request names its LoRA adapters. `model`: one adapter per request, as the model
    name (vLLM, SGLang). `llama.cpp`: llama-server's per-request `lora` list (adapters
    loaded with `--lora`, found by file name under `/lora-adapters`), several at once, each
    with its scale; the others are sent at scale 0."""
    health_path: str = "/models"
    """Polled under `url` to tell whether the server is up."""
    n_ctx: int | None = Field(default=None, ge=256, le=131072)
    """Embedded only: the context of one sequence on this endpoint's engine (default:
    `engine.n_ctx`). Endpoints on one model share its engine, which takes the largest."""
    max_sequences: int | None = Field(default=None, ge=2, le=256)
    """Embedded only: the sequences this endpoint's engine holds (default:
    `engine.max_sequences`); shared as `n_ctx` is. KV memory is reserved for `n_ctx x
    max_sequences` cells at load."""

    @model_validator(mode="after")
    def _sizes_are_embedded(self) -> EndpointSettings:
        if self.url is not None and (self.n_ctx is not None or self.max_sequences is not None):
            raise ValueError(
                "n_ctx and max_sequences size an embedded engine; a remote endpoint (url) "
                "is sized by its own server"
            )
        return self


class TierSettings(Section):
    """A tier: where its requests go and what they may do."""

    endpoints: list[str] = Field(min_length=1)
    """Endpoint names, balanced by least outstanding requests."""
    fallback: list[str] = Field(default_factory=list)
    """Endpoint names tried in order when every endpoint of the tier failed; after them a
    canned, in-character line (or the caller's canned output)."""
    max_batch: int = Field(default=32, ge=1, le=4096)
    """Requests of this tier in flight per endpoint; more wait for a slot (up to the deadline)."""
    max_tokens: int = Field(default=512, ge=1, le=32768)
    """Cap on a request's generated tokens."""
    max_context_tokens: int | None = Field(default=None, ge=1)
    """Longest prompt (approximate tokens) the tier takes; longer goes to the next tier up."""
    tools: bool = False
    """May serve requests whose output calls a game tool."""
    retrieval: bool = True
    """Dialogue on this tier gets lore retrieval (the `## Lore` section)."""
    deadline_s: float | None = Field(default=None, gt=0)
    """Deadline of a request that sets none; past it, the caller gets the canned output."""
    retries: int = Field(default=1, ge=0, le=10)
    """Extra tries of a request that failed with a retryable error (connection refused, 429,
    5xx, overloaded), each on the least busy healthy endpoint."""
    backoff_s: float = Field(default=0.05, ge=0, le=60)
    """Wait before the first retry; doubled each time."""


class RouteRule(Section):
    """Requests matching every condition given go to `tier`; rules are tried in order."""

    tier: str
    """The tier a matching request goes to (a name under `tiers`)."""
    kinds: list[str] = Field(default_factory=list)
    """Matches requests of these kinds (`REQUEST_KINDS`); empty: any kind."""
    archetypes: list[str] = Field(default_factory=list)
    """Matches requests for NPCs of these archetypes; empty: any archetype."""
    min_context_tokens: int | None = Field(default=None, ge=0)
    """Matches requests whose prompt is at least this many tokens (approximate)."""
    max_context_tokens: int | None = Field(default=None, ge=0)
    """Matches requests whose prompt is at most this many tokens (approximate)."""
    max_deadline_s: float | None = Field(default=None, gt=0)
    """Matches requests that must be done within this many seconds."""
    min_cost: float | None = Field(default=None, ge=0)
    """Matches requests whose cost weight is at least this."""

    @model_validator(mode="after")
    def _known_kinds(self) -> RouteRule:
        unknown = sorted(set(self.kinds) - set(REQUEST_KINDS))
        if unknown:
            raise ValueError(f"unknown request kinds {unknown}; kinds: {', '.join(REQUEST_KINDS)}")
        return self


class RouteSettings(Section):
    """Tiers, endpoints and routing (ARCHITECTURE.md: route). Unset tiers and endpoints are the
    embedded defaults: gold on `engine.intent_model`, silver on `engine.dialogue_model`, bronze
    on `engine.bronze_model`."""

    endpoints: dict[str, EndpointSettings] = Field(default_factory=dict)
    """Endpoints by name, beside the embedded ones (`embedded-gold`, `embedded-silver`,
    `embedded-bronze`); one of the same name replaces it."""
    tiers: dict[str, TierSettings] = Field(default_factory=dict)
    """Tiers by name, beside the embedded `gold`, `silver` and `bronze`; one of the same name
    replaces it."""
    rules: list[RouteRule] = Field(default_factory=list)
    """Tried before the defaults (intent, bark: gold; dialogue and tools: silver; summary,
    story, lore_gen, quest: bronze)."""
    breaker_failures: int = Field(default=3, ge=1, le=1000)
    """Consecutive failures that open an endpoint's circuit breaker (it is skipped)..."""
    breaker_cooldown_s: float = Field(default=5.0, gt=0, le=3600)
    """...until this long has passed; then one request probes it (half-open)."""
    health_interval_s: float = Field(default=2.0, gt=0, le=3600)
    """How often remote endpoints are checked."""


def check_route(route: RouteSettings) -> None:
    """Raise ValueError when tiers name unknown endpoints, rules name unknown tiers, a kind
    that calls tools can reach a tier without tools, or gold allows tools."""
    for name, tier in route.tiers.items():
        unknown = [e for e in (*tier.endpoints, *tier.fallback) if e not in route.endpoints]
        if unknown:
            raise ValueError(
                f"route.tiers.{name} names unknown endpoints {unknown}; endpoints: "
                f"{', '.join(sorted(route.endpoints))}"
            )
    if route.tiers.get("gold") is not None and route.tiers["gold"].tools:
        raise ValueError("route.tiers.gold: gold never calls tools (tools: false)")
    for i, rule in enumerate(route.rules):
        found = route.tiers.get(rule.tier)
        if found is None:
            raise ValueError(
                f"route.rules[{i}] names unknown tier {rule.tier!r}; tiers: "
                f"{', '.join(sorted(route.tiers))}"
            )
        tool_kinds = sorted(TOOL_KINDS & set(rule.kinds or REQUEST_KINDS))
        if tool_kinds and rule.kinds and not found.tools:
            raise ValueError(
                f"route.rules[{i}] sends {tool_kinds} to tier {rule.tier!r}, which does not "
                "allow tools (tools: false)"
            )
