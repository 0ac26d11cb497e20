"""What every NPC actor of a cast shares: the world, the engines' router, memory, knowledge,
the settings, and where its messages, phrases and tool calls go.

`Cast` builds one `Stage` and hands it to each actor it starts; an actor reaches everything
outside itself through it, and never the cast.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mythic.archetypes import AdapterTask, ChainRouter
from mythic.config import MythicSettings
from mythic.contracts import ServerMessage
from mythic.dialogue._moves import LineClassifier
from mythic.engine import GenerationRequest, Sampling
from mythic.knowledge import Knowledge, World
from mythic.memory import Memory
from mythic.route import Router

_SAMPLES = 2048


class Outbox(Protocol):
    """Where the NPCs' messages go: the gateway's per-session queue. Must not block."""

    def __call__(self, session_id: str, message: ServerMessage) -> None: ...


class ReplySink(Protocol):
    """Receives replies phrase by phrase, for speech (the server's voice layer). Called on the
    event loop; must not block."""

    def first_token(self, session_id: str, npc_id: str, turn_id: str) -> None:
        """The first token of the reply to `turn_id` is about to go out (its first delta)."""

    def phrase(self, session_id: str, npc_id: str, turn_id: str, text: str) -> None:
        """A phrase (one or two sentences) of the reply to `turn_id` is ready."""

    def reply_done(self, session_id: str, npc_id: str, turn_id: str, reason: str) -> None:
        """The reply to `turn_id` is over: `stop`, `length`, `tool_call`, `cutoff`, `error`."""


@dataclass(slots=True, frozen=True)
class ToolOutcome:
    """How the game answered a tool call."""

    status: Literal["ok", "error", "rejected", "timeout"]
    result: dict[str, Any] | None = None
    message: str | None = None


class CallTool(Protocol):
    """Send a game tool call and wait for its answer: session, NPC, turn, tool name, arguments.
    `needs_approval`: the call asks the game to approve a tool Mythic runs itself (an MCP
    server's write tool); its `Ack` `ok` approves it, anything else refuses it."""

    def __call__(
        self,
        session_id: str,
        npc_id: str,
        turn_id: str,
        name: str,
        args: dict[str, Any],
        *,
        needs_approval: bool = False,
    ) -> Awaitable[ToolOutcome]: ...


class ExternalTool(Protocol):
    """A tool Mythic calls itself (an MCP server's), offered to an NPC's decision."""

    @property
    def name(self) -> str:
        """Its NPC name, `server.tool`."""

    @property
    def description(self) -> str:
        """What it does, for the decision prompt."""

    @property
    def args_schema(self) -> dict[str, Any]:
        """The JSON schema the decision writes its arguments in (the tool's input schema,
        kept to what a grammar constrains); each call is still validated against the
        tool's own."""

    @property
    def write(self) -> bool:
        """Whether it changes the world: a call needs approval first."""


class ExternalOutcome(Protocol):
    """How a call of an external tool ended."""

    @property
    def status(self) -> Literal["ok", "error", "rejected", "timeout"]: ...

    @property
    def result(self) -> dict[str, Any] | None: ...

    @property
    def message(self) -> str | None: ...


class ExternalResult(Protocol):
    """What a read tool told an NPC recently (a fresh cached result)."""

    @property
    def name(self) -> str:
        """The tool, `server.tool`."""

    @property
    def args(self) -> dict[str, Any]: ...

    @property
    def result(self) -> dict[str, Any]: ...


class ExternalTools(Protocol):
    """Tools Mythic calls itself, inside a silver turn (the MCP client, `mythic.mcp`). Every
    method is safe to call on the event loop; none raises for a server's failure."""

    def offered(self, npc_id: str) -> Sequence[ExternalTool]:
        """The tools `npc_id` may call now (allowed, their server connected and its breaker
        closed). Synchronous, no I/O: the gold decision reads it."""

    def writes(self, name: str) -> bool:
        """Whether the tool `name` changes the world (a tool not known: True), whether or not
        its server is connected now. No I/O."""

    def refusal(self, npc_id: str, name: str, args: dict[str, Any]) -> ExternalOutcome | None:
        """The outcome refusing this call before it is made (the NPC may not call the tool,
        or the arguments fail its schema), or None: it may be made. No I/O."""

    def cached(self, npc_id: str, name: str, args: dict[str, Any]) -> ExternalOutcome | None:
        """A read tool's fresh cached result for these arguments, or None. No I/O."""

    def recent(self, npc_id: str, limit: int) -> Sequence[ExternalResult]:
        """What `npc_id`'s read tools told it recently (fresh cached results of tools it may
        call), newest first, at most `limit`. Synchronous, no I/O: the gold decision reads
        it."""

    def call(self, npc_id: str, name: str, args: dict[str, Any]) -> Awaitable[ExternalOutcome]:
        """Validate the arguments and call the tool within its timeout; errors, timeouts and
        an open breaker come back as the outcome's status, never as an exception."""


@dataclass(slots=True)
class DialogueStats:
    """Counters for /metrics; the dialogue layer knows nothing of Prometheus."""

    turns: Counter[str] = field(default_factory=Counter)
    """Finished turns by finish reason."""
    tool_calls: Counter[str] = field(default_factory=Counter)
    """Tool calls by outcome (ok, error, rejected, timeout, invalid, retried); an MCP tool's
    call counts as `mcp_<outcome>`, its approval as `approval_<outcome>`."""
    intents: Counter[str] = field(default_factory=Counter)
    barge_ins: int = 0
    decision_failures: int = 0
    actor_restarts: int = 0
    phrases: int = 0
    warm_ups: int = 0
    """Prefills: reply prompts prepared while the player was still speaking (`PrepareLine`)."""
    capped: int = 0
    """Spoken replies stopped at `dialogue.spoken_max_sentences` sentences."""
    caught: Counter[str] = field(default_factory=Counter)
    """Reply tries caught by the line filter, by kind (assistant, narration, taboo, repeat,
    echo)."""
    safety: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Content-policy violations by where (player, reply, tool) and category (`mythic.safety`):
    each replaced by a deflection or refused."""
    reply_prompt_tokens: int = 0
    """Prompt tokens of replies, ..."""
    reply_cached_tokens: int = 0
    """... of them found in the KV cache (the session's earlier turns, a prefill, a shared
    persona prefix) rather than evaluated when the line came."""
    first_tokens: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    """Seconds from a player line's arrival to its first reply delta."""

    def turn_finished(self, reason: str) -> None:
        self.turns[reason] += 1

    def first_token(self, seconds: float) -> None:
        self.first_tokens.append(seconds)


@dataclass(slots=True)
class Stage:
    """The collaborators of a cast's actors. `world` and `world_words` change when the world
    is reloaded, `replies` when a voice layer attaches: actors read them at each use."""

    world: World
    world_words: frozenset[str]
    """Every word the world's cards and lore say: the line filter lets its NPCs say a
    real-world word the world has ("dollars" in a frontier town)."""
    router: Router
    settings: MythicSettings
    send: Outbox
    call_tool: CallTool
    classifier: Callable[[], LineClassifier | None]
    """The player-line classifier (`Cast.classifier`): blocking, call it in a worker thread."""
    memory: Memory | None = None
    knowledge: Knowledge | None = None
    """Persona, lore and packing; None: the whole persona card, no lore."""
    chains: ChainRouter | None = None
    """Which archetype adapters each request applies; None: the base model serves all."""
    replies: ReplySink | None = None
    """Where each reply's phrases go for speech (set by the server's voice layer)."""
    external: ExternalTools | None = None
    """Tools Mythic calls itself, from MCP servers (set by the server when `mcp.servers` is
    configured); None: game tools only."""
    stats: DialogueStats = field(default_factory=DialogueStats)
    speakers: asyncio.Semaphore = field(init=False)
    """The NPCs that may speak at once (`dialogue.max_concurrent_speakers`)."""
    retrieval: bool = field(init=False)
    """Whether the dialogue tier gets lore retrieval."""

    def __post_init__(self) -> None:
        self.speakers = asyncio.Semaphore(self.settings.dialogue.max_concurrent_speakers)
        self.retrieval = self.router.tier_of("dialogue").retrieval

    def adapters_for(
        self, request: GenerationRequest, kind: str, task: AdapterTask, archetype: str
    ) -> dict[str, float]:
        """The LoRA adapters (name -> scale) of `archetype` for `task` that `request` applies
        on the model that will serve it; `{}`: the base model. Synchronous, no I/O."""
        if self.chains is None:
            return {}
        base = self.router.base_model(request, kind, archetype=archetype)
        return self.chains.adapters_for(archetype, task, base_model=base)

    def decision_sampling(self) -> Sampling:
        """The sampling of a gold decision (intent, tool): greedy, short."""
        return Sampling(max_tokens=self.settings.dialogue.decision_max_tokens, temperature=0.0)

    def first_token(self, session_id: str, npc_id: str, turn_id: str) -> None:
        """A reply's first token is about to go out."""
        if self.replies is not None:
            self.replies.first_token(session_id, npc_id, turn_id)

    def phrase(self, session_id: str, npc_id: str, turn_id: str, text: str) -> None:
        """A phrase of a reply is ready for speech synthesis."""
        self.stats.phrases += 1
        if self.replies is not None:
            self.replies.phrase(session_id, npc_id, turn_id, text)

    def reply_done(self, session_id: str, npc_id: str, turn_id: str, reason: str) -> None:
        """A reply is over (`reason`: its finish reason); its last phrase has gone out."""
        if self.replies is not None:
            self.replies.reply_done(session_id, npc_id, turn_id, reason)
