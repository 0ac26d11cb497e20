"""`engine`: the embedded model runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from mythic.config._paths import default_cache_dir
from mythic.config._section import Section


class EngineSettings(Section):
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
    `n_ctx * max_sequences` cells is reserved at load, and becomes resident as the sequences'
    cells are written."""

    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for generation; default: all cores."""

    n_gpu_layers: int = Field(default=0, ge=-1)
    """Layers to offload to a GPU in CUDA/Metal builds of llama.cpp (-1: all)."""

    seed: int = Field(default=-1, ge=-1)
    """Sampling seed; -1 picks a random one."""

    max_sequences: int = Field(default=16, ge=2, le=256)
    """Sequences held in the KV memory: active NPC sessions plus cached prefixes. A session
    evicted for another is parked in host memory (`park_mb`) and loaded back when its NPC
    speaks again. 16 holds the example world's 8 NPCs, their shared prompt starts and gold's
    reserve (Qwen 0.5B at 2048 tokens: 384 MB reserved, resident as it is filled: 12 KB a
    token); raise it for many NPCs speaking at once."""

    kv_type: Literal["f16", "q8_0"] = "f16"
    """The type of the KV cells: `f16`, or `q8_0` (8-bit blocks: about half the KV bytes per
    NPC, so twice the NPCs' context in the same memory). Measured on 2 CPU cores with Qwen 0.5B
    and 8 NPCs: q8_0 cost about a quarter of the tokens/s of first turns and of follow-ups.
    bench/vs_llama_server.py gives llama-server the same type."""

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

    park_mb: int = Field(default=256, ge=0)
    """Host memory for the KV of evicted sessions (an NPC off screen whose sequence was taken
    for another): parked as it is evicted, loaded back when the NPC speaks again instead of
    its conversation being evaluated again; the least recently parked goes first. About 12 KB
    a token on Qwen 0.5B. 0: off."""

    batch_invariant: bool = False
    """Make each NPC's output independent of which other NPCs share its batch and of how its
    prompt was split (greedy replies are then reproducible whatever the load: tests, replays),
    at a cost in prompt speed: prompts go in chunks of 48 tokens per sequence, without
    llama.cpp's fastest kernels. Off: those kernels, as `llama-server` uses them; a greedy
    reply can then differ at a near-tie between a crowded and a quiet moment."""

    grammar_check_first: bool = True
    """A greedy request with a JSON schema or grammar (the per-line decision, intents): pick
    the most likely token, then ask the grammar whether it may come next, and match the whole
    vocabulary against it only when neither it nor the next most likely tokens may. The
    tokens are the same either way; off, llama.cpp matches all of a 152k vocabulary at every
    token (`bench/decision.py` measures both)."""

    trace_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Model steps the engine's trace keeps: what each step evaluated for which request, and
    when each request arrived, counted in steps (`Engine.trace`; tests read it to check the
    scheduling, in steps rather than seconds). 0: no trace (its cost is a small record per
    step)."""

    gold_preempts: bool = True
    """A gold request (the player's current partner, intents) stops a model step already
    running for other NPCs, runs first, and the stopped step is redone. Gold then never waits
    for a whole step; the redone step costs the others a little time, and at a near-tie a
    redone step can pick another token than it would have."""

    adapters: dict[str, Path] = Field(default_factory=dict)
    """LoRA adapters to load at start, by the name requests use: {vampire: path}. GGUF LoRA
    files for llama.cpp; PEFT adapter directories for the transformers backend."""

    adapter_quantum_steps: int = Field(default=8, ge=0, le=1024)
    """NPCs on different adapter sets (archetypes) take turns: one set's NPCs advance for up
    to this many steps, then the least served set's, or at once a set with a more urgent NPC
    (on screen). llama.cpp applies one set per call and re-plans its compute graph at every
    change; bigger calls and fewer changes gave 5 sets 0.75x of the base model's throughput
    against 0.63x with every set every step. A set's stream pauses while the others take
    their turns. 0: every set every step, one call each. `bench/adapters.py` measures both."""

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
