"""Every way in and out of kbbot, one module (or a few) per platform: Slack (``slack``, ``slack_reply``,
``slack_text``), Telegram (``telegram``, ``telegram_reply``, ``telegram_text``), the HTTP API
(``http_api``), the console and the ``kbbot`` command (``console``, ``cli``), ``kbbot serve``'s web
server (``server``) and the admin page (``admin``). Each translates its platform's events into calls of
``bot/`` and renders what comes back; delivery around a chat turn is ``bot/delivery.py``'s."""

import bot  # noqa: F401  (turns Haystack telemetry off before anything imports haystack)
