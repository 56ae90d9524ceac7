"""How a Weaviate store queries: its fusion, its vector weight, its query timeout. The store is opened
with them (``WeaviateKnowledgeStore``) and its retriever (``retriever.WeaviateHybridRetriever``) sends them."""

from __future__ import annotations

from pipelines.fusion import DEFAULT_ALPHA as RETRIEVAL_ALPHA

DEFAULT_FUSION = "relative_score"
#: Weaviate's fusions: rank-based and score-based.
FUSIONS = ("ranked", "relative_score")
#: The in-memory retriever's name for the same fusion (reciprocal rank fusion is Weaviate's ranked).
#: ``dbsf`` has no counterpart: it is refused here rather than run as another fusion under its name.
FUSION_ALIASES = {"rrf": "ranked"}
DEFAULT_ALPHA = RETRIEVAL_ALPHA  # the same weighting as the in-memory store's relative score fusion
#: How long a retrieval may take before it is reported as Weaviate being unreachable.
DEFAULT_QUERY_TIMEOUT_S = 10.0
