"""The platform-neutral core of kbbot: the conversation service (``conversation``), one turn
(``answering``), delivery around it for every chat platform (``delivery``, ``pending``, ``streaming``,
``rate_buckets``), state (``state``, ``redis_state``, ``history``, ``cache``, ``preferences``), the words
kbbot says (``messages``), settings, refresh and scheduling, and the composition root (``runtime``)."""

import pipelines  # noqa: F401  (turns Haystack telemetry off before anything imports haystack)
