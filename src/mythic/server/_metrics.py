"""/metrics: the gateway's, the NPCs' and the engines' counters in Prometheus text format."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from mythic.observability import percentile
from mythic.route import BreakerState
from mythic.voice import HOPS

if TYPE_CHECKING:
    from mythic.archetypes import ChainRouter
    from mythic.engine import Engine
    from mythic.server._app import Gateway


class _GatewayCollector(Collector):
    """Reads the live counters when scraped; nothing is updated on the hot path for it."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        g = self.gateway
        m, stats = g.metrics, g.cast.stats
        yield CounterMetricFamily(
            "mythic_ws_connections", "WebSocket connections accepted", value=m.connections
        )
        yield GaugeMetricFamily(
            "mythic_ws_open_connections", "WebSocket connections open", value=m.open_connections
        )
        yield GaugeMetricFamily("mythic_sessions", "sessions held", value=len(g.sessions))
        yield GaugeMetricFamily("mythic_npc_actors", "NPC actors running", value=len(g.cast.actors))
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # rendered outside the server's loop
            tasks = None
        if tasks is not None:
            yield GaugeMetricFamily(
                "mythic_asyncio_tasks",
                "asyncio tasks alive on the server's loop (a leak makes it grow: bench/soak.py)",
                value=tasks,
            )
        for name, doc, counter in (
            ("mythic_ws_messages_in", "messages received, by type", m.messages_in),
            ("mythic_ws_messages_out", "messages sent, by type", m.messages_out),
        ):
            family = CounterMetricFamily(name, doc, labels=["type"])
            for kind, n in sorted(counter.items()):
                family.add_metric([kind], n)
            yield family
        errors = CounterMetricFamily(
            "mythic_errors", "Error messages sent, by code", labels=["code"]
        )
        for code, n in sorted(m.errors.items()):
            errors.add_metric([code], n)
        yield errors
        turns = CounterMetricFamily(
            "mythic_turns", "NPC turns, by finish reason", labels=["finish"]
        )
        for reason, n in sorted(stats.turns.items()):
            turns.add_metric([reason], n)
        yield turns
        tools = CounterMetricFamily(
            "mythic_tool_calls", "tool calls, by outcome", labels=["status"]
        )
        for status, n in sorted(stats.tool_calls.items()):
            tools.add_metric([status], n)
        yield tools
        intents = CounterMetricFamily("mythic_intents", "intents decided", labels=["intent"])
        for intent, n in sorted(stats.intents.items()):
            intents.add_metric([intent], n)
        yield intents
        yield CounterMetricFamily("mythic_barge_ins", "turns cut off", value=stats.barge_ins)
        yield GaugeMetricFamily("mythic_scenes", "scenes open", value=len(g.scenes.scenes))
        chosen = CounterMetricFamily(
            "mythic_scene_speakers",
            "scene lines answered, by how the speaker was chosen (name, to, selector, nobody)",
            labels=["chosen_by"],
        )
        for how, n in sorted(g.scenes.selections.items()):
            chosen.add_metric([how], n)
        yield chosen
        yield CounterMetricFamily(
            "mythic_scene_selector_failures",
            "speaker selector decisions that failed or timed out (the last speaker answered)",
            value=g.scenes.selector_failures,
        )
        caught = CounterMetricFamily(
            "mythic_reply_tries_caught",
            "reply tries the line filter caught (assistant, narration, taboo, repeat, echo)",
            labels=["kind"],
        )
        for kind, n in sorted(stats.caught.items()):
            caught.add_metric([kind], n)
        yield caught
        violations = CounterMetricFamily(
            "mythic_safety_violations",
            "content-policy violations by where (player, reply, tool) and category: each "
            "replaced by the NPC's deflection or refused",
            labels=["where", "category"],
        )
        for (where, category), n in sorted(stats.safety.items()):
            violations.add_metric([where, category], n)
        yield violations
        yield CounterMetricFamily(
            "mythic_actor_restarts",
            "NPC actors restarted after a crash",
            value=stats.actor_restarts,
        )
        yield CounterMetricFamily(
            "mythic_phrases", "reply phrases handed to speech", value=stats.phrases
        )
        yield CounterMetricFamily(
            "mythic_warm_ups",
            "reply prompts prepared while the player was still speaking",
            value=stats.warm_ups,
        )
        yield CounterMetricFamily(
            "mythic_spoken_replies_capped",
            "spoken replies stopped at dialogue.spoken_max_sentences sentences",
            value=stats.capped,
        )
        prompt = CounterMetricFamily(
            "mythic_reply_prompt_tokens",
            "prompt tokens of replies: evaluated when the line came, or cached before it",
            labels=["source"],
        )
        prompt.add_metric(["evaluated"], stats.reply_prompt_tokens - stats.reply_cached_tokens)
        prompt.add_metric(["cached"], stats.reply_cached_tokens)
        yield prompt
        yield from _quantiles(
            "mythic_turn_first_token_seconds",
            "player line received to first reply delta sent (recent turns)",
            stats.first_tokens,
        )
        if g.voice is not None:
            yield from _voice_metrics(g)
        if g.memory is not None:
            yield from _memory_metrics(g)
        yield from _knowledge_metrics(g)
        yield from _route_metrics(g)
        if g.chains is not None:
            yield from _chain_metrics(g.chains)
        engines: dict[str, Engine] = {}
        for name, engine in g.router.engines().items():
            if all(engine is not e for e in engines.values()):
                engines[name] = engine  # one engine may serve several endpoint names
        for role, engine in engines.items():
            em = engine.metrics()
            for name, doc, value in (
                ("mythic_engine_running", "requests generating", em.running),
                ("mythic_engine_waiting", "requests queued", em.waiting),
                (
                    "mythic_engine_kv_cells_reserved",
                    "KV cells held by sequences",
                    em.kv_cells_reserved,
                ),
                ("mythic_engine_kv_capacity", "KV cells in all", em.kv_capacity),
                (
                    "mythic_engine_parked_bytes",
                    "host memory holding evicted sessions' KV (engine.park_mb)",
                    em.parked_bytes,
                ),
                ("mythic_engine_tokens_per_s", "generated tokens/s", em.tokens_per_s),
                ("mythic_engine_prefix_hit_rate", "prompt tokens from cache", em.prefix_hit_rate),
                ("mythic_engine_generated_tokens", "tokens generated", em.generated_tokens),
                ("mythic_engine_preemptions", "steps stopped for gold", em.preemptions),
                (
                    "mythic_engine_adapter_switches",
                    "decode calls that changed the adapter set",
                    em.adapter_switches,
                ),
            ):
                gauge = GaugeMetricFamily(name, doc, labels=["engine"])
                gauge.add_metric([role], value)
                yield gauge
            used = CounterMetricFamily(
                "mythic_engine_adapter_requests",
                "requests submitted with each LoRA adapter",
                labels=["engine", "adapter"],
            )
            for adapter, n in em.adapter_requests.items():
                used.add_metric([role, adapter], n)
            yield used


def _route_metrics(g: Gateway) -> Iterator[Metric]:
    router = g.router
    requests = CounterMetricFamily(
        "mythic_usage_requests",
        "routed requests by tier, NPC, kind and outcome (ok, fallback, canned, invalid, ...)",
        labels=["tier", "npc", "kind", "outcome"],
    )
    tokens = CounterMetricFamily(
        "mythic_usage_tokens",
        "tokens by tier, NPC and direction (prompt, completion)",
        labels=["tier", "npc", "direction"],
    )
    seconds = CounterMetricFamily(
        "mythic_usage_seconds", "request time by tier and NPC", labels=["tier", "npc"]
    )
    by_npc: dict[tuple[str, str], list[float]] = {}
    for (tier, npc, kind), row in sorted(router.usage.rows.items()):
        for outcome, n in sorted(row.outcomes.items()):
            requests.add_metric([tier, npc, kind, outcome], n)
        total = by_npc.setdefault((tier, npc), [0, 0, 0.0])
        total[0] += row.prompt_tokens
        total[1] += row.completion_tokens
        total[2] += row.seconds
    for (tier, npc), (prompt, completion, spent) in by_npc.items():
        tokens.add_metric([tier, npc, "prompt"], prompt)
        tokens.add_metric([tier, npc, "completion"], completion)
        seconds.add_metric([tier, npc], spent)
    yield requests
    yield tokens
    yield seconds
    health = GaugeMetricFamily(
        "mythic_endpoint_up", "1 while an endpoint passes its health check", labels=["endpoint"]
    )
    breaker = GaugeMetricFamily(
        "mythic_endpoint_breaker_open",
        "1 while an endpoint's circuit breaker is open or half-open",
        labels=["endpoint"],
    )
    outstanding = GaugeMetricFamily(
        "mythic_endpoint_outstanding", "requests in flight", labels=["endpoint"]
    )
    failures = CounterMetricFamily(
        "mythic_endpoint_failures", "failed requests", labels=["endpoint"]
    )
    for name, state in sorted(router.states.items()):
        health.add_metric([name], int(state.endpoint.healthy))
        breaker.add_metric([name], int(state.breaker.state is not BreakerState.CLOSED))
        outstanding.add_metric([name], state.endpoint.outstanding)
        failures.add_metric([name], state.failures)
    yield health
    yield breaker
    yield outstanding
    yield failures
    fallbacks = CounterMetricFamily(
        "mythic_route_fallbacks",
        "requests answered by a tier's fallback chain (an endpoint, or `canned`)",
        labels=["tier", "to"],
    )
    for (tier, to), n in sorted(router.fallbacks.items()):
        fallbacks.add_metric([tier, to], n)
    yield fallbacks
    if g.jobs is not None and g.jobs.workers:
        jobs = CounterMetricFamily(
            "mythic_jobs", "bronze job attempts in this server, by outcome", labels=["outcome"]
        )
        totals: Counter[str] = Counter()
        for worker in g.jobs.workers:
            totals.update(worker.counts)
        for outcome, n in sorted(totals.items()):
            jobs.add_metric([outcome], n)
        yield jobs
    if g.jobs is not None:
        yield GaugeMetricFamily(
            "mythic_jobs_artifacts_applied",
            "bronze artifacts in the NPCs' knowledge",
            value=len(g.jobs.follower.applied),
        )


def _chain_metrics(chains: ChainRouter) -> Iterator[Metric]:
    stats = chains.stats
    served = CounterMetricFamily(
        "mythic_adapter_served",
        "requests given their archetype's adapter, by archetype and task",
        labels=["archetype", "task"],
    )
    for (archetype, task), n in sorted(stats.served.items()):
        served.add_metric([archetype, task], n)
    yield served
    fallbacks = CounterMetricFamily(
        "mythic_adapter_fallbacks",
        "requests served by the base model instead of an archetype adapter, by reason "
        "(unregistered, other_base, format, not_resident, load_failed, rank_budget, refused)",
        labels=["archetype", "task", "reason"],
    )
    for (archetype, task, reason), n in sorted(stats.fallbacks.items()):
        fallbacks.add_metric([archetype, task, reason], n)
    yield fallbacks
    background = CounterMetricFamily(
        "mythic_adapter_background_loads",
        "adapters loaded in the background for the next request, by outcome",
        labels=["outcome"],
    )
    for outcome, n in sorted(stats.loads.items()):
        background.add_metric([outcome], n)
    yield background
    refreshes = CounterMetricFamily(
        "mythic_archetype_registry_reads", "archetype registry reads", labels=["outcome"]
    )
    refreshes.add_metric(["ok"], stats.refreshes)
    refreshes.add_metric(["failed"], stats.refresh_failures)
    yield refreshes
    resident = GaugeMetricFamily(
        "mythic_adapters_resident", "adapters loaded on demand", labels=["model"]
    )
    resident_bytes = GaugeMetricFamily(
        "mythic_adapters_resident_bytes", "bytes of adapters loaded on demand", labels=["model"]
    )
    budget = GaugeMetricFamily(
        "mythic_adapters_budget_bytes", "engine.adapter_budget_mb in bytes", labels=["model"]
    )
    lookups = CounterMetricFamily(
        "mythic_adapter_lookups",
        "adapter loads asked for: already resident (hit) or loaded (miss)",
        labels=["model", "result"],
    )
    loads = CounterMetricFamily(
        "mythic_adapter_loads", "adapters loaded, by outcome", labels=["model", "outcome"]
    )
    evictions = CounterMetricFamily(
        "mythic_adapter_evictions",
        "adapters unloaded to make room (least recently used, not in use)",
        labels=["model"],
    )
    for model, res in sorted(chains.residents.items()):
        rs = res.stats
        resident.add_metric([model], len(res))
        resident_bytes.add_metric([model], res.used_bytes)
        budget.add_metric([model], res.budget_bytes)
        lookups.add_metric([model, "hit"], rs.hits)
        lookups.add_metric([model, "miss"], rs.misses)
        loads.add_metric([model, "ok"], rs.loads)
        loads.add_metric([model, "failed"], rs.load_failures)
        evictions.add_metric([model], rs.evictions)
    yield from (resident, resident_bytes, budget, lookups, loads, evictions)


def _memory_metrics(g: Gateway) -> Iterator[Metric]:
    memory = g.memory
    assert memory is not None
    archive, stats = memory.archiver.stats, memory.stats
    yield GaugeMetricFamily(
        "mythic_memory_hot_entries", "NPCxplayer entries in hot memory", value=len(memory.hot)
    )
    yield GaugeMetricFamily(
        "mythic_memory_hot_bytes", "hot memory size (estimate)", value=memory.hot.bytes
    )
    warm_up = getattr(memory.warm, "up", True)
    yield GaugeMetricFamily(
        "mythic_memory_warm_up",
        "1 while Redis answers (0: on the embedded fallback)",
        value=int(warm_up),
    )
    yield GaugeMetricFamily(
        "mythic_memory_archive_down",
        "1 while the archive is spooling",
        value=int(memory.archiver.down),
    )
    yield GaugeMetricFamily(
        "mythic_memory_archive_pending",
        "events queued for the archive",
        value=memory.archiver.pending,
    )
    for name, doc, value in (
        ("mythic_memory_archived", "events written to the archive in batches", archive.written),
        ("mythic_memory_spooled", "events spooled while the archive was down", archive.spooled),
        ("mythic_memory_replayed", "spooled events replayed into the archive", archive.replayed),
        ("mythic_memory_summaries", "session summaries written", stats.summaries),
        ("mythic_memory_prefetch_timeouts", "prefetches that gave up", stats.prefetch_timeouts),
    ):
        yield CounterMetricFamily(name, doc, value=value)
    yield from _quantiles(
        "mythic_memory_prefetch_seconds",
        "warm to hot at conversation start",
        stats.prefetch_seconds,
    )


def _knowledge_metrics(g: Gateway) -> Iterator[Metric]:
    knowledge = g.knowledge
    stats = knowledge.stats
    yield GaugeMetricFamily(
        "mythic_knowledge_chunks", "lore chunks indexed", value=knowledge.chunks
    )
    yield GaugeMetricFamily(
        "mythic_knowledge_skipped_files",
        "lore files left out (unreadable, too large, malformed)",
        value=len(knowledge.world.skipped),
    )
    yield CounterMetricFamily(
        "mythic_knowledge_retrievals", "turns packed with retrieval", value=stats.retrievals
    )
    yield CounterMetricFamily("mythic_knowledge_reloads", "world reloads", value=stats.reloads)
    yield CounterMetricFamily(
        "mythic_knowledge_reload_failures",
        "world reloads refused (broken cards)",
        value=stats.reload_failures,
    )
    yield from _quantiles(
        "mythic_knowledge_seconds", "retrieval plus context packing per turn", stats.seconds
    )


def _voice_metrics(g: Gateway) -> Iterator[Metric]:

    assert g.voice is not None
    stats = g.voice.stats
    yield GaugeMetricFamily("mythic_voice_ready", "speech models loaded", value=g.voice.ready)
    for name, doc, value in (
        ("mythic_voice_utterances", "spoken lines that became player lines", stats.utterances),
        ("mythic_voice_no_words", "utterances with no words recognised", stats.no_words),
        ("mythic_voice_backchannels", "backchannels that did not interrupt", stats.backchannels),
        ("mythic_voice_barge_ins", "NPC speech cut off by the player's", stats.barge_ins),
        (
            "mythic_voice_false_interruptions",
            "NPC speech paused for sound that was not words, then resumed",
            stats.false_interruptions,
        ),
        ("mythic_voice_chunks_sent", "TTS chunks sent", stats.chunks_sent),
    ):
        yield CounterMetricFamily(name, doc, value=value)
    verdicts = CounterMetricFamily(
        "mythic_voice_turn_verdicts",
        "the turn model's verdicts at the players' pauses (complete ends the turn at once)",
        labels=["verdict"],
    )
    for verdict in ("complete", "incomplete"):
        verdicts.add_metric([verdict], stats.turn_verdicts[verdict])
    yield verdicts
    preempted = CounterMetricFamily(
        "mythic_voice_preempted",
        "replies started from a pause's transcript before the turn ended, by outcome",
        labels=["outcome"],
    )
    for outcome, n in (
        ("started", stats.preempted),
        ("kept", stats.preempt_kept),
        ("discarded", stats.preempt_discarded),
    ):
        preempted.add_metric([outcome], n)
    yield preempted
    errors = CounterMetricFamily("mythic_voice_errors", "voice errors, by code", labels=["code"])
    for code, n in sorted(stats.errors.items()):
        errors.add_metric([code], n)
    yield errors
    traces = list(stats.traces)
    for hop in HOPS:
        yield from _quantiles(
            f"mythic_voice_{hop}_seconds",
            f"end of the player's utterance to {hop.replace('_', ' ')} (recent voice turns)",
            [t[hop] for t in traces if hop in t],
        )


def _quantiles(name: str, doc: str, samples: Iterable[float]) -> Iterator[Metric]:
    """p50/p95/p99 of recent samples as a gauge with a `quantile` label; nothing when none."""
    values = list(samples)
    if values:
        family = GaugeMetricFamily(name, doc, labels=["quantile"])
        for q in (0.5, 0.95, 0.99):
            family.add_metric([str(q)], percentile(values, q) or 0.0)  # values is not empty
        yield family


def render_metrics(gateway: Gateway) -> tuple[str, str]:
    """The exposition text and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_GatewayCollector(gateway))
    return generate_latest(registry).decode(), CONTENT_TYPE_LATEST
