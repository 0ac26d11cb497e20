"""What a model runtime must do for the shared engine: the `Backend` protocol.

The engine owns scheduling, prefix reuse, stop strings, timing and errors; a backend only
tokenizes, evaluates batches of sequences in its KV memory, samples, and applies adapters. All
methods are called from the engine's one worker thread, except `tokenize`, `check_grammar` and
`make_sampler`, which must be safe to call from any thread while a batch is being evaluated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mythic.engine._chat_format import ChatFormat
from mythic.engine._errors import AdapterError, EngineError
from mythic.engine._scheduler import AdapterKey


@dataclass(slots=True)
class Sampling:
    """How to pick tokens for one request."""

    max_tokens: int = 200
    temperature: float = 0.7
    """0 or less: greedy (always the most likely token)."""
    top_p: float = 0.9
    top_k: int = 40
    repeat_penalty: float = 1.1
    seed: int | None = None
    """None: the engine's configured seed (`engine.seed`), random when that is -1."""
    stop: tuple[str, ...] = field(default_factory=tuple)
    dry_multiplier: float = 0.0
    """DRY ("don't repeat yourself"): how hard a token is pushed down when it would extend a
    stretch of tokens already said (`dry_scope`) or already in the reply (0: off)."""
    dry_base: float = 1.75
    """The DRY penalty is `dry_multiplier * dry_base ** (repeat - dry_allowed_length)`: it
    grows with every further repeated token."""
    dry_allowed_length: int = 2
    """Repeats up to this many tokens long go unpenalised (names, set phrases)."""
    dry_penalty_last_n: int = -1
    """Tokens DRY looks back over, what `dry_scope` adds included (-1: the whole context
    window; 0: off)."""
    dry_scope: Literal["lines", "prompt", "reply"] = "lines"
    """What DRY counts as already said before the reply: `lines`, the NPC's earlier lines (the
    assistant messages); `prompt`, the whole prompt (the persona's and the lore's facts too,
    which the NPC is asked to quote exactly); `reply`, nothing (the reply only)."""
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    """Text that ends a repeat: a match never reaches back across one (llama.cpp's default)."""
    ignore_eos: bool = False
    """Generate `max_tokens` whatever the model says: an end-of-generation token is kept as
    any other (llama-server's `ignore_eos`). For benchmarks, where both sides must generate
    the same number of tokens; stop strings still end the reply."""


@dataclass(slots=True)
class SequenceChunk:
    """Tokens to evaluate for one sequence in one decode call."""

    seq_id: int
    tokens: Sequence[int]
    pos: int
    """Position of the first token in the sequence."""
    logits: bool
    """Whether the last token's logits are wanted (a token is sampled after it)."""
    adapters: AdapterKey = ()
    """The sequence's adapter set, for backends that mix adapters in one call
    (`Backend.mixed_adapters`); others apply `set_adapters` to the whole call."""


class BackendError(EngineError):
    """The backend failed to evaluate a batch; the engine fails the step's requests and resets."""


class KVCacheFullError(BackendError):
    """The backend found no room in its KV memory for the batch."""


class DecodeInterrupted(Exception):  # noqa: N818 - a signal, not a failure
    """`interrupt()` stopped an interruptible decode; the memory is as it was before the call."""


class Backend(ABC):
    """A model runtime evaluating many sequences in one shared KV memory."""

    name: str
    chat_format: ChatFormat | None
    n_ctx: int
    """KV cells in the memory, all sequences together."""
    n_ctx_seq: int
    """Positions one sequence can hold (its context window)."""
    n_seq_max: int
    """Sequences the memory can hold at once."""
    n_batch: int
    """Tokens one `decode` call can take."""
    max_seq_chunk: int | None = None
    """Most tokens of one sequence per decode call for exact, batch-invariant results
    (None: any)."""
    mixed_adapters: bool = False
    """True: one decode call may mix adapter sets, one per chunk (`SequenceChunk.adapters`),
    as PEFT's mixed-batch inference does; the engine then batches across adapters."""
    adapter_format: str = "gguf"
    """What `load_adapter` takes: `gguf` (a GGUF LoRA file) or `peft` (a PEFT folder)."""

    @abstractmethod
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Text to token ids; `parse_special` reads control tokens written as text."""

    @abstractmethod
    def piece(self, token: int) -> bytes:
        """The bytes a token stands for in generated text (control tokens: empty)."""

    @abstractmethod
    def is_end_of_generation(self, token: int) -> bool:
        """Whether the token ends a reply (end of turn, end of text)."""

    @abstractmethod
    def json_schema_grammar(self, schema: str) -> str:
        """A GBNF grammar accepting exactly the JSON documents valid under a JSON schema.

        Raises:
            GrammarError: the schema is not valid JSON or uses what the converter cannot do.
        """

    @abstractmethod
    def check_grammar(self, gbnf: str) -> None:
        """Raise `GrammarError` when a GBNF grammar does not parse."""

    @abstractmethod
    def make_sampler(
        self, sampling: Sampling, seed: int, grammar: str | None, *, said: Sequence[int] = ()
    ) -> object:
        """A sampler chain for one request (penalties, grammar, top-k/p, temperature, seed).

        `said`: tokens that count as already said before the reply; DRY penalises repeating
        them as it does repeats within the reply."""

    @abstractmethod
    def free_sampler(self, sampler: object) -> None:
        """Release a sampler from `make_sampler`."""

    @abstractmethod
    def decode(self, chunks: Sequence[SequenceChunk], *, interruptible: bool = False) -> list[int]:
        """Evaluate the chunks in one call; returns, per chunk, the output index to sample from
        (-1 for chunks without logits).

        Raises:
            KVCacheFullError: no room for the batch; nothing was evaluated.
            DecodeInterrupted: `interruptible` and `interrupt()` was called; nothing was kept.
            BackendError: the evaluation failed.
        """

    def interrupt(self) -> None:  # noqa: B027 - optional: a no-op by default
        """Ask a running (or the next) interruptible `decode` to stop soon. Any thread; cheap.

        Backends that cannot stop a decode part-way ignore it (the default)."""

    def clear_interrupt(self) -> None:  # noqa: B027
        """Withdraw an `interrupt()` that no decode has consumed yet."""

    @abstractmethod
    def sample(self, sampler: object, output_index: int) -> int:
        """Sample (and accept) the next token from one output of the last `decode`."""

    @abstractmethod
    def seq_remove(self, seq_id: int, start: int = 0) -> None:
        """Forget a sequence's cells from position `start` on."""

    @abstractmethod
    def seq_copy(self, src: int, dst: int, length: int) -> None:
        """Make `dst` share `src`'s first `length` positions (no recomputation)."""

    def seq_cut(self, seq_id: int, start: int, end: int) -> bool:
        """Forget a sequence's positions `start..end-1` and move the later ones down to
        `start` (their keys rotated to the new positions, nothing recomputed). True when
        done; False (nothing changed) where the backend or the model cannot shift positions,
        the default."""
        return False

    def seq_save(self, seq_id: int) -> bytes | None:
        """A sequence's cells as bytes (its KV, for `seq_restore` into any free sequence);
        None where the backend cannot, the default."""
        return None

    def seq_restore(self, seq_id: int, data: bytes) -> bool:
        """Load a free sequence with the cells `seq_save` gave; False (nothing held) where
        the backend cannot or the data does not fit, the default."""
        return False

    @abstractmethod
    def clear(self) -> None:
        """Forget every sequence (after a failure)."""

    @property
    @abstractmethod
    def adapters(self) -> frozenset[str]:
        """Names of the loaded LoRA adapters."""

    @abstractmethod
    def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter once, under a name requests use.

        Raises:
            AdapterError: the file is missing or is not an adapter for this model.
        """

    def unload_adapter(self, name: str) -> None:
        """Free a loaded adapter. The engine calls it only when no sequence uses it; if it is
        in the current set (`set_adapters`), the backend clears that set first.

        Raises:
            AdapterError: no adapter of that name is loaded, or this backend cannot free one
                (the default).
        """
        raise AdapterError(f"the {type(self).__name__} backend cannot unload adapters ({name!r})")

    @abstractmethod
    def set_adapters(self, key: AdapterKey) -> bool:
        """Apply an adapter set to the following decode calls; True if it changed."""

    @abstractmethod
    def close(self) -> None:
        """Free the model and its memory."""
