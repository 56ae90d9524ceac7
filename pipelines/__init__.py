"""Haystack pipelines of kbbot: indexing, querying, the store factory and our components.

Importing this package turns Haystack telemetry off before Haystack itself is imported:
the knowledge base and its questions are company data and must not leave the machine.
"""

import os

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"
