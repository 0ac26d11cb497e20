"""The embedded llama.cpp backend, on llama-cpp-python's low-level API.

One context with a KV stream per sequence holds a sequence per active NPC session; one
`llama_decode` evaluates every scheduled sequence of an adapter group; each request has its own
sampler chain (with its own grammar). The high-level `Llama` class serves one request at a time
and its prefix reuse ignores adapters, so it is not used here.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import itertools
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mythic._extras import require
from mythic.config import EngineSettings
from mythic.engine._backend import (
    Backend,
    BackendError,
    DecodeInterrupted,
    KVCacheFullError,
    Sampling,
    SequenceChunk,
)
from mythic.engine._errors import AdapterError, GrammarError, ModelLoadError
from mythic.engine._pages import anonymous_regions, release_zeroed
from mythic.engine._scheduler import AdapterKey
from mythic.engine.models import ModelStore, ResolvedModel

logger = logging.getLogger(__name__)

_init_lock = threading.Lock()
_initialised = False

INVARIANT_MAX_SEQ_CHUNK = 48
"""Rows of one sequence per decode call in batch-invariant mode (must stay below 64)."""

PENALTY_LAST_N = 64
"""Tokens the repeat penalty looks back over (llama.cpp's default)."""

GRAMMAR_TRIES = (64, 4096)
"""A greedy pick the grammar refuses: how many of the most likely tokens to ask it about next,
then more, before it matches the whole vocabulary."""

IMPORT_BEFORE_CUDA = ("onnxruntime",)
"""Native libraries imported before a CUDA build of llama.cpp, when installed. Imported after
it, onnxruntime 1.30 segfaulted in its own import (an H200, CUDA 13: the server died at the
first audio, when the Silero VAD loads); imported before, the same process ran the VAD and the
voice bench (bench/gpu/README.md). llama-cpp-python loads its libraries with RTLD_GLOBAL."""

DRY_PROTOTYPES = 8
"""DRY samplers kept built, one per distinct setting, to be cloned per request: building one
detokenizes the whole vocabulary once per sequence breaker."""
GAP_ROWS_PER_PASS = 2
"""A decode step's missing sequences get stand-in rows (`_gap_pads`) while there are at most
this many per pass they save: on 2 CPU cores a pass of SmolLM2 or Qwen 0.5B costs two to three
rows."""

_TOKEN_DATA = [("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]
"""llama.cpp's `llama_token_data`, as a NumPy record."""


class _CheckedSampler:
    """A greedy request with a grammar, sampled the cheap way round (see `_sample_checked`):
    `chain` holds the penalties and the greedy pick, `grammar` the grammar alone; each token
    is accepted by both."""

    __slots__ = ("chain", "grammar")

    def __init__(self, chain: Any, grammar: Any) -> None:
        self.chain = chain
        self.grammar = grammar


def _cuda_build() -> bool:
    """Whether the installed llama-cpp-python holds llama.cpp's CUDA backend (found without
    importing it: the import loads the libraries), in its `lib/` or in `LLAMA_CPP_LIB_PATH`."""
    spec = importlib.util.find_spec("llama_cpp")
    folders = [Path(f, "lib") for f in (spec.submodule_search_locations or ())] if spec else []
    if lib_path := os.environ.get("LLAMA_CPP_LIB_PATH"):
        folders.append(Path(lib_path))
    return any(next(folder.glob("*ggml-cuda*"), None) for folder in folders)


def _import_before_llama_cpp() -> None:
    if "llama_cpp" in sys.modules or not _cuda_build():
        return
    for name in IMPORT_BEFORE_CUDA:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - optional: its own use reports it, as before
            logger.warning("could not import %s before llama.cpp's CUDA build: %s", name, exc)


def _llama_cpp() -> Any:
    global _initialised
    with _init_lock:
        _import_before_llama_cpp()
    lib = require("llama_cpp", package="llama-cpp-python", extra="llm")
    with _init_lock:
        if not _initialised:
            # llama.cpp logs every load to stderr; keep errors only, through Python logging.
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            lib.llama_backend_init()
            _initialised = True
    return lib


_KV_TYPES = {"f16": "GGML_TYPE_F16", "q8_0": "GGML_TYPE_Q8_0"}
"""The KV cell types `LlamaCppBackend(kv_type=...)` takes, by llama.cpp's names."""


class LlamaCppBackend(Backend):
    """A GGUF model in one llama.cpp context shared by many sequences."""

    def __init__(
        self,
        resolved: ResolvedModel,
        *,
        n_ctx: int = 4096,
        n_seq_max: int = 64,
        n_batch: int = 512,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        batch_invariant: bool = False,
        grammar_check_first: bool = True,
        kv_unified: bool = False,
        kv_type: str = "f16",
    ) -> None:
        """Load a resolved model file.

        `n_ctx` is the context of one sequence; KV memory for `n_ctx * n_seq_max` cells is
        reserved, a stream of `n_ctx` cells per sequence (as `llama-server --parallel` has
        a slot per stream): attention over a sequence reads its own cells only, and sequences
        of consecutive ids are evaluated in one pass (`decode`). With `kv_unified` the
        sequences share one memory instead: prefix copies share cells rather than copying
        them, but every decode attends over the cells of all sequences (measured slower with
        eight NPCs, bench/vs_llama_server.py).

        With `batch_invariant` the kernels are chosen so that a sequence's logits do not
        depend on what else shares its batch nor on how its prompt was split: greedy replies
        are reproducible whatever the load (measured, and tested on SmolLM2; on Qwen 0.5B
        some kernels still differ between one row and many). It costs prompt speed: no
        repacked weights, and at most `INVARIANT_MAX_SEQ_CHUNK` prompt tokens of a sequence
        per call. Without
        it llama.cpp picks its fastest kernels; outputs can then differ at near-ties.

        Raises:
            MissingExtraError: llama-cpp-python is not installed (the `llm` extra).
            ModelLoadError: llama.cpp could not load the file or create its context.
        """
        lib = _llama_cpp()
        self._lib = lib
        self.resolved = resolved
        self.name = resolved.name
        self.chat_format = resolved.chat_format
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        if batch_invariant:
            # Repacked weights use one kernel for a single row and another for many, so a
            # reply would depend on how many other NPCs shared its batch.
            mparams.use_extra_bufts = False
        self._model = lib.llama_model_load_from_file(str(resolved.path).encode(), mparams)
        if not self._model:
            raise ModelLoadError(
                f"llama.cpp could not load {resolved.path}",
                fix="check that the file is a complete GGUF model of an architecture this "
                "llama-cpp-python supports",
            )
        threads = n_threads or os.cpu_count() or 1
        if resolved.context_length:
            n_ctx = min(n_ctx, resolved.context_length)
        self.unified = kv_unified
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx * n_seq_max
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        # Own streams keep each sequence's cells in order from cell 0, the same layout as when
        # it runs alone; attention then sums the same numbers in the same order, over its own
        # cells only.
        cparams.kv_unified = self.unified
        cparams.no_perf = True
        if kv_type not in _KV_TYPES:
            raise ValueError(f"kv_type {kv_type!r}: one of {', '.join(_KV_TYPES)}")
        cparams.type_k = cparams.type_v = getattr(lib, _KV_TYPES[kv_type])
        if batch_invariant:
            # Flash attention skips masked cells, so other sequences' cells change nothing;
            # the unfused path sums over them in SIMD lanes that shift with the layout.
            cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self._kv_on_host = n_gpu_layers == 0
        regions = anonymous_regions() if self._kv_on_host else []
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise ModelLoadError(
                f"llama.cpp could not create a context of {n_ctx} cells for {n_seq_max} "
                f"sequences on {resolved.path}",
                fix="lower engine.n_ctx or engine.max_sequences",
            )
        # The KV buffer llama.cpp has just zeroed: resident as sequences fill it, not all now.
        self.kv_bytes_per_token = self._kv_bytes_per_token(kv_type)
        """K and V bytes of one token's cell (every layer)."""
        kv_bytes = self.kv_bytes_per_token * int(lib.llama_n_ctx(self._ctx))
        self.released_bytes = release_zeroed(regions, kv_bytes)
        """Bytes of zeroed KV memory handed back at load (`mythic.engine._pages`); 0 where
        no run of zero pages was the KV buffer's size (then it is all resident)."""
        if regions and not self.released_bytes:
            logger.info("no KV buffer of %d bytes to hand back for %s", kv_bytes, self.name)
        self._vocab = lib.llama_model_get_vocab(self._model)
        self._memory = lib.llama_get_memory(self._ctx)
        self.n_ctx = int(lib.llama_n_ctx(self._ctx))
        # Unified memory lets one sequence grow past its share; the context window promised
        # to each NPC stays `n_ctx` either way.
        self.n_ctx_seq = min(n_ctx, int(lib.llama_n_ctx_seq(self._ctx)))
        self.n_seq_max = int(lib.llama_n_seq_max(self._ctx))
        self.n_batch = int(lib.llama_n_batch(self._ctx))
        # Measured: 64 or more rows of one sequence in one call take another attention path
        # whose sums differ from the one-row path; below that, any split of a prompt gives
        # bit-identical logits (so prefix copies and chunking change nothing).
        self.max_seq_chunk = INVARIANT_MAX_SEQ_CHUNK if batch_invariant else None
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        # The candidates of a checked grammar sample (`sample`), filled from the logits.
        self._candidates = (lib.llama_token_data * self.n_vocab)()
        self._candidate_rows = _records(self._candidates, self.n_vocab)
        self._candidate_rows["id"] = range(self.n_vocab)
        self._few = (lib.llama_token_data * max(GRAMMAR_TRIES))()
        self._few_rows = _records(self._few, max(GRAMMAR_TRIES))
        self.grammar_check_first = grammar_check_first
        """Greedy requests with a grammar: pick first, then ask the grammar about the pick
        (`_sample_checked`). False: the grammar matches the whole vocabulary at every token,
        as llama.cpp's own chain does. Read when a request's sampler is made."""
        self.grammar_tries = GRAMMAR_TRIES
        self.grammar_picks = {"checked": 0, "refused": 0, "whole": 0}
        self.gap_pads = 0
        """Stand-in rows evaluated for sequences missing between a step's ids (`_gap_pads`)."""
        """Tokens picked with the grammar checked first; of those, unconstrained picks the
        grammar refused; and tokens for which it then matched the whole vocabulary."""
        self._pieces: dict[int, bytes] = {}
        self._dry_prototypes: OrderedDict[tuple[object, ...], Any] = OrderedDict()
        self._dry_lock = threading.Lock()
        self._adapters: dict[str, Any] = {}
        self._adapter_key: AdapterKey = ()
        self._closed = False
        # Preemption: llama.cpp polls an abort callback between graph nodes. The poll must not
        # take the GIL (hundreds per decode, while the event loop holds it), so it is C's own
        # strlen over a two-byte flag: b"\0" reads 0 (go on), b"\1" reads 1 (stop).
        self._flag = ctypes.create_string_buffer(2)
        self._never = ctypes.create_string_buffer(2)
        self._poll = _native_flag_poll(lib)
        self._armed = False

    # -- vocabulary (any thread) ---------------------------------------------------------------

    def _kv_bytes_per_token(self, kv_type: str) -> int:
        """K and V bytes of one cell in every layer (from the model's shape, K and V heads of
        one size)."""
        lib = self._lib
        heads = max(1, int(lib.llama_model_n_head(self._model)))
        head_dim = int(lib.llama_model_n_embd(self._model)) // heads
        key = self._meta_int("attention.key_length") or head_dim
        value = self._meta_int("attention.value_length") or head_dim
        per_value = 2.0 if kv_type == "f16" else 34 / 32  # q8_0: 32 values in 34 bytes
        row = int(lib.llama_model_n_head_kv(self._model)) * (key + value)
        return int(int(lib.llama_model_n_layer(self._model)) * row * per_value)

    def _meta_int(self, key: str) -> int | None:
        """An integer of the model's GGUF metadata under its architecture (`{arch}.{key}`)."""
        buf = ctypes.create_string_buffer(256)
        lib = self._lib
        if lib.llama_model_meta_val_str(self._model, b"general.architecture", buf, 256) < 0:
            return None
        name = f"{buf.value.decode()}.{key}".encode()
        if lib.llama_model_meta_val_str(self._model, name, buf, 256) < 0:
            return None
        try:
            return int(buf.value.decode())
        except ValueError:
            return None

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (self._lib.llama_token * capacity)()
        n = self._lib.llama_tokenize(
            self._vocab, data, len(data), buf, capacity, add_special, parse_special
        )
        if n < 0:
            capacity = -n
            buf = (self._lib.llama_token * capacity)()
            n = self._lib.llama_tokenize(
                self._vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    def json_schema_grammar(self, schema: str) -> str:
        grammar_module = require("llama_cpp.llama_grammar", package="llama-cpp-python", extra="llm")
        try:
            gbnf = str(grammar_module.json_schema_to_gbnf(schema))
        except (
            AssertionError,  # the converter asserts on unresolvable $refs
            AttributeError,
            LookupError,
            RecursionError,
            TypeError,
            ValueError,
        ) as exc:
            raise GrammarError(
                f"the JSON schema cannot be turned into a grammar: {exc!r}",
                fix="pass a valid JSON schema object (types, properties, enum, required...)",
            ) from exc
        # This converter lets raw control characters into strings, which JSON forbids: a
        # newline inside "say" would make the reply unparseable. Allow only escaped ones.
        return gbnf.replace('char ::= [^"\\\\] |', 'char ::= [^"\\\\\\x00-\\x1F\\x7F] |')

    def check_grammar(self, gbnf: str) -> None:
        sampler = self._grammar_sampler(gbnf)
        self._lib.llama_sampler_free(sampler)

    def _grammar_sampler(self, gbnf: str) -> Any:
        sampler = self._lib.llama_sampler_init_grammar(self._vocab, gbnf.encode(), b"root")
        if not sampler:
            raise GrammarError(
                "the grammar does not parse (llama.cpp's GBNF parser refused it)",
                fix="check the GBNF syntax and that it defines a `root` rule",
            )
        return sampler

    def make_sampler(
        self, sampling: Sampling, seed: int, grammar: str | None, *, said: Sequence[int] = ()
    ) -> object:
        lib = self._lib
        checked = grammar is not None and sampling.temperature <= 0 and self.grammar_check_first
        grammar_sampler = self._grammar_sampler(grammar) if grammar is not None else None
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        # The grammar goes first so that later samplers only ever see tokens it allows.
        if grammar_sampler is not None and not checked:
            lib.llama_sampler_chain_add(chain, grammar_sampler)
        if sampling.repeat_penalty != 1.0:
            lib.llama_sampler_chain_add(
                chain,
                lib.llama_sampler_init_penalties(
                    self.n_vocab, PENALTY_LAST_N, sampling.repeat_penalty, 0.0, 0.0
                ),
            )
        if sampling.dry_multiplier > 0 and sampling.dry_penalty_last_n != 0:
            # After the penalties, before top-k: the order of llama.cpp's own default chain.
            lib.llama_sampler_chain_add(chain, self._dry_sampler(sampling, said))
        if sampling.temperature <= 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(sampling.top_k))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(sampling.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(sampling.temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
        return _CheckedSampler(chain, grammar_sampler) if checked else chain

    def _dry_sampler(self, sampling: Sampling, said: Sequence[int]) -> Any:
        """A DRY sampler that has accepted what was said before the reply (`said`'s end).

        llama.cpp's penalty samplers only see the tokens accepted into them; fed the reply
        alone, DRY would let an NPC say again, word for word, a line of its own from earlier
        in the conversation. Only DRY is fed them: the repeat penalty keeps to the reply.
        """
        lib = self._lib
        last_n = sampling.dry_penalty_last_n
        # No repeat reaches back past a context window; llama.cpp allocates `last_n` up front.
        last_n = self.n_ctx_seq if last_n < 0 else min(last_n, self.n_ctx_seq)
        key = (
            sampling.dry_multiplier,
            sampling.dry_base,
            sampling.dry_allowed_length,
            last_n,
            sampling.dry_sequence_breakers,
        )
        with self._dry_lock:
            prototype = self._dry_prototypes.get(key)
            if prototype is None:
                breakers = [b.encode() for b in sampling.dry_sequence_breakers]
                texts = (ctypes.c_char_p * max(len(breakers), 1))(*breakers)
                prototype = lib.llama_sampler_init_dry(
                    self._vocab,
                    sampling.dry_multiplier,
                    sampling.dry_base,
                    sampling.dry_allowed_length,
                    last_n,
                    texts,
                    len(breakers),
                )
                self._dry_prototypes[key] = prototype
                if len(self._dry_prototypes) > DRY_PROTOTYPES:
                    lib.llama_sampler_free(self._dry_prototypes.popitem(last=False)[1])
            self._dry_prototypes.move_to_end(key)
            dry = lib.llama_sampler_clone(prototype)
        for token in said[-last_n:]:
            lib.llama_sampler_accept(dry, token)
        return dry

    def free_sampler(self, sampler: object) -> None:
        if isinstance(sampler, _CheckedSampler):
            self._lib.llama_sampler_free(sampler.grammar)
            sampler = sampler.chain
        self._lib.llama_sampler_free(sampler)

    # -- evaluation (the engine's worker thread) -----------------------------------------------

    def interrupt(self) -> None:
        self._flag[0] = b"\x01"

    def clear_interrupt(self) -> None:
        self._flag[0] = b"\x00"

    def _arm(self, interruptible: bool) -> None:
        armed = interruptible and self._poll is not None
        if armed != self._armed:
            data = self._flag if armed else self._never
            self._lib.llama_set_abort_callback(self._ctx, self._poll, ctypes.addressof(data))
            self._armed = armed

    def decode(self, chunks: Sequence[SequenceChunk], *, interruptible: bool = False) -> list[int]:
        total = sum(len(chunk.tokens) for chunk in chunks)
        if not 0 < total <= self.n_batch:
            raise BackendError(f"a batch of {total} tokens; n_batch is {self.n_batch}")
        batch = self._batch
        n = 0
        outputs = [-1] * len(chunks)
        # With a KV stream per sequence llama.cpp evaluates in one pass (a micro-batch) only
        # sequences whose ids follow one another in the batch, each with as many tokens:
        # in the scheduler's order, eight decoding NPCs could take eight passes over the
        # weights. In id order, the NPCs of consecutive ids share one.
        order = (
            range(len(chunks))
            if self.unified
            else sorted(range(len(chunks)), key=lambda i: chunks[i].seq_id)
        )
        pads = [] if self.unified else self._gap_pads(chunks, total)
        entries = (
            sorted(
                [(chunks[i].seq_id, i) for i in order]
                + [(seq, -1 - k) for k, (seq, _) in enumerate(pads)]
            )
            if pads
            else [(chunks[i].seq_id, i) for i in order]
        )
        for seq_id, index in entries:
            if index < 0:
                # A gap's stand-in: one token after the sequence's end, no logits, its cell
                # removed after the call.
                batch.token[n] = 0
                batch.pos[n] = pads[-1 - index][1]
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq_id
                batch.logits[n] = 0
                n += 1
                continue
            chunk = chunks[index]
            for i, token in enumerate(chunk.tokens):
                batch.token[n] = token
                batch.pos[n] = chunk.pos + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = chunk.seq_id
                batch.logits[n] = 0
                n += 1
            if chunk.logits:
                batch.logits[n - 1] = 1
                outputs[index] = n - 1
        batch.n_tokens = n
        self._arm(interruptible)
        try:
            rc = self._lib.llama_decode(self._ctx, batch)
        finally:
            for seq_id, pos in pads:
                self._lib.llama_memory_seq_rm(self._memory, seq_id, pos, -1)
        self.gap_pads += len(pads)
        if rc == 2 and self._armed:
            # llama.cpp drops the last micro-batch's cells only; drop the earlier ones too.
            for chunk in chunks:
                self._lib.llama_memory_seq_rm(self._memory, chunk.seq_id, chunk.pos, -1)
            raise DecodeInterrupted
        if rc == 1:
            raise KVCacheFullError(f"no room in the KV memory for {n} tokens")
        if rc != 0:
            raise BackendError(f"llama_decode failed with code {rc} on a batch of {n} tokens")
        return outputs

    def _gap_pads(self, chunks: Sequence[SequenceChunk], total: int) -> list[tuple[int, int]]:
        """Stand-ins for the sequences missing between the ids of a decode step (one token
        each), when that is cheaper than the passes the gaps cost: (sequence, position).

        With a KV stream per sequence llama.cpp puts only sequences of consecutive ids, each
        with as many tokens, in one pass over the weights: NPCs 0, 2, 4 and 6 decoding (an
        archetype's NPCs, or those still talking) take four passes. A token for each of 1,
        3 and 5, evaluated and dropped, makes it one pass of seven rows: on a CPU a pass
        costs as much as two to three rows more (SmolLM2: 18 ms for one pass of 4 rows,
        37 ms for four of one). Decode steps only (one token each); a sequence whose
        stream is full cannot stand in.
        """
        if len(chunks) < 2 or any(len(chunk.tokens) != 1 for chunk in chunks):
            return []
        ids = sorted(chunk.seq_id for chunk in chunks)
        present = set(ids)
        missing = [s for s in range(ids[0], ids[-1] + 1) if s not in present]
        runs = 1 + sum(b != a + 1 for a, b in itertools.pairwise(ids))
        if not missing or len(missing) > GAP_ROWS_PER_PASS * (runs - 1):
            return []
        if total + len(missing) > self.n_batch:
            return []
        pads = []
        for seq_id in missing:
            pos = self.seq_length(seq_id)
            if pos >= self.n_ctx_seq:
                return []
            pads.append((seq_id, pos))
        return pads

    def sample(self, sampler: object, output_index: int) -> int:
        if isinstance(sampler, _CheckedSampler):
            return self._sample_checked(sampler, output_index)
        return int(self._lib.llama_sampler_sample(sampler, self._ctx, output_index))

    def _sample_checked(self, sampler: _CheckedSampler, output_index: int) -> int:
        """Greedy under a grammar without matching the whole vocabulary at every token.

        llama.cpp's grammar sampler matches every candidate against the grammar: over Qwen's
        152k tokens that took 11 ms a token on this machine's cores, most of a decode step,
        in the one worker thread every batched reply waits on. The grammar only removes
        tokens, so the constrained greedy pick is the most likely token (penalties applied,
        the lowest id on a tie) that the grammar keeps: ask it about the unconstrained pick
        alone, then about the next most likely tokens (`GRAMMAR_TRIES`), and match the whole
        vocabulary only when none of those is allowed. The tokens are the grammar-first
        chain's.
        """
        lib = self._lib
        counts = self.grammar_picks
        picked = self._apply_to_logits(sampler.chain, None, output_index)
        counts["checked"] += 1
        if self._grammar_keeps(sampler.grammar, [picked]) is None:
            counts["refused"] += 1
            allowed = self._most_likely_allowed(sampler.grammar)
            if allowed is None:
                counts["whole"] += 1
                allowed = self._apply_to_logits(sampler.chain, sampler.grammar, output_index)
            picked = allowed
        lib.llama_sampler_accept(sampler.grammar, picked)
        lib.llama_sampler_accept(sampler.chain, picked)
        return picked

    def _most_likely_allowed(self, grammar: Any) -> int | None:
        """The most likely token (the lowest id on a tie) among the `grammar_tries` most
        likely that the grammar allows next, from the candidates' logits (the chain's
        penalties are in them; greedy changed nothing). None: none of them is."""
        np = require("numpy", package="numpy", extra="llm")
        logits = self._candidate_rows["logit"]
        n = self.n_vocab
        for k in self.grammar_tries:
            if k >= n:
                return None  # as many as the vocabulary: match it whole
            # Every token at least as likely as the k-th: a tie at the edge comes in whole,
            # so the first allowed in (logit, id) order is the one greedy would pick.
            edge = np.partition(logits, n - k)[n - k]
            top = np.flatnonzero(logits >= edge)
            if len(top) > len(self._few_rows):
                return None
            top = top[np.lexsort((top, -logits[top]))]
            kept = self._grammar_keeps(grammar, top)
            if kept is not None:
                return int(top[kept])
        return None

    def _grammar_keeps(self, grammar: Any, tokens: Sequence[int]) -> int | None:
        """The index of the first of `tokens` the grammar allows next (None: none is)."""
        n = len(tokens)
        rows = self._few_rows[:n]
        rows["id"] = tokens
        rows["logit"] = 0.0
        few = self._lib.llama_token_data_array(self._few, n, -1, False)
        self._lib.llama_sampler_apply(grammar, ctypes.byref(few))
        for i, logit in enumerate(rows["logit"].tolist()):
            if logit != float("-inf"):
                return i
        return None

    def _apply_to_logits(self, chain: Any, grammar: Any, output_index: int) -> int:
        """The token `chain` picks from one output's logits (`grammar` filtering them first)."""
        lib = self._lib
        logits = lib.llama_get_logits_ith(self._ctx, output_index)
        if not logits:
            raise BackendError(f"no logits for output {output_index} of the last decode")
        rows = self._candidate_rows
        rows["logit"] = _floats(logits, self.n_vocab)
        rows["p"] = 0.0
        candidates = lib.llama_token_data_array(self._candidates, self.n_vocab, -1, False)
        if grammar is not None:
            lib.llama_sampler_apply(grammar, ctypes.byref(candidates))
        lib.llama_sampler_apply(chain, ctypes.byref(candidates))
        if not 0 <= candidates.selected < candidates.size:
            raise BackendError(f"the sampler picked no token ({candidates.selected})")
        return int(candidates.data[candidates.selected].id)

    def seq_remove(self, seq_id: int, start: int = 0) -> None:
        self._lib.llama_memory_seq_rm(self._memory, seq_id, start, -1)

    def seq_copy(self, src: int, dst: int, length: int) -> None:
        if self.unified:
            self._lib.llama_memory_seq_cp(self._memory, src, dst, 0, length)
            return
        # Between streams llama.cpp's own copy (`seq_cp`) copies the whole stream, all
        # `n_ctx` cells, written or not: every copy of a persona prefix made a whole stream
        # resident (24 MB on Qwen 0.5B at 2048 tokens, for ~700 cells used). The source's
        # cells alone go through its state instead, into one block of the destination's
        # stream, in order (as a sequence evaluated there), and the tail beyond `length` is
        # dropped.
        # (With layers on a GPU the cells live in its memory: its own copy stays there.)
        lib = self._lib
        n, buf = 0, None
        if self._kv_on_host:
            size = int(lib.llama_state_seq_get_size(self._ctx, src))
            buf = (ctypes.c_uint8 * size)() if size > 0 else None
            if buf is not None:
                n = int(lib.llama_state_seq_get_data(self._ctx, buf, size, src))
        if n <= 0 or lib.llama_state_seq_set_data(self._ctx, buf, n, dst) <= 0:
            lib.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        lib.llama_memory_seq_rm(self._memory, dst, length, -1)

    def seq_cut(self, seq_id: int, start: int, end: int) -> bool:
        if not 0 <= start < end or not self._lib.llama_memory_can_shift(self._memory):
            return False
        # Cells shared with other sequences (a copied persona prefix) lie before `start`: a
        # shift moves a shared cell for every sequence holding it.
        if not self._lib.llama_memory_seq_rm(self._memory, seq_id, start, end):
            return False  # a memory that cannot drop a stretch (recurrent): nothing changed
        self._lib.llama_memory_seq_add(self._memory, seq_id, end, -1, start - end)
        return True

    def seq_save(self, seq_id: int) -> bytes | None:
        lib = self._lib
        size = int(lib.llama_state_seq_get_size(self._ctx, seq_id))
        if size <= 0:
            return None
        buf = (ctypes.c_uint8 * size)()
        n = int(lib.llama_state_seq_get_data(self._ctx, buf, size, seq_id))
        return ctypes.string_at(buf, n) if n > 0 else None

    def seq_restore(self, seq_id: int, data: bytes) -> bool:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if self._lib.llama_state_seq_set_data(self._ctx, buf, len(data), seq_id) > 0:
            return True
        self._lib.llama_memory_seq_rm(self._memory, seq_id, 0, -1)  # nothing half-loaded
        return False

    def seq_length(self, seq_id: int) -> int:
        """Positions held for a sequence (0 when it holds none)."""
        return int(self._lib.llama_memory_seq_pos_max(self._memory, seq_id)) + 1

    def clear(self) -> None:
        self._lib.llama_memory_clear(self._memory, True)

    # -- adapters ------------------------------------------------------------------------------

    @property
    def adapters(self) -> frozenset[str]:
        return frozenset(self._adapters)

    def load_adapter(self, name: str, path: str) -> None:
        if name in self._adapters:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        if not os.path.isfile(path):
            raise AdapterError(f"LoRA adapter {name!r}: no file at {path}")
        adapter = self._lib.llama_adapter_lora_init(self._model, path.encode())
        if not adapter:
            raise AdapterError(
                f"LoRA adapter {name!r} at {path} could not be loaded",
                fix="use a GGUF LoRA adapter made for this base model "
                "(llama.cpp's convert_lora_to_gguf.py converts a PEFT adapter)",
            )
        self._adapters[name] = adapter

    def unload_adapter(self, name: str) -> None:
        adapter = self._adapters.get(name)
        if adapter is None:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        if any(n == name for n, _ in self._adapter_key):
            # The context keeps pointers to its adapters: it must let go before the free.
            self.set_adapters(())
        del self._adapters[name]
        self._lib.llama_adapter_lora_free(adapter)

    def set_adapters(self, key: AdapterKey) -> bool:
        if key == self._adapter_key:
            return False
        lib = self._lib
        n = len(key)
        handles = (lib.llama_adapter_lora_p_ctypes * max(n, 1))()
        scales = (ctypes.c_float * max(n, 1))()
        for i, (name, scale) in enumerate(key):
            handles[i] = self._adapters[name]
            scales[i] = scale
        rc = lib.llama_set_adapters_lora(self._ctx, handles if n else None, n, scales)
        if rc != 0:
            raise BackendError(f"llama.cpp refused the adapter set {key} (code {rc})")
        self._adapter_key = key
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        lib = self._lib
        lib.llama_batch_free(self._batch)
        with self._dry_lock:
            for prototype in self._dry_prototypes.values():
                lib.llama_sampler_free(prototype)
            self._dry_prototypes.clear()
        lib.llama_free(self._ctx)
        for adapter in self._adapters.values():
            lib.llama_adapter_lora_free(adapter)
        lib.llama_model_free(self._model)


def load_backend(
    model: str, settings: EngineSettings, *, n_seq_max: int | None = None
) -> LlamaCppBackend:
    """Resolve `model` (a packaged name or a GGUF path), check it, and load it for the engine.

    Raises:
        ModelError: unknown, not installed, corrupt, not a GGUF, or refused by llama.cpp;
            the message names the command that fixes it.
        MissingExtraError: llama-cpp-python is not installed.
    """
    resolved = ModelStore(settings.models_dir).resolve(model, chat_format=settings.chat_format)
    return LlamaCppBackend(
        resolved,
        n_ctx=settings.n_ctx,
        n_seq_max=n_seq_max or settings.max_sequences,
        n_batch=settings.n_batch,
        n_threads=settings.n_threads,
        n_gpu_layers=settings.n_gpu_layers,
        batch_invariant=settings.batch_invariant,
        grammar_check_first=settings.grammar_check_first,
        kv_type=settings.kv_type,
    )


def _records(array: Any, n: int) -> Any:
    """A NumPy view of `n` `llama_token_data` in a ctypes array (writes go to the array)."""
    np = require("numpy", package="numpy", extra="llm")
    return np.frombuffer(array, dtype=np.dtype(_TOKEN_DATA), count=n)


def _floats(pointer: Any, n: int) -> Any:
    np = require("numpy", package="numpy", extra="llm")
    return np.ctypeslib.as_array(pointer, shape=(n,))


def _native_flag_poll(lib: Any) -> Any:
    """An abort callback that reads a flag byte without Python: libc's strlen (None if absent)."""
    try:
        libc = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        logger.warning("no libc strlen: gold requests cannot preempt a running decode")
        return None
    return lib.ggml_abort_callback(address)
