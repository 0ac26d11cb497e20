"""Where generation requests go: the embedded engine, or a remote OpenAI-compatible server.

An endpoint streams `Delta`s for a `GenerationRequest` and says how it failed: an
`EndpointError` (unreachable, timed out, overloaded, dropped mid-stream: worth trying elsewhere
and counted by the circuit breaker) or an `InvalidRequestError` (this request does not suit this
endpoint: not retried, not counted).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from mythic.config import EndpointSettings
from mythic.engine import (
    ContextOverflowError,
    Delta,
    EngineError,
    FinishReason,
    GenerationRequest,
    InvalidRequestError,
    Overloaded,
    RequestError,
    Timing,
)
from mythic.knowledge import CHARS_PER_TOKEN

if TYPE_CHECKING:
    import httpx

    from mythic.engine import Engine

log = logging.getLogger(__name__)


class EndpointError(RequestError):
    """An endpoint failed a request it should have served: unreachable, timed out, overloaded,
    or the stream broke off. Another endpoint may serve it."""

    retryable = True


class EndpointRejectedError(InvalidRequestError):
    """The endpoint refused this request as unsuitable (an HTTP 4xx, a constrained request it
    cannot constrain); the next endpoint of the chain may take it."""


class Endpoint(ABC):
    """One place requests can go. `outstanding` is maintained by the router."""

    kind: str
    can_continue: bool = False
    """Whether it can continue a partial reply (`GenerationRequest.continue_text`)."""

    def __init__(self, name: str, settings: EndpointSettings) -> None:
        self.name = name
        self.settings = settings
        self.healthy = True
        self.outstanding = 0

    @abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """The reply's deltas; the last has a finish reason.

        Raises:
            EndpointError: the endpoint failed (retryable elsewhere).
            InvalidRequestError: this request does not suit this endpoint.
            DeadlineExceeded, RequestCancelled: as from the engine.
        """

    @abstractmethod
    async def check(self) -> bool:
        """Whether the endpoint is up (health check); never raises."""

    async def aclose(self) -> None:  # noqa: B027 - most endpoints hold nothing
        """Release connections."""


class EmbeddedEndpoint(Endpoint):
    """The shared in-process engine."""

    kind = "embedded"
    can_continue = True

    def __init__(self, name: str, settings: EndpointSettings, engine: Engine) -> None:
        super().__init__(name, settings)
        self.engine = engine

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        try:
            submitted = self.engine.submit(request)
        except Overloaded as exc:
            raise EndpointError(f"{self.name}: {exc.message}") from exc
        except EngineError as exc:  # closed, or its worker died
            raise EndpointError(f"{self.name}: {exc}") from exc
        async with submitted:
            try:
                async for delta in submitted:
                    yield delta
            except EngineError as exc:  # a failed model step: the engine has recovered
                raise EndpointError(f"{self.name}: {exc}") from exc

    async def check(self) -> bool:
        return self.engine.alive


def approx_prompt_tokens(request: GenerationRequest) -> int:
    """A request's prompt size without its model's tokenizer (`CHARS_PER_TOKEN`), plus four
    tokens a message for its chat template's role markers."""
    if request.prompt is not None:
        return len(request.prompt) // CHARS_PER_TOKEN
    return sum(len(m.content) // CHARS_PER_TOKEN + 4 for m in request.messages or ())


_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class OpenAIEndpoint(Endpoint):
    """A remote OpenAI-compatible server: streaming chat completions over HTTP.

    LoRA adapters are chosen by model name, as vLLM's multi-LoRA serving does: a request for
    adapter `vampire` is sent as model `vampire` (or the name `adapters` maps it to).
    """

    kind = "openai"

    def __init__(
        self, name: str, settings: EndpointSettings, client: httpx.AsyncClient | None = None
    ) -> None:
        super().__init__(name, settings)
        assert settings.url is not None
        self.base = settings.url.rstrip("/")
        self.can_continue = settings.continue_final_message
        self._client = client
        self._own_client = client is None
        self._lora_ids: dict[str, int] | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(limits=limits)
        return self._client

    def _headers(self) -> dict[str, str]:
        env = self.settings.api_key_env
        key = os.environ.get(env) if env else None
        return {"authorization": f"Bearer {key}"} if key else {}

    async def lora_ids(self, *, refresh: bool = False) -> dict[str, int]:
        """llama-server's adapters (`lora: llama.cpp`): file name without `.gguf` -> id, from
        its `/lora-adapters` (asked once, and again when a request names one not there).

        Raises:
            EndpointError: the server did not say.
        """
        if self._lora_ids is not None and not refresh:
            return self._lora_ids
        import httpx

        root = self.base.removesuffix("/v1")
        timeout = httpx.Timeout(self.settings.connect_timeout_s)
        try:
            reply = await self._http().get(
                f"{root}/lora-adapters", headers=self._headers(), timeout=timeout
            )
            listed = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            raise EndpointError(f"{self.name}: its LoRA adapters: {exc}") from exc
        if not isinstance(listed, list):
            raise EndpointError(f"{self.name}: /lora-adapters answered {reply.status_code}")
        ids = {}
        for entry in listed:
            if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                stem = PurePath(str(entry.get("path", ""))).name.removesuffix(".gguf")
                ids[stem] = entry["id"]
        self._lora_ids = ids
        return ids

    def body(
        self, request: GenerationRequest, lora_ids: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """The chat completion request for `request` (`lora_ids`: the server's adapters, for
        `lora: llama.cpp`).

        Raises:
            EndpointRejectedError: the request needs what this endpoint cannot do.
        """
        if request.messages is None:
            raise EndpointRejectedError(f"{self.name} takes chat messages, not a raw prompt")
        s = request.sampling
        model = self.settings.model
        adapters = [name for name, scale in request.adapters.items() if scale]
        lora: list[dict[str, Any]] | None = None
        if self.settings.lora == "llama.cpp":
            lora = self._lora_list(request.adapters, lora_ids or {})
        elif len(adapters) > 1:
            raise EndpointRejectedError(f"{self.name} serves one LoRA adapter per request")
        elif adapters:
            model = self.settings.adapters.get(adapters[0], adapters[0])
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        if lora is not None:
            body["lora"] = lora
        if s.top_k:
            body["top_k"] = s.top_k
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        if request.continue_text:
            if not self.can_continue:
                raise EndpointRejectedError(f"{self.name} cannot continue a partial reply")
            messages.append({"role": "assistant", "content": request.continue_text})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        dialect = self.settings.json_schema
        if request.json_schema is not None:
            schema = request.json_schema
            if isinstance(schema, str):
                schema = json.loads(schema)
            if dialect == "openai":
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": schema, "strict": True},
                }
            elif dialect == "llama.cpp":
                body["response_format"] = {"type": "json_object", "schema": schema}
            else:
                raise EndpointRejectedError(f"{self.name} cannot constrain output to a JSON schema")
        if request.grammar is not None:
            if dialect == "llama.cpp":
                body["grammar"] = request.grammar
            elif dialect == "openai":
                body["guided_grammar"] = request.grammar  # vLLM
            else:
                raise EndpointRejectedError(f"{self.name} cannot constrain output to a grammar")
        return body

    def _lora_list(
        self, wanted: Mapping[str, float], ids: Mapping[str, int]
    ) -> list[dict[str, Any]]:
        """llama-server's `lora` field: every adapter it has, those `wanted` at their scale."""
        scales = dict.fromkeys(ids.values(), 0.0)
        for name, scale in wanted.items():
            served = ids.get(self.settings.adapters.get(name, name))
            if served is None:
                raise EndpointRejectedError(f"{self.name} has no LoRA adapter {name!r}")
            scales[served] = float(scale)
        return [{"id": i, "scale": scale} for i, scale in sorted(scales.items())]

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        import httpx

        lora_ids = None
        if self.settings.lora == "llama.cpp":
            lora_ids = await self.lora_ids()
            named = {self.settings.adapters.get(n, n) for n in request.adapters}
            if not named <= lora_ids.keys():
                lora_ids = await self.lora_ids(refresh=True)  # loaded since it was asked
        body = self.body(request, lora_ids)
        cfg = self.settings
        start = time.monotonic()
        wait = max(cfg.first_token_timeout_s, cfg.token_timeout_s)
        timeout = httpx.Timeout(connect=cfg.connect_timeout_s, read=wait, write=wait, pool=wait)
        url = f"{self.base}/chat/completions"
        try:
            async with self._http().stream(
                "POST", url, json=body, headers=self._headers(), timeout=timeout
            ) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    raise _status_error(self.name, reply.status_code, reply.text)
                async for delta in self._deltas(request, reply, start):
                    yield delta
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self.name}: {type(exc).__name__}: {exc}") from exc

    async def _deltas(
        self, request: GenerationRequest, reply: httpx.Response, start: float
    ) -> AsyncIterator[Delta]:
        lines = reply.aiter_lines()
        first: float | None = None
        last = start
        finish: FinishReason | None = None
        prompt_tokens = 0
        chunks = 0  # content chunks sent on, a token each until the server says how many
        reported = 0  # the server's completion_tokens (0: it sends no usage)
        while True:
            limit = self.settings.first_token_timeout_s if first is None else None
            limit = limit or self.settings.token_timeout_s
            try:
                async with asyncio.timeout(limit):
                    line = await anext(lines)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise EndpointError(f"{self.name}: no data for {limit:g} s") from None
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise EndpointError(f"{self.name}: not a JSON event: {data[:80]!r}") from None
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                raise EndpointError(f"{self.name}: {str(chunk['error'])[:200]}")
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                prompt_tokens = int(usage.get("prompt_tokens") or 0)
                reported = int(usage.get("completion_tokens") or 0)
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or ""
                reason = choice.get("finish_reason")
                if reason:
                    finish = "length" if reason == "length" else "stop"
                if text:
                    now = time.monotonic()
                    first = first or now
                    chunks += 1
                    yield Delta(
                        request_id=request.request_id,
                        text=text,
                        tokens=1,
                        timing=Timing(0.0, first - start, now - last, now - start),
                    )
                    last = now
        if finish is None:
            raise EndpointError(f"{self.name}: the stream ended before the reply did")
        if not prompt_tokens:  # a server that sends no usage (llama.cpp's): an estimate
            prompt_tokens = approx_prompt_tokens(request)
        now = time.monotonic()
        yield Delta(
            request_id=request.request_id,
            text="",
            # The usage comes after the text (`include_usage`): the last delta brings the
            # deltas' sum from the chunks counted to the server's count (a server may send
            # several tokens a chunk, or hold text back and send it later).
            tokens=reported - chunks if reported else 0,
            timing=Timing(0.0, (first or now) - start, 0.0, now - start),
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
        )

    async def check(self) -> bool:
        import httpx

        try:
            reply = await self._http().get(
                f"{self.base}{self.settings.health_path}",
                headers=self._headers(),
                timeout=httpx.Timeout(self.settings.connect_timeout_s),
            )
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    async def aclose(self) -> None:
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None


def _status_error(name: str, status: int, text: str) -> RequestError:
    detail = text.strip().replace("\n", " ")[:300]
    message = f"{name}: HTTP {status}: {detail}"
    if status in _RETRYABLE_STATUS:
        return EndpointError(message)
    if "context" in detail.lower() and ("exceed" in detail.lower() or "long" in detail.lower()):
        return ContextOverflowError(message)
    return EndpointRejectedError(message)
