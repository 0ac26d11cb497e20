"""The transformers + PEFT backend: one PyTorch model, many sequences, a LoRA per row.

Where llama.cpp applies one adapter set to a whole decode call, PEFT's mixed-batch inference
(`adapter_names`, one name per row) lets a single forward pass serve a vampire, a zombie and
the base model together; the scheduler then groups work by gold-ness only
(`Backend.mixed_adapters`). An adapter set of several adapters, or a scale other than 1, is
built once as a concatenated adapter (`add_weighted_adapter(..., combination_type="cat")`,
exact for LoRA: the deltas add) and kept in a small LRU.

KV memory is held per sequence (keys and values of every layer) and assembled into one padded
batch per call: past cells left-padded, new tokens right-aligned, a 4-D additive mask that
hides the padding. Masked cells get the dtype's most negative number rather than -inf, so a
padded row never turns into NaN. This is a reference runtime: it runs on CPU in the tests
and on a GPU when there is one (`device: auto`); llama.cpp stays the fast CPU backend.

Constrained decoding (JSON schema, GBNF) needs llama.cpp's grammar sampler: here such a
request is refused with `GrammarError` at submit, so route constrained kinds to a llama.cpp
engine. DRY (`Sampling.dry_multiplier`) is llama.cpp's too: here it is ignored, with one
warning in the log.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mythic._extras import require
from mythic.config import EngineSettings
from mythic.engine._backend import Backend, BackendError, KVCacheFullError, Sampling, SequenceChunk
from mythic.engine._chat_format import ChatFormat
from mythic.engine._errors import (
    AdapterError,
    GrammarError,
    InvalidRequestError,
    ModelLoadError,
)
from mythic.engine._scheduler import AdapterKey
from mythic.engine.models import ModelStore, ResolvedModel

logger = logging.getLogger(__name__)

PENALTY_LAST_N = 64
"""Recent sampled tokens the repeat penalty looks at (as in the llama.cpp backend)."""
BASE_ADAPTER = "__base__"
"""PEFT's name for "no adapter" in a mixed batch."""
MAX_COMBINED = 16
"""Concatenated adapter sets kept built (least recently used first out)."""
_EOG_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")


def _torch() -> Any:
    return require("torch", package="torch", extra="train")


@dataclass(slots=True)
class _Sampler:
    sampling: Sampling
    generator: Any
    history: list[int] = field(default_factory=list)


class TransformersBackend(Backend):
    """A transformers causal LM (optionally PEFT-wrapped) serving many sequences."""

    mixed_adapters = True
    adapter_format = "peft"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        chat_format: ChatFormat | None,
        n_ctx: int = 2048,
        n_seq_max: int = 32,
        n_batch: int = 512,
    ) -> None:
        """Serve a loaded model. Prefer `from_gguf` or `from_config`.

        Raises:
            ModelLoadError: the model uses sliding-window or otherwise non-growing KV layers,
                which this backend cannot slice per sequence.
        """
        torch = _torch()
        self._torch = torch
        config = model.config.get_text_config(decoder=True)
        layer_types = getattr(config, "layer_types", None) or ()
        if any(t != "full_attention" for t in layer_types) or getattr(
            config, "use_sliding_window", False
        ):
            raise ModelLoadError(
                f"{name} uses sliding-window attention, which the transformers backend does "
                "not serve",
                fix="serve this model with engine.backend: llama.cpp",
            )
        self.name = name
        self.chat_format = chat_format
        self.n_ctx_seq = min(n_ctx, int(getattr(config, "max_position_embeddings", n_ctx)))
        self.n_seq_max = n_seq_max
        self.n_ctx = self.n_ctx_seq * n_seq_max
        self.n_batch = n_batch
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._n_layers = int(config.num_hidden_layers)
        self._kv: dict[int, list[tuple[Any, Any]]] = {}
        self._logits: Any = None
        self._adapters: dict[str, str] = {}
        self._combined: OrderedDict[AdapterKey, str] = OrderedDict()
        self._key: AdapterKey = ()
        self._dry_ignored = False
        """Whether a request's DRY setting has been logged as ignored (once per backend)."""
        self._pieces: list[bytes]
        self._eog: frozenset[int]
        if tokenizer is None:  # benchmarks that feed token ids straight to `decode`
            self._pieces, self._eog = [b""] * int(config.vocab_size), frozenset()
        else:
            self._pieces, self._eog = _vocabulary(tokenizer)
        self.n_vocab = len(self._pieces)

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def from_gguf(
        cls,
        resolved: ResolvedModel,
        *,
        n_ctx: int = 2048,
        n_seq_max: int = 32,
        n_batch: int = 512,
        device: str = "auto",
    ) -> TransformersBackend:
        """Load a packaged GGUF model through transformers (weights dequantised to float).

        Raises:
            MissingExtraError: torch, transformers or gguf is missing (the `train` extra).
            ModelLoadError: transformers cannot read this GGUF's architecture.
        """
        transformers = require("transformers", package="transformers", extra="train")
        require("gguf", package="gguf", extra="train")
        torch = _torch()
        dev, dtype = _placement(torch, device)
        folder, file = str(resolved.path.parent), resolved.path.name
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=file, dtype=dtype
            ).to(dev)
        except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as exc:
            raise ModelLoadError(
                f"transformers could not load {resolved.path}: {exc}",
                fix="serve this model with engine.backend: llama.cpp",
            ) from exc
        if resolved.context_length:
            n_ctx = min(n_ctx, resolved.context_length)
        return cls(
            model,
            tokenizer,
            name=resolved.name,
            chat_format=resolved.chat_format,
            n_ctx=n_ctx,
            n_seq_max=n_seq_max,
            n_batch=n_batch,
        )

    @classmethod
    def from_config(
        cls,
        config: Any,
        tokenizer: Any,
        *,
        name: str = "random",
        chat_format: ChatFormat | None = None,
        seed: int = 0,
        device: str = "auto",
        **kwargs: Any,
    ) -> TransformersBackend:
        """A model of random weights built from a config (tests and benchmarks: nothing is
        downloaded). The tokenizer must fit the config's vocabulary."""
        transformers = require("transformers", package="transformers", extra="train")
        torch = _torch()
        dev, dtype = _placement(torch, device)
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(dev)
        return cls(model, tokenizer, name=name, chat_format=chat_format, **kwargs)

    # -- text ----------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        if self.tokenizer is None:
            raise InvalidRequestError(f"{self.name} was built without a tokenizer: no text")
        ids = self.tokenizer(
            text, add_special_tokens=add_special, split_special_tokens=not parse_special
        )["input_ids"]
        return [int(i) for i in ids]

    def piece(self, token: int) -> bytes:
        return self._pieces[token] if 0 <= token < len(self._pieces) else b""

    def is_end_of_generation(self, token: int) -> bool:
        return token in self._eog

    def json_schema_grammar(self, schema: str) -> str:
        raise GrammarError(
            f"{self.name} runs on the transformers backend, which cannot constrain output to a "
            "JSON schema",
            fix="route constrained kinds (intent, bark, tool_decision) to a llama.cpp engine",
        )

    def check_grammar(self, gbnf: str) -> None:
        raise GrammarError(
            f"{self.name} runs on the transformers backend, which cannot apply a GBNF grammar",
            fix="route constrained requests to a llama.cpp engine",
        )

    def make_sampler(
        self, sampling: Sampling, seed: int, grammar: str | None, *, said: Sequence[int] = ()
    ) -> object:
        if grammar is not None:
            self.check_grammar(grammar)
        if sampling.dry_multiplier > 0 and not self._dry_ignored:
            self._dry_ignored = True
            logger.warning(
                "%s runs on the transformers backend, which has no DRY sampler: "
                "dry_multiplier is ignored (set chat.dry_multiplier: 0 to silence this)",
                self.name,
            )
        generator = self._torch.Generator(device="cpu")
        generator.manual_seed(seed)
        return _Sampler(sampling, generator)

    def free_sampler(self, sampler: object) -> None:
        return None

    # -- evaluation (the engine's worker thread) -----------------------------------------------

    def decode(self, chunks: Sequence[SequenceChunk], *, interruptible: bool = False) -> list[int]:
        torch = self._torch
        if not chunks:
            return []
        if sum(len(c.tokens) for c in chunks) > self.n_batch:
            raise BackendError(f"a decode call of more than n_batch={self.n_batch} tokens")
        if len({c.seq_id for c in chunks}) != len(chunks):
            raise BackendError("a sequence appears twice in one decode call")
        for c in chunks:
            have = self._length(c.seq_id)
            if have < c.pos:
                raise BackendError(f"sequence {c.seq_id} holds {have} cells, not {c.pos}")
            if have > c.pos:
                self.seq_remove(c.seq_id, c.pos)
            if c.pos + len(c.tokens) > self.n_ctx_seq:
                raise KVCacheFullError(f"sequence {c.seq_id} would pass {self.n_ctx_seq} cells")
        used = sum(self._length(s) for s in self._kv)
        if used + sum(len(c.tokens) for c in chunks) > self.n_ctx:
            raise KVCacheFullError(f"the KV memory holds {used} of {self.n_ctx} cells")
        names = self._row_adapters(chunks)
        try:
            with torch.inference_mode(), self._attention():
                logits = self._forward(chunks, names)
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"the forward pass failed: {exc}") from exc
        self._logits = logits
        return [i if c.logits else -1 for i, c in enumerate(chunks)]

    def _attention(self) -> Any:
        """The attention kernels a forward pass may use. On CUDA not cuDNN's: it builds a new
        graph for every shape it has not seen, and each step of a sequence that grows is a new
        shape (about 4 ms per layer per step on an H100: 80 ms a token for SmolLM2's 30 layers,
        where the memory-efficient kernel, which takes the same additive mask, needs none)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        attention = importlib.import_module("torch.nn.attention")
        backend = attention.SDPBackend
        return attention.sdpa_kernel([backend.EFFICIENT_ATTENTION, backend.MATH])

    def _forward(self, chunks: Sequence[SequenceChunk], names: list[str] | None) -> Any:
        torch = self._torch
        dev = self.device
        rows = len(chunks)
        past = max(c.pos for c in chunks)
        width = max(len(c.tokens) for c in chunks)
        ids = torch.zeros((rows, width), dtype=torch.long)
        positions = torch.zeros((rows, width), dtype=torch.long)
        visible = torch.zeros((rows, past + width), dtype=torch.bool)
        for r, c in enumerate(chunks):
            n = len(c.tokens)
            ids[r, width - n :] = torch.tensor(list(c.tokens), dtype=torch.long)
            positions[r, width - n :] = torch.arange(c.pos, c.pos + n)
            visible[r, past - c.pos : past] = True
            visible[r, past + width - n :] = True
        # Causal over columns: new token j sits at column past + j and sees columns up to it.
        columns = torch.arange(past + width)
        causal = columns[None, :] <= (past + torch.arange(width))[:, None]
        allowed = causal[None, :, :] & visible[:, None, :]
        mask = torch.zeros((rows, 1, width, past + width), dtype=self.dtype)
        mask.masked_fill_(~allowed[:, None, :, :], torch.finfo(self.dtype).min)

        # Every row at the same length with as many new tokens: no padding anywhere, so the
        # stored KV goes into the cache as it is (one row: a view, no copy) and comes back out
        # of it, grown, as the new stored KV. A voice turn's prompt and reply run this way.
        even = all(c.pos == past and len(c.tokens) == width for c in chunks)
        cache = self._even_cache(chunks) if even else self._padded_cache(chunks, past)
        kwargs: dict[str, Any] = {}
        if names is not None:
            kwargs["adapter_names"] = names
        out = self.model(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        layers = out.past_key_values.layers
        if even:
            for r, c in enumerate(chunks):
                self._kv[c.seq_id] = [(layer.keys[r], layer.values[r]) for layer in layers]
            return out.logits[:, -1, :].float().cpu()
        for r, c in enumerate(chunks):
            n = len(c.tokens)
            stored = self._kv.get(c.seq_id)
            kv = []
            for layer_index, layer in enumerate(layers):
                keys = layer.keys[r, :, past + width - n :]
                values = layer.values[r, :, past + width - n :]
                if stored:
                    old_k, old_v = stored[layer_index]
                    keys = torch.cat([old_k, keys], dim=1)
                    values = torch.cat([old_v, values], dim=1)
                kv.append((keys, values))
            self._kv[c.seq_id] = kv
        return out.logits[:, -1, :].float().cpu()

    def _even_cache(self, chunks: Sequence[SequenceChunk]) -> Any:
        """The cache of rows that all hold the same number of cells: their stored KV stacked
        (one row: viewed)."""
        transformers = require("transformers", package="transformers", extra="train")
        torch = self._torch
        if chunks[0].pos == 0:
            return transformers.DynamicCache(config=self.model.config)
        stored = [self._kv[c.seq_id] for c in chunks]
        data = []
        for layer_index in range(self._n_layers):
            keys = [kv[layer_index][0] for kv in stored]
            values = [kv[layer_index][1] for kv in stored]
            if len(stored) == 1:
                data.append((keys[0].unsqueeze(0), values[0].unsqueeze(0)))
            else:
                data.append((torch.stack(keys), torch.stack(values)))
        return transformers.DynamicCache(data, config=self.model.config)

    def _padded_cache(self, chunks: Sequence[SequenceChunk], past: int) -> Any:
        transformers = require("transformers", package="transformers", extra="train")
        torch = self._torch
        if past == 0:
            return transformers.DynamicCache(config=self.model.config)
        data = []
        for layer_index in range(self._n_layers):
            keys = values = None
            for r, c in enumerate(chunks):
                if c.pos == 0:
                    continue
                k, v = self._kv[c.seq_id][layer_index]
                if keys is None:
                    shape = (len(chunks), k.shape[0], past, k.shape[2])
                    keys = torch.zeros(shape, dtype=k.dtype, device=k.device)
                    values = torch.zeros(shape, dtype=v.dtype, device=v.device)
                assert values is not None
                keys[r, :, past - c.pos :] = k[:, : c.pos]
                values[r, :, past - c.pos :] = v[:, : c.pos]
            data.append((keys, values))
        return transformers.DynamicCache(data, config=self.model.config)

    def sample(self, sampler: object, output_index: int) -> int:
        torch = self._torch
        assert isinstance(sampler, _Sampler)
        s = sampler.sampling
        logits = self._logits[output_index].clone()
        if s.repeat_penalty != 1.0 and sampler.history:
            recent = torch.tensor(sorted(set(sampler.history[-PENALTY_LAST_N:])))
            chosen = logits[recent]
            logits[recent] = torch.where(
                chosen > 0, chosen / s.repeat_penalty, chosen * s.repeat_penalty
            )
        if s.temperature <= 0:
            token = int(torch.argmax(logits))
        else:
            if 0 < s.top_k < logits.shape[0]:
                kth = torch.topk(logits, s.top_k).values[-1]
                logits[logits < kth] = float("-inf")
            if s.top_p < 1.0:
                ordered, order = torch.sort(logits, descending=True)
                cumulative = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1)
                cut = cumulative - torch.softmax(ordered, dim=-1) >= s.top_p
                logits[order[cut]] = float("-inf")
            probs = torch.softmax(logits / s.temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=sampler.generator))
        sampler.history.append(token)
        return token

    # -- KV memory -----------------------------------------------------------------------------

    def _length(self, seq_id: int) -> int:
        kv = self._kv.get(seq_id)
        return int(kv[0][0].shape[1]) if kv else 0

    def seq_remove(self, seq_id: int, start: int = 0) -> None:
        if start <= 0:
            self._kv.pop(seq_id, None)
            return
        kv = self._kv.get(seq_id)
        if kv:
            self._kv[seq_id] = [(k[:, :start], v[:, :start]) for k, v in kv]

    def seq_copy(self, src: int, dst: int, length: int) -> None:
        kv = self._kv.get(src)
        if not kv or length <= 0:
            self._kv.pop(dst, None)
            return
        # Slices share storage; nothing writes into a stored tensor (appends make new ones).
        self._kv[dst] = [(k[:, :length], v[:, :length]) for k, v in kv]

    def clear(self) -> None:
        self._kv.clear()
        self._logits = None

    # -- adapters ------------------------------------------------------------------------------

    @property
    def adapters(self) -> frozenset[str]:
        return frozenset(self._adapters)

    def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA adapter directory (adapter_config.json + weights) under `name`."""
        peft = require("peft", package="peft", extra="train")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise AdapterError(
                f"{path} is not a PEFT adapter directory (no adapter_config.json)",
                fix="save the adapter with PeftModel.save_pretrained, or `mythic train adapter`",
            )
        if name == BASE_ADAPTER or name in self._adapters:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        try:
            with warnings.catch_warnings():
                # peft 0.21 reads an alias transformers 5 deprecates; nothing for a user to do.
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
                if isinstance(self.model, peft.PeftModel):
                    self.model.load_adapter(str(folder), adapter_name=name)
                else:
                    self.model = peft.PeftModel.from_pretrained(
                        self.model, str(folder), adapter_name=name
                    ).eval()
        except (ValueError, KeyError, OSError, RuntimeError) as exc:
            raise AdapterError(
                f"{path} is not a LoRA adapter for {self.name}: {exc}",
                fix="train the adapter on this base model",
            ) from exc
        self._adapters[name] = str(folder)

    def unload_adapter(self, name: str) -> None:
        """Delete a loaded adapter from the PEFT model, with the combined sets built from it.
        The last one unwraps the model: PEFT cannot run a model left with no adapter."""
        if name not in self._adapters:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        try:
            for key, combined in list(self._combined.items()):
                if any(n == name for n, _ in key):
                    del self._combined[key]
                    self.model.delete_adapter(combined)
            if len(self._adapters) == 1:
                self.model = self.model.unload().eval()
            else:
                if name in self.model.active_adapters:
                    # Rows name their adapter, so which one is "active" does not matter; PEFT
                    # would pick another itself, with a warning.
                    other = next(n for n in self._adapters if n != name)
                    self.model.set_adapter(other, inference_mode=True)
                self.model.delete_adapter(name)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise AdapterError(f"PEFT could not delete adapter {name!r}: {exc}") from exc
        del self._adapters[name]
        if any(n == name for n, _ in self._key):
            self._key = ()

    def set_adapters(self, key: AdapterKey) -> bool:
        changed = key != self._key
        self._key = key
        return changed

    def _row_adapters(self, chunks: Sequence[SequenceChunk]) -> list[str] | None:
        if not self._adapters:
            return None
        return [self._adapter_name(c.adapters or self._key) for c in chunks]

    def _adapter_name(self, key: AdapterKey) -> str:
        if not key:
            return BASE_ADAPTER
        if len(key) == 1 and key[0][1] == 1.0:
            return key[0][0]
        name = self._combined.get(key)
        if name is not None:
            self._combined.move_to_end(key)
            return name
        name = "+".join(f"{n}*{scale:g}" for n, scale in key)
        try:
            self.model.add_weighted_adapter(
                [n for n, _ in key],
                [scale for _, scale in key],
                adapter_name=name,
                combination_type="cat",
            )
        except (ValueError, KeyError, RuntimeError) as exc:
            raise BackendError(f"cannot combine adapters {name}: {exc}") from exc
        self._combined[key] = name
        if len(self._combined) > MAX_COMBINED:
            _, oldest = self._combined.popitem(last=False)
            self.model.delete_adapter(oldest)
        return name

    def close(self) -> None:
        self.clear()
        self.model = None
        self._combined.clear()


def load_transformers_backend(
    model: str, settings: EngineSettings, *, n_seq_max: int | None = None
) -> TransformersBackend:
    """Resolve `model` (a packaged name or a GGUF path) and load it through transformers.

    Raises:
        ModelError: unknown, not installed, corrupt, or not loadable by transformers.
        MissingExtraError: the `train` extra is not installed.
    """
    resolved = ModelStore(settings.models_dir).resolve(model, chat_format=settings.chat_format)
    return TransformersBackend.from_gguf(
        resolved,
        n_ctx=settings.n_ctx,
        n_seq_max=n_seq_max or settings.max_sequences,
        n_batch=settings.n_batch,
        device=settings.device,
    )


def _placement(torch: Any, device: str) -> tuple[Any, Any]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, dtype


def _vocabulary(tokenizer: Any) -> tuple[list[bytes], frozenset[int]]:
    """Each token's bytes in generated text, and the tokens that end a reply."""
    size = len(tokenizer)
    special = set(tokenizer.all_special_ids)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    decoder = _byte_decoder()
    byte_level = _is_byte_level(tokenizer)
    pieces: list[bytes] = []
    for index, token in enumerate(tokens):
        if index in special or token is None:
            pieces.append(b"")
        elif byte_level and all(ch in decoder for ch in token):
            pieces.append(bytes(decoder[ch] for ch in token))
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            pieces.append(bytes([int(token[3:5], 16)]))
        else:
            pieces.append(token.replace("\u2581", " ").encode())
    eog = {i for i in (tokenizer.eos_token_id,) if i is not None}
    for name in _EOG_NAMES:
        index = tokenizer.convert_tokens_to_ids(name)
        if isinstance(index, int) and index != tokenizer.unk_token_id and index in special:
            eog.add(index)
    return pieces, frozenset(eog)


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    # A ByteLevel decoder, alone or inside a Sequence of decoders.
    return decoder is not None and "ByteLevel" in repr(decoder)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}
