"""Settings for clustered stores: Weaviate replication and consistency, Redis behind Sentinels;
bad values are refused with the setting's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.settings import SettingsError
from bot.state.redis import parse_sentinel_url, sentinel_url
from pipelines.weaviate_store import (
    chunk_collection_settings,
    consistency_level,
    manifest_collection_settings,
    replication_settings,
)
from tests.conftest import make_settings


def test_defaults_keep_one_copy_and_the_servers_consistency(tmp_path: Path):
    s = make_settings(tmp_path)
    assert (s.weaviate.replication_factor, s.weaviate.consistency) == (1, None)
    assert "replicationConfig" not in chunk_collection_settings("KbChunk")
    assert consistency_level(None) is None
    with pytest.raises(ValueError, match="at least 1"):
        replication_settings(0)


def test_replication_reaches_both_collections_with_repair_and_deletions_that_win(tmp_path: Path):
    s = make_settings(tmp_path, WEAVIATE_REPLICATION_FACTOR="3", WEAVIATE_CONSISTENCY="QUORUM")
    assert (s.weaviate.replication_factor, s.weaviate.consistency) == (3, "quorum")
    expected = {"factor": 3, "asyncEnabled": True, "deletionStrategy": "TimeBasedResolution"}
    assert chunk_collection_settings("KbChunk", replication_factor=3)["replicationConfig"] == expected
    assert manifest_collection_settings("KbChunkManifest", 3)["replicationConfig"] == expected
    assert consistency_level("all").value == "ALL"


@pytest.mark.parametrize(("env", "message"), [
    ({"WEAVIATE_REPLICATION_FACTOR": "three"}, "WEAVIATE_REPLICATION_FACTOR must be a whole number"),
    ({"WEAVIATE_REPLICATION_FACTOR": "0"}, "WEAVIATE_REPLICATION_FACTOR must be at least 1, got '0'"),
    ({"WEAVIATE_CONSISTENCY": "most"}, "WEAVIATE_CONSISTENCY is 'most'; expected one of one, quorum, all"),
    ({"REDIS_SENTINELS": "localhost"}, "REDIS_SENTINELS entries are host:port, got 'localhost'"),
    ({"REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL must be a redis://, rediss:// (TLS), unix:// or "
                                             "redis+sentinel:// URL"),
    ({"REDIS_URL": "redis://127.0.0.1:6379/0", "REDIS_REPLICA_ACKS": "one"}, "REDIS_REPLICA_ACKS must be"),
])
def test_bad_values_are_refused_by_name(tmp_path: Path, env: dict[str, str], message: str):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        make_settings(tmp_path, **env)


def test_sentinels_become_one_url_and_acknowledged_writes(tmp_path: Path):
    s = make_settings(tmp_path, REDIS_SENTINELS="10.0.0.1:26379, 10.0.0.2:26379", REDIS_MASTER_NAME="prod")
    assert s.redis_url == "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/prod"
    assert s.redis_replica_acks == 1
    assert make_settings(tmp_path, REDIS_URL="redis://127.0.0.1:6379/0").redis_replica_acks == 0
    assert make_settings(tmp_path, REDIS_SENTINELS="h:1", REDIS_REPLICA_ACKS="0").redis_replica_acks == 0


def test_a_sentinel_url_carries_hosts_master_db_and_password():
    hosts, master, options = parse_sentinel_url("redis+sentinel://:s%40cret@a:26379,b:26380/kbbot/2")
    assert hosts == [("a", 26379), ("b", 26380)] and master == "kbbot"
    assert options == {"db": 2, "username": None, "password": "s@cret"}
    assert parse_sentinel_url(sentinel_url("a:1", "m")) == ([("a", 1)], "m", {"db": 0})
    for bad in ("redis+sentinel://a:1", "redis+sentinel://a:1/m/x", "redis+sentinel://a/m"):
        with pytest.raises(ValueError):
            parse_sentinel_url(bad)
