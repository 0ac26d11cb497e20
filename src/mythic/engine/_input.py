"""Input processing: a request validated, tokenized and fitted into the context on the
caller's thread, so that its errors come back before anything is queued (vLLM's `Processor`).
"""

from __future__ import annotations

import codecs
import json
import math
import random
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

from mythic.engine._backend import Backend
from mythic.engine._chat_format import ChatMessage
from mythic.engine._config import EngineConfig
from mythic.engine._errors import (
    ContextOverflowError,
    GrammarError,
    InvalidRequestError,
    UnknownAdapterError,
)
from mythic.engine._kvcache import CachedSequence
from mythic.engine._request import GenerationRequest, StreamItem
from mythic.engine._scheduler import AdapterKey, Priority
from mythic.engine._schema import enforceable_schema
from mythic.observability import Hop


class Sink(Protocol):
    """Where a request's deltas go: its stream."""

    request_id: str

    def _put(self, item: StreamItem) -> bool: ...


@dataclass(slots=True)
class ActiveRequest:
    """Engine-side state of one request."""

    request: GenerationRequest
    sink: Sink
    prompt: list[int]
    prefix_len: int
    adapter_key: AdapterKey
    sampler: object
    stops: tuple[str, ...]
    max_tokens: int
    submitted: float
    seq: CachedSequence | None = None
    cached: int = 0
    to_eval: list[int] = field(default_factory=list)
    """Prompt tokens not yet evaluated."""
    last_token: int | None = None
    """Sampled, not yet evaluated."""
    generated: int = 0
    text: str = ""
    sent: int = 0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_delta_at: float = 0.0
    pending_tokens: int = 0
    done: bool = False
    leader: ActiveRequest | None = None
    """A request running beside this one whose prompt starts as this one's does: this one
    waits (its scheduler entry is held) until the leader has evaluated `lead` tokens, then
    copies them instead of evaluating them again (`Engine._join`)."""
    lead: int = 0
    followers: list[ActiveRequest] = field(default_factory=list)
    """Requests waiting for this one's prompt cells."""
    hop: Hop | None = None
    """The request's `engine` hop of its turn's trace (None: not part of a traced turn)."""


class InputProcessor:
    """Turns a `GenerationRequest` into an `ActiveRequest` for the scheduler."""

    def __init__(self, backend: Backend, config: EngineConfig) -> None:
        self.backend = backend
        self.config = config

    def tokens(self, request: GenerationRequest) -> list[int]:
        """The request's prompt tokens, as `prepare` makes them (before any overflow cut)."""
        return self._tokenize(request)[0]

    def prepare(self, request: GenerationRequest, sink: Sink, loaded: Set[str]) -> ActiveRequest:
        """Validate and tokenize a request into its engine-side state (on the caller's thread).

        Raises:
            InvalidRequestError: malformed request; subclasses name the cause.
        """
        s = request.sampling
        if not request.npc_id:
            raise InvalidRequestError("npc_id is empty")
        if (request.messages is None) == (request.prompt is None):
            raise InvalidRequestError("give exactly one of messages and prompt")
        if not isinstance(request.priority, Priority):
            raise InvalidRequestError(f"priority must be a Priority, not {request.priority!r}")
        if request.deadline_s is not None and not request.deadline_s > 0:
            raise InvalidRequestError("deadline_s must be a positive number of seconds")
        if s.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1")
        if not (math.isfinite(s.temperature) and s.temperature >= 0):
            raise InvalidRequestError("temperature must be 0 (greedy) or more")
        if not 0 < s.top_p <= 1 or s.top_k < 0 or not s.repeat_penalty > 0:
            raise InvalidRequestError("top_p must be in (0, 1], top_k >= 0, repeat_penalty > 0")
        if not (
            math.isfinite(s.dry_multiplier)
            and s.dry_multiplier >= 0
            and math.isfinite(s.dry_base)
            and s.dry_base >= 1
            and s.dry_allowed_length >= 1
            and s.dry_penalty_last_n >= -1
            and all(s.dry_sequence_breakers)
            and s.dry_scope in ("lines", "prompt", "reply")
        ):
            raise InvalidRequestError(
                "DRY needs dry_multiplier >= 0, dry_base >= 1, dry_allowed_length >= 1, "
                "dry_penalty_last_n >= -1, no empty sequence breaker and a dry_scope of "
                "lines, prompt or reply"
            )
        if any(not stop for stop in s.stop):
            raise InvalidRequestError("stop strings must not be empty")
        if request.continue_text and request.messages is None:
            raise InvalidRequestError("continue_text needs messages, not a raw prompt")
        if request.json_schema is not None and request.grammar is not None:
            raise InvalidRequestError("give a JSON schema or a grammar, not both")
        key = adapter_key(request.adapters, loaded)

        prompt, prefix_len, stops = self._tokenize(request)
        limit = self.config.scheduler.kv_capacity
        if request.priority is not Priority.GOLD:
            limit -= self.config.scheduler.gold_kv_reserve
        limit = min(limit, self.backend.n_ctx_seq)
        if request.room_tokens < 0:
            raise InvalidRequestError("room_tokens must be >= 0")
        if request.step_tokens is not None and request.step_tokens < 1:
            raise InvalidRequestError("step_tokens must be None or at least 1")
        need = s.max_tokens + request.room_tokens
        if need >= limit:
            raise ContextOverflowError(
                f"max_tokens={s.max_tokens} with room_tokens={request.room_tokens} leaves no "
                f"room for a prompt in {limit} tokens"
            )
        if len(prompt) + need > limit:
            prompt, prefix_len = self._fit(request, prompt, prefix_len, limit - need)

        grammar = request.grammar
        if request.json_schema is not None:
            grammar = self.backend.json_schema_grammar(_schema_text(request.json_schema))
        seed = s.seed if s.seed is not None else self.config.seed
        if seed < 0:
            seed = random.getrandbits(31)
        said = self._said(request, prompt) if s.dry_multiplier > 0 else []
        sampler = self.backend.make_sampler(s, seed, grammar, said=said)
        return ActiveRequest(
            request=request,
            sink=sink,
            prompt=prompt,
            prefix_len=prefix_len,
            adapter_key=key,
            sampler=sampler,
            stops=stops,
            max_tokens=s.max_tokens,
            submitted=time.monotonic(),
        )

    def _tokenize(self, request: GenerationRequest) -> tuple[list[int], int, tuple[str, ...]]:
        """Prompt tokens, the length of its shareable system prefix, and the stop strings."""
        stops = tuple(request.sampling.stop)
        if request.prompt is not None:
            tokens = self.backend.tokenize(request.prompt, add_special=True, parse_special=True)
            if not tokens:
                raise InvalidRequestError("the prompt is empty")
            return tokens, 0, stops
        messages = list(request.messages or ())
        if not messages:
            raise InvalidRequestError("messages is empty")
        fmt = self.backend.chat_format
        if fmt is None:
            raise InvalidRequestError(
                f"model {self.backend.name} has no chat template: send a raw prompt",
                fix="set engine.chat_format for a GGUF whose template is not recognised",
            )
        tokens = self._render(messages)
        if request.continue_text:
            tokens += self.backend.tokenize(
                request.continue_text, add_special=False, parse_special=False
            )
        # The shareable prefix is the first message, a system prompt (an NPC's persona):
        # what follows (a player's memory, the conversation with its lore) is the session's
        # own, and a prefix reaching into it would pin those cells (a window move could
        # not cut them out of the session's sequence).
        prefix_len = 0
        if len(messages) > 1 and messages[0].role == "system":
            head = self._render(messages[:1], add_generation_prompt=False)
            if tokens[: len(head)] == head:
                prefix_len = len(head)
        return tokens, prefix_len, tuple(dict.fromkeys((*stops, *fmt.stop_strings)))

    def _said(self, request: GenerationRequest, prompt: list[int]) -> list[int]:
        """The tokens DRY counts as already said before the reply (`Sampling.dry_scope`)."""
        scope = request.sampling.dry_scope
        if scope == "prompt":
            return prompt
        tokenize = self.backend.tokenize
        said: list[int] = []
        if scope == "lines":
            # A line break between lines: a breaker, so no repeat runs from one into the next.
            brk = tokenize("\n", add_special=False, parse_special=False)
            for message in request.messages or ():
                if message.role == "assistant":
                    said += tokenize(message.content, add_special=False, parse_special=False)
                    said += brk
        if request.continue_text:
            # The reply's own start, given in the prompt.
            said += tokenize(request.continue_text, add_special=False, parse_special=False)
        return said

    def _render(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> list[int]:
        fmt = self.backend.chat_format
        assert fmt is not None
        tokens: list[int] = []
        for text, template in fmt.render_segments(
            messages, add_generation_prompt=add_generation_prompt
        ):
            tokens += self.backend.tokenize(text, add_special=False, parse_special=template)
        return tokens

    def _fit(
        self, request: GenerationRequest, prompt: list[int], prefix_len: int, budget: int
    ) -> tuple[list[int], int]:
        if self.config.overflow == "error":
            room = f" and room_tokens={request.room_tokens}" if request.room_tokens else ""
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; with max_tokens="
                f"{request.sampling.max_tokens}{room} at most {budget} fit",
                fix="shorten the history, lower max_tokens, raise engine.n_ctx, or set "
                "engine.overflow: truncate",
            )
        if request.prompt is not None:
            # A raw prompt keeps its end: the most recent text matters most.
            return prompt[len(prompt) - budget :], 0
        messages = list(request.messages or ())
        system = [m for m in messages if m.role == "system"]
        rest = [m for m in messages if m.role != "system"]
        while len(rest) > 1:
            rest = rest[1:]
            tokens = self._render([*system, *rest])
            if request.continue_text:
                tokens += self.backend.tokenize(
                    request.continue_text, add_special=False, parse_special=False
                )
            if len(tokens) <= budget:
                return tokens, prefix_len
        raise ContextOverflowError(
            f"even the system prompt and the last message need more than {budget} tokens",
            fix="shorten the persona or the message, or raise engine.n_ctx",
        )


def adapter_key(adapters: Mapping[str, float], loaded: Set[str]) -> AdapterKey:
    """The scheduler's key of a request's adapters (zero scales dropped), checked against
    the `loaded` ones."""
    key = []
    for name, scale in adapters.items():
        if name not in loaded:
            known = ", ".join(sorted(loaded)) or "none"
            raise UnknownAdapterError(
                f"no adapter named {name!r} is loaded (loaded: {known})",
                fix="add it under engine.adapters in mythic.yaml, or load it with "
                "Engine.load_adapter",
            )
        if not math.isfinite(scale):
            raise InvalidRequestError(f"adapter {name!r} has a non-finite scale")
        if scale != 0:
            key.append((name, float(scale)))
    return tuple(sorted(key))


def _schema_text(schema: Mapping[str, Any] | str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, Mapping):
        raise GrammarError("a JSON schema must be an object")
    return json.dumps(enforceable_schema(dict(schema)))
