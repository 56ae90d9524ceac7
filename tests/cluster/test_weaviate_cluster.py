"""A three-node Weaviate cluster: one node killed under the store's reads, and one killed while turns
and a refresh run (``make test-cluster``).

The collections are created with replication factor 3 and read and written at quorum, so with one
node of three gone every read and write still has two copies to agree on; the node that comes back
is repaired by asynchronous replication until it holds what the others hold.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import weaviate
from haystack import Document
from weaviate.classes.config import ConsistencyLevel
from weaviate.classes.query import Filter
from weaviate.connect.base import ConnectionParams

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from pipelines.records import DocRecord
from pipelines.weaviate_store import WeaviateHybridRetriever, WeaviateKnowledgeStore
from tests.cluster.replicas import kb_folder
from tests.cluster.services import services, services_up
from tests.conftest import make_settings
from tests.replies import RecordingReply

# Turns here embed on a shared CPU while three servers run: minutes, not the default five.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
KB_FILES = ("faq.md", "fault-codes.md", "maintenance-schedule.md", "motor-does-not-start.txt")

QUESTIONS = [
    "How long is the standard warranty?",
    "What does fault code E07 mean?",
    "How often should the bearings be greased?",
    "What is the rated power of the HL-M200?",
    "The motor does not start, what should I check?",
]


@pytest.fixture(scope="module")
def cluster():
    with services_up("cluster") as env:
        yield env


def node_url(url: str, node: int) -> str:
    """Node N's URL: the cluster's HTTP ports follow node1's (scripts/services.sh)."""
    base = int(url.rsplit(":", 1)[1])
    return f"{url.rsplit(':', 1)[0]}:{base + node - 1}"


def stored_ids(url: str, grpc_port: int, collection: str, level: ConsistencyLevel = ConsistencyLevel.QUORUM,
               ) -> set[str]:
    """The ids of every object of ``collection``, read through the node at ``url``."""
    client = weaviate.WeaviateClient(connection_params=ConnectionParams.from_url(url, grpc_port))
    client.connect()
    try:
        objects = client.collections.get(collection).with_consistency_level(level)
        return {str(o.uuid) for o in objects.iterator(return_properties=[])}
    finally:
        client.close()


def chunks_of(store, doc_id: str, version: int) -> int:
    where = Filter.by_property("doc_id").equal(doc_id) & Filter.by_property("version").equal(version)
    return len(store.collection.query.fetch_objects(filters=where, limit=1000, return_properties=[]).objects)


def test_a_store_that_loses_one_node_of_three_keeps_counting_listing_and_answering(cluster):
    """Right after a node dies, while the others' gossip still lists it (about 5 s here), every read
    of the store returns within its timeout: Weaviate 1.38's count(*) waits a minute for that node."""
    url, grpc_port = cluster["WEAVIATE_URL"], int(cluster["WEAVIATE_GRPC_PORT"])
    store = WeaviateKnowledgeStore(url, f"Lose_{uuid.uuid4().hex[:8]}", grpc_port, replication_factor=3,
                                   consistency="quorum", timeout_s=10)
    try:
        for d in range(5):
            chunks = [Document(content=f"part {i} of document {d}", embedding=[(d + 1) / 10, i / 10, 0.5, 0.1])
                      for i in range(4)]
            store.publish(DocRecord(doc_id=f"doc{d}", version=0, content_hash=str(d), title=f"Document {d}",
                                    source=f"doc{d}.md"), chunks)
        store.commit()
        retriever = WeaviateHybridRetriever.of(store, mode="hybrid", candidates=5)
        services("cluster", "kill", "3")
        started = time.monotonic()
        assert store.count_chunks() == 20
        assert len(store.records(reread=True)) == 5
        assert retriever.run(query="document part", query_embedding=[0.1, 0.1, 0.5, 0.1])["documents"]
        took = time.monotonic() - started
        print(f"counted, listed and answered {took:.2f} s after node3 was killed")
        assert took < 10
    finally:
        services("cluster", "start")  # the node back for the next test
        store.drop()  # once the node is back: dropping a collection waited longer than 10 s without it
        store.close()


async def test_a_node_killed_during_turns_and_a_refresh_loses_nothing_and_catches_up(
        cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url = cluster["WEAVIATE_URL"]
    monkeypatch.setenv("WEAVIATE_GRPC_PORT", cluster["WEAVIATE_GRPC_PORT"])
    settings = make_settings(tmp_path / "data", WEAVIATE_URL=url, WEAVIATE_REPLICATION_FACTOR="3",
                             WEAVIATE_CONSISTENCY="quorum")
    settings.store.collection = f"Cluster_{uuid.uuid4().hex[:8]}"
    runtime = build_runtime(settings)
    store = runtime.store
    config = store.collection.config.get()
    assert config.replication_config.factor == 3 and config.replication_config.async_enabled

    kb = kb_folder(tmp_path / "kb", *KB_FILES)
    assert not runtime.indexer.index([kb]).failed
    await runtime.start()

    # The refresh that runs while the node is down: one document changed, one added, one removed.
    (kb / "faq.md").write_text((kb / "faq.md").read_text(encoding="utf-8") + "\n\nQ: Is there a hotline?\n"
                               "A: The service hotline answers around the clock.\n", encoding="utf-8")
    (kb / "spare-parts.md").write_text("# Spare parts\nSpare fan kits for the HL-M200 are part SP-200-F.\n",
                                       encoding="utf-8")
    (kb / "motor-does-not-start.txt").unlink()

    answers: list[tuple[Outcome, RecordingReply]] = []
    first_turn_done = asyncio.Event()

    async def ask(i: int) -> None:
        reply = RecordingReply()
        question = QUESTIONS[i % len(QUESTIONS)]
        answer = await runtime.answerer.answer(Inquiry("test", "t", "c", f"test:cluster:{i}", f"u{i}", question),
                                               reply)
        answers.append((answer.outcome, reply))
        first_turn_done.set()

    async def turns() -> None:
        for batch in range(3):
            await asyncio.gather(*(ask(batch * 3 + k) for k in range(3)))

    async def fault_and_refresh() -> object:
        await first_turn_done.wait()
        await asyncio.to_thread(services, "cluster", "kill", "3")
        return await asyncio.to_thread(runtime.indexer.index, [kb])

    try:
        _, report = await asyncio.gather(turns(), fault_and_refresh())
        assert not report.failed, report.failed
        assert report.added and report.changed and report.removed

        assert len(answers) == 9
        failed = [(o, r.failure) for o, r in answers if o is Outcome.ERROR or r.failure]
        assert failed == [], failed
        assert all(r.final is not None for _, r in answers)

        # No document lost: every current record has exactly its chunks, and nothing else is stored.
        records = store.records()
        assert "spare-parts.md" in " ".join(r.source for r in records.values())
        assert not any(r.source.endswith("motor-does-not-start.txt") for r in records.values())
        for record in records.values():
            assert chunks_of(store, record.doc_id, record.version) == record.chunks, record.source
        assert store.count_chunks() == sum(r.chunks for r in records.values())
        expected = {name: stored_ids(url, int(cluster["WEAVIATE_GRPC_PORT"]), name)
                    for name in (store.collection_name, store.manifest_name)}
        assert len(expected[store.collection_name]) == store.count_chunks()

        # The node comes back with its old data and is repaired until it holds the same objects.
        started = time.monotonic()
        await asyncio.to_thread(services, "cluster", "start")
        node3 = node_url(url, 3), int(cluster["WEAVIATE_GRPC_PORT"]) + 2
        while time.monotonic() - started < 240:
            if all(stored_ids(*node3, name, ConsistencyLevel.ONE) == ids for name, ids in expected.items()):
                break
            await asyncio.sleep(3)
        print(f"node3 caught up within {time.monotonic() - started:.1f} s of being started again")
        reply = RecordingReply()
        answer = await runtime.answerer.answer(
            Inquiry("test", "t", "c", "test:cluster:after", "u", "Which part number is the spare fan kit?"), reply)
        assert answer.outcome is Outcome.ANSWERED and "SP-200-F" in answer.text

        # Proof that node3 holds it all itself: the other two gone, it answers reads at ONE alone.
        for node in ("1", "2"):
            await asyncio.to_thread(services, "cluster", "kill", node)
        for name, ids in expected.items():
            assert stored_ids(*node3, name, ConsistencyLevel.ONE) == ids, name
    finally:
        await runtime.close()
