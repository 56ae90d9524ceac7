"""Refreshing the configured sources: one run at a time, its record, and the knowledge status.

Modules: ``refresher`` (``Refresher``: runs under the lock), ``runs`` (run records and where they are
kept), ``schedule`` (when a source is due), ``status`` (the knowledge status and its text),
``orphans`` (documents of sources no longer configured).

``Refresher.run(name)`` takes the refresh lock (``RedisLock`` across replicas when ``REDIS_URL`` is
set, else a lock of this process), optionally checks that the source is still due (another replica
may just have run it), then runs ``Indexer.refresh`` in a worker thread, so the event loop keeps
answering chat turns and renewing the lock while documents are embedded. The lock is renewed every
third of ``refresh.lock_ttl_s``; a replica that dies mid-run stops renewing and its lock expires,
and since every document is published atomically the previous knowledge stays fully served. A run
that finds its lock lost stops before its next document.

Each run leaves a ``RunRecord`` (the last one per source is kept, with counts per file format) and,
for URL sources, the validators of what it downloaded (for Confluence sources, the page versions). With Redis (keys after ``redis_prefix``):

====================================  ======  ==================================================
key                                   type    contents
====================================  ======  ==================================================
``{prefix}refresh:run:{source}``      string  the source's last ``RunRecord`` as JSON
``{prefix}refresh:fetch:{source}``    hash    url -> ``FetchState`` JSON (ETag, Last-Modified,
                                              content hash; a sitemap's listed pages); Confluence:
                                              doc id -> version and content hash
``{prefix}refresh:roots``             hash    root -> when a configured source last completed a
                                              run with it (``Orphans``)
``{prefix}lock:refresh``              string  the refresh lock (``bot.state.redis.RedisLock``)
====================================  ======  ==================================================

Without Redis they live in ``<data_dir>/refresh.json``.

A run that added, changed or removed documents then runs the ``Refresher.after_change`` hooks with its
``RefreshChanges``, after the lock is released (re-answering the gaps a refresh closed:
``bot.knowledge.loop``).

Every run also reconciles the configuration: once its own documents are published, it revokes the
documents of sources that are no longer configured (renamed or removed; see ``Orphans`` for when it
waits instead). A URL source reads robots.txt unless ``respect_robots: false``; a host whose
robots.txt cannot be had fails the run with the reason (its pages keep their versions).
"""

from bot.knowledge.refresh.orphans import Orphans
from bot.knowledge.refresh.refresher import LOCK_NAME, AfterChange, RefreshBusy, RefreshChanges, Refresher, UnknownSource
from bot.knowledge.refresh.runs import FileRunLog, RedisRunLog, RunLog, RunRecord, log_run, run_log
from bot.knowledge.refresh.schedule import (
    DUE_TOLERANCE_S,
    is_due,
    iso,
    next_due,
    parse_iso,
    permissions_run_name,
    schedule_zone,
    utcnow,
)

__all__ = [
    "DUE_TOLERANCE_S",
    "AfterChange",
    "RefreshChanges",
    "LOCK_NAME",
    "FileRunLog",
    "Orphans",
    "RedisRunLog",
    "RefreshBusy",
    "Refresher",
    "RunLog",
    "RunRecord",
    "UnknownSource",
    "is_due",
    "iso",
    "log_run",
    "next_due",
    "permissions_run_name",
    "parse_iso",
    "run_log",
    "schedule_zone",
    "utcnow",
]
