"""The platform-neutral core of kbbot: one turn, history, settings."""

import pipelines  # noqa: F401  (turns Haystack telemetry off before anything imports haystack)
