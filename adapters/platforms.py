"""The registry of platforms: every way in to kbbot, by name, and how ``kbbot serve`` builds them.

A new platform is one folder under ``adapters/`` whose ``build(runtime, conversations)`` returns a
``bot.platform.Platform`` (or None when its settings leave it off), and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters import api, slack, teams, telegram
from bot.platform import Platform

BUILDERS: dict[str, Callable[[Any, Any], Platform | None]] = {
    "slack": slack.build,
    "telegram": telegram.build,
    "teams": teams.build,
    "api": api.build,
}


def build_platforms(runtime: Any, conversations: Any) -> dict[str, Platform]:
    """The configured platforms on one conversation service of a started runtime; the chat platforms
    among them answer the turns taken over from a replica that died."""
    platforms = {}
    for name, build in BUILDERS.items():
        platform = build(runtime, conversations)
        if platform is not None:
            platforms[name] = platform
            if platform.delivery is not None:
                conversations.turns.serve(platform.delivery)
    return platforms
