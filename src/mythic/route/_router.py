"""The router: each request gets a tier by the policy, then an endpoint of that tier by least
outstanding requests among the healthy ones whose breaker is closed; a retryable failure is
retried (with backoff), then the tier's fallback endpoints are tried in order, and the chain
ends in a canned output. A reply dropped mid-stream is continued by the next endpoint that can
continue it, so the player hears one reply, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from mythic.config import RouteSettings, TierSettings
from mythic.engine import (
    Completion,
    DeadlineExceeded,
    Delta,
    GenerationRequest,
    InvalidRequestError,
    RequestCancelled,
    RequestError,
    Timing,
)
from mythic.route._breaker import Breaker, BreakerState
from mythic.route._endpoints import (
    EmbeddedEndpoint,
    Endpoint,
    EndpointError,
    approx_prompt_tokens,
)
from mythic.route._policy import RouteDecision, TierPolicy

if TYPE_CHECKING:
    from mythic.engine import Engine

log = logging.getLogger(__name__)


class NoEndpointError(EndpointError):
    """Every endpoint of the chain failed and the caller gave no canned output."""


@dataclass(slots=True)
class UsageRow:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    """ok, fallback (served by a fallback endpoint), canned, invalid, cancelled."""


class Usage:
    """Tokens, time and requests per tier, NPC and kind."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], UsageRow] = {}

    def record(
        self,
        tier: str,
        npc_id: str,
        kind: str,
        outcome: str,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        seconds: float = 0.0,
    ) -> None:
        row = self.rows.setdefault((tier, npc_id, kind), UsageRow())
        row.requests += 1
        row.prompt_tokens += prompt_tokens
        row.completion_tokens += completion_tokens
        row.seconds += seconds
        row.outcomes[outcome] += 1

    def summary(self) -> dict[str, Any]:
        """Totals by tier and by NPC (JSON-ready): what `mythic usage` prints."""
        tiers: dict[str, dict[str, Any]] = {}
        npcs: dict[str, dict[str, Any]] = {}
        for (tier, npc, kind), row in sorted(self.rows.items()):
            for table, key in ((tiers, tier), (npcs, npc)):
                total = table.setdefault(
                    key,
                    {
                        "requests": 0,
                        "prompt_tokens": 0,
                        "completion_tokens": 0,
                        "seconds": 0.0,
                        "outcomes": {},
                        "kinds": {},
                    },
                )
                total["requests"] += row.requests
                total["prompt_tokens"] += row.prompt_tokens
                total["completion_tokens"] += row.completion_tokens
                total["seconds"] = round(total["seconds"] + row.seconds, 6)
                for outcome, n in row.outcomes.items():
                    total["outcomes"][outcome] = total["outcomes"].get(outcome, 0) + n
                total["kinds"][kind] = total["kinds"].get(kind, 0) + row.requests
        return {"tiers": tiers, "npcs": npcs}


@dataclass(slots=True)
class EndpointState:
    endpoint: Endpoint
    breaker: Breaker
    by_tier: Counter[str] = field(default_factory=Counter)
    """Requests in flight per tier (each tier's `max_batch` bounds its own)."""
    requests: int = 0
    failures: int = 0


class Router:
    """Routes generation requests to tiers and endpoints (ARCHITECTURE.md: route).

    Args:
        route: the effective route settings (`mythic.config.effective_route`).
        endpoints: every endpoint the tiers name, by name.
    """

    def __init__(
        self,
        route: RouteSettings,
        endpoints: dict[str, Endpoint],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        missing = {
            name
            for tier in route.tiers.values()
            for name in (*tier.endpoints, *tier.fallback)
            if name not in endpoints
        }
        if missing:
            raise ValueError(f"no endpoint objects for {sorted(missing)}")
        self.route = route
        self.policy = TierPolicy(route)
        self.usage = Usage()
        self.clock = clock
        self.states = {
            name: EndpointState(
                endpoint, Breaker(route.breaker_failures, route.breaker_cooldown_s, clock)
            )
            for name, endpoint in endpoints.items()
        }
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        """(tier, endpoint or `canned`) -> requests served by the fallback chain."""
        self.retries: Counter[str] = Counter()
        self._slot_freed = asyncio.Event()
        self._health: asyncio.Task[None] | None = None

    # -- what there is -------------------------------------------------------------------------

    def tier(self, name: str) -> TierSettings:
        return self.route.tiers[name]

    def tier_of(self, kind: str, **facts: Any) -> TierSettings:
        """The settings of the tier a request of `kind` would go to (tools, retrieval)."""
        return self.tier(self.policy.decide(kind, **facts).tier)

    def can_continue(self, kind: str) -> bool:
        """Whether every endpoint a request of `kind` may go to (its tier's and their
        fallbacks) can continue a reply from a given start (`GenerationRequest.continue_text`)."""
        tier = self.tier_of(kind)
        names = (*tier.endpoints, *tier.fallback)
        return all(self.states[name].endpoint.can_continue for name in names)

    def engines(self) -> dict[str, Engine]:
        """The embedded engines, by endpoint name (one engine may serve several names)."""
        return {
            name: s.endpoint.engine
            for name, s in self.states.items()
            if isinstance(s.endpoint, EmbeddedEndpoint)
        }

    def engine_for(self, kind: str) -> Engine | None:
        """The embedded engine of the first endpoint of `kind`'s tier, if it is embedded
        (token counting, warm-up)."""
        for name in self.tier_of(kind).endpoints:
            endpoint = self.states[name].endpoint
            if isinstance(endpoint, EmbeddedEndpoint):
                return endpoint.engine
        return None

    def base_model(
        self,
        request: GenerationRequest,
        kind: str,
        *,
        archetype: str | None = None,
        cost: float = 1.0,
    ) -> str:
        """The model that would serve `request`: the first endpoint of its tier's, an embedded
        engine's model name or the model name a remote endpoint sends (which LoRA adapters fit).

        Raises:
            UnknownKindError: `kind` is not a request kind.
        """
        tier = self.decide(request, kind, archetype=archetype, cost=cost).tier
        endpoint = self.states[self.tier(tier).endpoints[0]].endpoint
        if isinstance(endpoint, EmbeddedEndpoint):
            return endpoint.engine.backend.name
        return endpoint.settings.model

    # -- health --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start checking remote endpoints' health (needs a running event loop)."""
        if self._health is None and any(
            not isinstance(s.endpoint, EmbeddedEndpoint) for s in self.states.values()
        ):
            self._health = asyncio.create_task(self._check_health(), name="mythic-health")

    async def check_health(self) -> dict[str, bool]:
        """Check every endpoint once; an endpoint that fails its check is skipped until it
        passes one."""
        names = list(self.states)
        results = await asyncio.gather(*(self.states[n].endpoint.check() for n in names))
        for name, ok in zip(names, results, strict=True):
            endpoint = self.states[name].endpoint
            if endpoint.healthy != ok:
                log.warning("endpoint %s is %s", name, "up again" if ok else "down")
            endpoint.healthy = ok
        return dict(zip(names, results, strict=True))

    async def _check_health(self) -> None:
        while True:
            await self.check_health()
            await asyncio.sleep(self.route.health_interval_s)

    async def aclose(self) -> None:
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
            self._health = None
        for state in self.states.values():
            await state.endpoint.aclose()

    # -- requests ------------------------------------------------------------------------------

    def decide(
        self, request: GenerationRequest, kind: str, *, archetype: str | None, cost: float
    ) -> RouteDecision:
        return self.policy.decide(
            kind,
            context_tokens=approx_prompt_tokens(request),
            deadline_s=request.deadline_s,
            archetype=archetype,
            cost=cost,
        )

    async def open(
        self,
        request: GenerationRequest,
        kind: str,
        *,
        archetype: str | None = None,
        cost: float = 1.0,
        canned: str | None = None,
    ) -> RoutedStream:
        """Route a request and wait until its first delta (or its failure) is known.

        `canned` ends the chain: the reply when no endpoint can give one (None: raise).

        Raises:
            InvalidRequestError: every endpoint refused the request as malformed (a prompt
                longer than any context, for one): the caller's problem, not an outage.
            NoEndpointError: every endpoint failed and `canned` is None.
            UnknownKindError: `kind` is not a request kind.
        """
        decision = self.decide(request, kind, archetype=archetype, cost=cost)
        stream = RoutedStream(self, request, kind, decision, canned)
        await stream._prime()
        return stream

    async def complete(
        self,
        request: GenerationRequest,
        kind: str,
        *,
        archetype: str | None = None,
        cost: float = 1.0,
        canned: str | None = None,
    ) -> Completion:
        """`open` and collect the whole reply."""
        stream = await self.open(request, kind, archetype=archetype, cost=cost, canned=canned)
        async with stream:
            return await stream.collect()

    async def _pick(self, names: list[str], tier: str, deadline: float | None) -> EndpointState:
        """The least busy endpoint of `names` that is healthy, whose breaker lets a request
        through and that has a free slot of the tier; waits for a slot when all are busy.

        Raises:
            NoEndpointError: none is healthy and available.
            DeadlineExceeded: no slot freed before the deadline.
        """
        max_batch = self.tier(tier).max_batch
        while True:
            up = [
                self.states[n]
                for n in names
                if self.states[n].endpoint.healthy and self.states[n].breaker.available()
            ]
            if not up:
                raise NoEndpointError(f"no endpoint of {names} is up")
            free = [s for s in up if s.by_tier[tier] < max_batch]
            if free:
                best = min(free, key=lambda s: s.endpoint.outstanding)
                best.breaker.acquire()
                return best
            self._slot_freed.clear()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            try:
                async with asyncio.timeout(timeout):
                    await self._slot_freed.wait()
            except TimeoutError:
                raise DeadlineExceeded("no endpoint had a free slot before the deadline") from None

    def _release(self, state: EndpointState, tier: str) -> None:
        state.by_tier[tier] -= 1
        state.endpoint.outstanding -= 1
        self._slot_freed.set()


class RoutedStream:
    """The deltas of one routed request: async iterator, `async with`, `collect()`.

    `tier` is the tier it was routed to; `served_by` the endpoint that produced the end of the
    reply (`canned` for the canned output).
    """

    def __init__(
        self,
        router: Router,
        request: GenerationRequest,
        kind: str,
        decision: RouteDecision,
        canned: str | None,
    ) -> None:
        self.router = router
        self.request = request
        self.request_id = request.request_id
        self.kind = kind
        self.decision = decision
        self.tier = decision.tier
        self.canned = canned
        self.served_by: str | None = None
        self.attempts: list[tuple[str, str]] = []
        """(endpoint, outcome) of each try, in order."""
        self._queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._first: Delta | None = None
        self._done = False

    async def _produce(self) -> None:
        """Runs the chain in its own task, so a deadline or a cancellation never reaches
        the consumer's task."""
        try:
            async for delta in self._run():
                self._queue.put_nowait(delta)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._queue.put_nowait(exc)
        else:
            self._queue.put_nowait(None)

    async def _prime(self) -> None:
        self._task = asyncio.create_task(self._produce(), name=f"route-{self.request_id}")
        try:
            first = await self._queue.get()
        except BaseException:
            await self.aclose()
            raise
        if isinstance(first, BaseException):
            self._done = True
            raise first
        self._first = first

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        item: Delta | BaseException | None
        if self._first is not None:
            item, self._first = self._first, None
        elif self._done:
            raise StopAsyncIteration
        else:
            item = await self._queue.get()
        if item is None:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finish_reason is not None:
            self._done = True
        return item

    async def collect(self) -> Completion:
        """Wait for the whole reply."""
        return Completion.from_deltas(self.request_id, [delta async for delta in self])

    def cancel(self) -> bool:
        """Stop the request (barge-in); False when it already finished."""
        if self._task is None or self._task.done():
            return False
        self._done = True
        self._task.cancel()
        return True

    async def aclose(self) -> None:
        """Stop the request if it is still running and wait until its endpoint let go."""
        self._done = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def __aenter__(self) -> RoutedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the chain -----------------------------------------------------------------------------

    async def _run(self) -> AsyncIterator[Delta]:
        router = self.router
        tier = router.tier(self.tier)
        request = self.request
        if request.sampling.max_tokens > tier.max_tokens:
            request = replace(
                request, sampling=replace(request.sampling, max_tokens=tier.max_tokens)
            )
        deadline_s = request.deadline_s or tier.deadline_s
        start = router.clock()
        deadline = start + deadline_s if deadline_s is not None else None
        said = ""
        tokens = 0
        invalid: InvalidRequestError | None = None
        failed = False
        served_outcome = "ok"
        # (endpoint names to pick from, tries): the tier's own with retries, then each fallback.
        plan = [(tier.endpoints, 1 + tier.retries), *(([name], 1) for name in tier.fallback)]
        try:
            for step, (names, tries) in enumerate(plan):
                backoff = tier.backoff_s
                for attempt in range(tries):
                    if attempt:
                        router.retries[self.tier] += 1
                        await asyncio.sleep(backoff)
                        backoff *= 2
                    try:
                        state = await router._pick(names, self.tier, deadline)
                    except NoEndpointError:
                        break
                    except DeadlineExceeded:  # every slot busy until the deadline
                        raise _Deadline() from None
                    endpoint = state.endpoint
                    if (said or request.continue_text) and not endpoint.can_continue:
                        state.breaker.release()
                        self.attempts.append((endpoint.name, "cannot continue"))
                        break
                    sub = replace(
                        request,
                        continue_text=request.continue_text + said,
                        request_id=f"{request.request_id}-{len(self.attempts)}",
                        deadline_s=(
                            None if deadline is None else max(0.001, deadline - router.clock())
                        ),
                    )
                    state.requests += 1
                    state.by_tier[self.tier] += 1
                    endpoint.outstanding += 1
                    outcome = "failed"
                    try:
                        async with asyncio.timeout_at(_loop_time(deadline, router.clock)):
                            async for delta in endpoint.stream(sub):
                                if delta.text:
                                    said += delta.text
                                tokens += delta.tokens
                                if delta.finish_reason is not None:
                                    outcome = "ok"
                                    state.breaker.success()
                                    self.served_by = endpoint.name
                                    if step:
                                        served_outcome = "fallback"
                                        router.fallbacks[(self.tier, endpoint.name)] += 1
                                    self._account(served_outcome, delta, tokens, start)
                                yield replace(delta, request_id=self.request_id)
                                if outcome == "ok":
                                    return  # the reply is whole: nothing more to read
                        raise EndpointError(f"{endpoint.name}: the stream ended without a finish")
                    except InvalidRequestError as exc:
                        outcome = "invalid"
                        invalid = exc
                        state.breaker.release()
                        break  # not retried here; the next endpoint of the chain may take it
                    except (TimeoutError, DeadlineExceeded):
                        outcome = "deadline"
                        state.breaker.release()
                        raise _Deadline() from None
                    except RequestCancelled:
                        outcome = "cancelled"
                        state.breaker.release()
                        raise
                    except (EndpointError, RequestError) as exc:
                        failed = True
                        state.failures += 1
                        state.breaker.failure()
                        if state.breaker.state is BreakerState.OPEN:
                            log.warning("endpoint %s: breaker open (%s)", endpoint.name, exc)
                        else:
                            log.info("endpoint %s failed: %s", endpoint.name, exc)
                    finally:
                        self.attempts.append((endpoint.name, outcome))
                        router._release(state, self.tier)
        except _Deadline:
            pass
        except asyncio.CancelledError:
            if self.served_by is None:  # not after the last delta went out
                router.usage.record(self.tier, request.npc_id, self.kind, "cancelled")
            raise
        if invalid is not None and not failed and not said:
            router.usage.record(self.tier, request.npc_id, self.kind, "invalid")
            raise invalid
        if self.canned is None:
            router.usage.record(self.tier, request.npc_id, self.kind, "failed")
            tried = ", ".join(f"{n}: {o}" for n, o in self.attempts) or "none available"
            raise NoEndpointError(f"no endpoint of tier {self.tier} answered ({tried})")
        text = self.canned if not (said or request.continue_text) else f" {self.canned}"
        self.served_by = "canned"
        router.fallbacks[(self.tier, "canned")] += 1
        now = router.clock()
        delta = Delta(
            request_id=self.request_id,
            text=text,
            tokens=0,
            timing=Timing(0.0, now - start, 0.0, now - start),
            finish_reason="stop",
        )
        self._account("canned", delta, tokens, start)
        yield delta

    def _account(self, outcome: str, last: Delta, tokens: int, start: float) -> None:
        self.router.usage.record(
            self.tier,
            self.request.npc_id,
            self.kind,
            outcome,
            prompt_tokens=last.prompt_tokens,
            completion_tokens=tokens,
            seconds=self.router.clock() - start,
        )


class _Deadline(Exception):  # noqa: N818 - internal signal
    """The request's deadline passed: the chain ends in the canned output at once."""


def _loop_time(deadline: float | None, clock: Callable[[], float]) -> float | None:
    if deadline is None:
        return None
    return asyncio.get_running_loop().time() + max(0.0, deadline - clock())
