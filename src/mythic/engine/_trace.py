"""The engine's step trace: what each model step evaluated, for whom, and when each request
arrived, counted in steps rather than seconds.

Off by default (`engine.trace_steps: 0`). On, the worker appends one record per step it ran
and one per request submitted; both are bounded rings. Questions about scheduling ("did the
ambient chatter of a scene hold a player's line back?") are answered in steps, which the
machine's noise does not move: `steps_behind` counts the steps a request waited beyond the
fewest its prompt could have taken with the engine to itself.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from mythic.engine._scheduler import Priority, SchedulerOutput


@dataclass(slots=True, frozen=True)
class TracedChunk:
    """One request's part of a step: `tokens` evaluated (prompt, or its one generated token),
    and whether a token was sampled."""

    request_id: str
    priority: Priority
    tokens: int
    prefill: bool
    sample: bool


@dataclass(slots=True, frozen=True)
class TracedStep:
    """A step the worker ran: its index (from 0) and every request's part of it."""

    index: int
    chunks: tuple[TracedChunk, ...]


@dataclass(slots=True, frozen=True)
class TracedRequest:
    """A request as it arrived: `arrived` is the index of the first step that could include
    it (the steps scheduled before it was submitted, the one running among them, have
    lower indexes)."""

    request_id: str
    npc_id: str
    session_id: str | None
    priority: Priority
    arrived: int


class EngineTrace:
    """The last `max_steps` steps and the requests submitted meanwhile. Thread-safe: the
    worker writes, anyone reads."""

    def __init__(self, max_steps: int, *, step_cap: int) -> None:
        if max_steps < 1:
            raise ValueError("an engine trace keeps at least one step")
        self.step_cap = step_cap
        """The most prompt tokens one sequence may evaluate in a step (the backend's batch
        and per-sequence limits): the fewest steps a prompt takes alone follow from it."""
        self._steps: deque[TracedStep] = deque(maxlen=max_steps)
        self._requests: OrderedDict[str, TracedRequest] = OrderedDict()
        self._max_requests = max_steps
        self._scheduled = 0
        self._lock = threading.Lock()

    # -- written by the worker -------------------------------------------------------------

    def arrived(
        self, request_id: str, npc_id: str, session_id: str | None, priority: Priority
    ) -> None:
        with self._lock:
            self._requests[request_id] = TracedRequest(
                request_id, npc_id, session_id, priority, self._scheduled
            )
            while len(self._requests) > self._max_requests:
                self._requests.popitem(last=False)

    def begin(self) -> int:
        """A step is scheduled: its index. Called under the engine's lock, as `arrived` is:
        a request submitted before it may be in it, one submitted after may not."""
        with self._lock:
            index = self._scheduled
            self._scheduled += 1
            return index

    def ran(self, index: int, output: SchedulerOutput, priorities: dict[str, Priority]) -> None:
        """Step `index` ran `output` (only the batches that ran); `priorities` by request."""
        chunks = tuple(
            TracedChunk(
                c.request_id,
                priorities.get(c.request_id, Priority.SILVER),
                c.n_tokens,
                c.prefill,
                c.sample,
            )
            for c in output.chunks()
        )
        with self._lock:
            self._steps.append(TracedStep(index, chunks))

    # -- read by anyone ----------------------------------------------------------------------

    @property
    def steps(self) -> list[TracedStep]:
        with self._lock:
            return list(self._steps)

    @property
    def requests(self) -> list[TracedRequest]:
        with self._lock:
            return list(self._requests.values())

    def request(self, request_id: str) -> TracedRequest | None:
        with self._lock:
            return self._requests.get(request_id)

    def first_token_step(self, request_id: str) -> int | None:
        """The step that sampled the request's first token (None: not in the trace yet)."""
        for step in self.steps:
            if any(c.request_id == request_id and c.sample for c in step.chunks):
                return step.index
        return None

    def steps_behind(self, request_id: str) -> int | None:
        """Steps from the request's arrival to its first token, beyond the fewest its prompt
        needed alone (its evaluated prompt tokens over `step_cap`, at least one step). 0: it
        was never held back; None: it has no first token in the trace.

        A request arriving while a step runs waits for that step too: that step has an index
        below its arrival, so it is not counted here (it is the one step any request may
        wait, with the engine to itself or not)."""
        arrival = self.request(request_id)
        first = self.first_token_step(request_id)
        if arrival is None or first is None:
            return None
        evaluated = sum(
            c.tokens
            for s in self.steps
            if arrival.arrived <= s.index <= first
            for c in s.chunks
            if c.request_id == request_id and c.prefill
        )
        fewest = max(1, math.ceil(evaluated / self.step_cap))
        return first - arrival.arrived + 1 - fewest

    def shared_with(self, request_id: str, priorities: set[Priority]) -> int:
        """Steps from the request's arrival to its first token that also advanced a request
        of one of `priorities` (the trace held something it could have been delayed by)."""
        arrival = self.request(request_id)
        first = self.first_token_step(request_id)
        if arrival is None or first is None:
            return 0
        return sum(
            1
            for s in self.steps
            if arrival.arrived <= s.index <= first
            and any(c.request_id == request_id for c in s.chunks)
            and any(c.priority in priorities for c in s.chunks)
        )
