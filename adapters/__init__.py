"""Every way in and out of kbbot: console, CLI and (later) chat platforms."""

import bot  # noqa: F401  (turns Haystack telemetry off before anything imports haystack)
