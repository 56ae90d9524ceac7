"""Every way in and out of kbbot: one folder per platform (``slack/``, ``telegram/``, ``api/``, ``console/``), each
implementing the one platform contract (``bot/platform.py``), the registry that builds them (``platforms``), and
the composition above them: ``kbbot serve``'s web server (``server``), the ``kbbot`` command (``cli``), the admin
page (``admin``)."""

import bot  # noqa: F401  (turns Haystack telemetry off before anything imports haystack)
