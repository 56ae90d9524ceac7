"""The knowledge store on Weaviate: chunks in one collection, the manifest in a second one.

=================  ==============================================================================
module             holds
=================  ==============================================================================
``schema``         the collections' definitions and names; the keyword-analysis version check and
                   the rewrite ``kbbot reindex`` runs
``manifest``       the manifest collection: document records, sequence numbers, the knowledge version
``store``          ``WeaviateKnowledgeStore``: publish, revoke, commit, records, languages
``options``        the query options a store is opened with: fusion, vector weight, query timeout
``retriever``      ``WeaviateHybridRetriever`` (BM25, vector, hybrid; fusion done by Weaviate); it
                   imports the store, never the other way (``components.retrievers.retriever_for``
                   picks it for a store)
``scores``         dense candidates and per-question re-weighing read from a hybrid query's explanations
``connection``     the clients, reconnection, and ``WeaviateUnavailable``
``integration``    what reaches into weaviate-haystack's private API (and why), in one place
=================  ==============================================================================

The names below are the package's public API; ``pipelines.store.open_store("weaviate", ...)`` is the
usual way in. This package is imported only when a Weaviate store is opened: the client is heavy.
"""

from pipelines.weaviate_store.connection import WeaviateUnavailable
from pipelines.weaviate_store.integration import ChunkDocumentStore, to_document, weaviate_filters
from pipelines.weaviate_store.options import DEFAULT_ALPHA, DEFAULT_FUSION, DEFAULT_QUERY_TIMEOUT_S, FUSIONS
from pipelines.weaviate_store.retriever import WeaviateHybridRetriever
from pipelines.weaviate_store.schema import (
    DEFAULT_GRPC_PORT,
    DEFAULT_TOKENIZATION,
    QUERY_PROPERTIES,
    SEARCH_TEXT_PROPERTY,
    StoreOutdated,
    chunk_collection_settings,
    collection_name,
    consistency_level,
    grpc_port_from_env,
    manifest_collection_settings,
    replication_settings,
)
from pipelines.weaviate_store.scores import PROBE_ALPHA, explained_scores, reweighed
from pipelines.weaviate_store.store import DEFAULT_SETTLE_S, FULL_REFRESH_S, WeaviateKnowledgeStore

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_FUSION",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_QUERY_TIMEOUT_S",
    "DEFAULT_SETTLE_S",
    "DEFAULT_TOKENIZATION",
    "FULL_REFRESH_S",
    "FUSIONS",
    "PROBE_ALPHA",
    "QUERY_PROPERTIES",
    "SEARCH_TEXT_PROPERTY",
    "ChunkDocumentStore",
    "StoreOutdated",
    "WeaviateHybridRetriever",
    "WeaviateKnowledgeStore",
    "WeaviateUnavailable",
    "chunk_collection_settings",
    "collection_name",
    "consistency_level",
    "explained_scores",
    "grpc_port_from_env",
    "manifest_collection_settings",
    "replication_settings",
    "reweighed",
    "to_document",
    "weaviate_filters",
]
