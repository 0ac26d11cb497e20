"""What callers hand the engine and what streams back."""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mythic.engine._backend import Sampling
from mythic.engine._chat_format import ChatMessage
from mythic.engine._scheduler import Priority

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(slots=True)
class GenerationRequest:
    """One generation for one NPC.

    Exactly one of `messages` (rendered with the model's chat format) and `prompt` (raw text,
    the model's BOS added if it wants one) is given.
    """

    npc_id: str
    messages: Sequence[ChatMessage] | None = None
    prompt: str | None = None
    session_id: str = "default"
    """With `npc_id`, names the conversation whose KV the engine keeps between turns."""
    priority: Priority = Priority.SILVER
    deadline_s: float | None = None
    """Seconds after submission by which the reply must be complete; missed: `DeadlineExceeded`."""
    sampling: Sampling = field(default_factory=Sampling)
    json_schema: Mapping[str, Any] | str | None = None
    """Constrain the output to JSON valid under this schema."""
    grammar: str | None = None
    """Constrain the output to a GBNF grammar (root rule `root`)."""
    adapters: Mapping[str, float] = field(default_factory=dict)
    """LoRA adapters to apply, by loaded name, with their scales."""
    room_tokens: int = 0
    """Context the prompt must leave free beyond `sampling.max_tokens`: a prompt that leaves
    less overflows as one too long for `max_tokens` does. A warm-up that evaluates the start
    of a longer prompt to come (one token generated) keeps room for the rest with it."""
    finish_step_on_cancel: bool = False
    """A cancel lets the model step evaluating this request's prompt finish rather than
    stopping it part-way (what the step evaluates is then kept, not rolled back). For
    warm-ups whose prompt the session's next one extends: stopped for the line, they hand
    the line the tokens of their last step instead of losing them."""
    step_tokens: int | None = None
    """Most prompt tokens of this request one model step evaluates (None: the scheduler's
    chunking, a whole step when nothing else runs). A warm-up that a line may stop keeps its
    steps short: the line waits for its last step to end (`finish_step_on_cancel`), and
    llama.cpp cannot end a step early without losing it. On 2 CPU cores a step of 16 tokens
    of Qwen2.5 0.5B took 150 ms at 84% of a long step's speed (one of 128: 980 ms)."""
    keep_session: bool = True
    """Keep the request's sequence for the session's next turn. False (a warm-up that exists to
    evaluate a shared prefix, a persona): the sequence is dropped when the request ends and
    only the prefix it shared stays cached, holding no sequence slot of its own."""
    continue_text: str = ""
    """Reply text already given (the start its caller chose, as an NPC's greeting; what an
    endpoint that failed mid-stream had said): the prompt ends with it and the generation
    continues it. Only with `messages`."""
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(slots=True, frozen=True)
class Timing:
    """Where a request's time went, in seconds since it was submitted."""

    queue_wait_s: float
    """Until its first chunk was scheduled."""
    first_token_s: float | None
    """Until its first generated token (None before it)."""
    token_s: float
    """Since the previous delta, per token in this delta."""
    elapsed_s: float


@dataclass(slots=True, frozen=True)
class Delta:
    """A piece of a streamed reply."""

    request_id: str
    text: str
    tokens: int
    """Tokens generated since the previous delta."""
    timing: Timing
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    """Set on the last delta: tokens in the prompt."""
    cached_tokens: int = 0
    """Set on the last delta: prompt tokens reused from the KV cache instead of evaluated."""


@dataclass(slots=True, frozen=True)
class Completion:
    """A whole reply, collected from its deltas."""

    request_id: str
    text: str
    finish_reason: FinishReason
    tokens: int
    prompt_tokens: int
    cached_tokens: int
    timing: Timing

    @classmethod
    def from_deltas(cls, request_id: str, deltas: Sequence[Delta]) -> Completion:
        """The reply of a finished stream's deltas (the last one has the finish reason)."""
        last = deltas[-1]
        assert last.finish_reason is not None
        return cls(
            request_id=request_id,
            text="".join(d.text for d in deltas),
            finish_reason=last.finish_reason,
            tokens=sum(d.tokens for d in deltas),
            prompt_tokens=last.prompt_tokens,
            cached_tokens=last.cached_tokens,
            timing=last.timing,
        )


StreamItem = Delta | BaseException


class _Stream:
    """What both stream flavours share: the request id, cancelling, and ending on the last
    delta or on an error."""

    def __init__(self, request_id: str, cancel: Callable[[str], bool]) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._done = False

    def _receive(self, item: StreamItem) -> Delta:
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finish_reason is not None:
            self._done = True
        return item

    def cancel(self) -> bool:
        """Stop generating (barge-in); the stream ends with finish_reason `cancelled`.
        False when the request already finished."""
        return False if self._done else self._cancel(self.request_id)


class RequestStream(_Stream):
    """The deltas of one submitted request, as an async iterator.

    Leaving `async with` early (or calling `cancel`) cancels the request; the engine frees its
    sequence within one step.
    """

    def __init__(self, request_id: str, cancel: Callable[[str], bool]) -> None:
        super().__init__(request_id, cancel)
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()

    def _put(self, item: StreamItem) -> bool:
        """Called from the engine's thread; False when nobody can receive any more (the
        caller's event loop is closed), so the engine cancels the request."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            return False
        return True

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        return self._receive(await self._queue.get())

    async def collect(self) -> Completion:
        """Wait for the whole reply."""
        return Completion.from_deltas(self.request_id, [delta async for delta in self])

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cancel()


class SyncRequestStream(_Stream):
    """The deltas of one submitted request, for a caller without an event loop (the CLI)."""

    def __init__(self, request_id: str, cancel: Callable[[str], bool]) -> None:
        super().__init__(request_id, cancel)
        self._queue: queue.SimpleQueue[StreamItem] = queue.SimpleQueue()

    def _put(self, item: StreamItem) -> bool:
        self._queue.put(item)
        return True

    def __iter__(self) -> Iterator[Delta]:
        while not self._done:
            yield self._receive(self._queue.get())

    def collect(self) -> Completion:
        """Wait for the whole reply."""
        return Completion.from_deltas(self.request_id, list(self))
