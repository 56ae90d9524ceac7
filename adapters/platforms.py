"""The registry of platforms: every way in to kbbot, by name; how ``kbbot serve`` builds them; and the
settings they make together.

A new platform is one folder under ``adapters/`` and one line in ``PLATFORMS``: its ``build(runtime,
conversations)`` returns a ``bot.platform.Platform`` (or None when its settings leave it off), and a chat
platform's section of the settings (a ``bot.settings.platforms.PlatformSettings``, in its folder's
``settings.py``) is read under its name (``slack:``, ``telegram:``). A platform's package loads its SDK
only in ``build``: every ``kbbot`` command reads this registry for the settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, create_model

import bot.settings
from adapters import api, slack, teams, telegram
from adapters.slack.settings import SlackSettings
from adapters.teams.settings import TeamsSettings
from adapters.telegram.settings import TelegramSettings
from bot.platform import Platform
from bot.settings.platforms import PlatformSettings


@dataclass(frozen=True)
class PlatformKind:
    """What the registry holds of a platform."""

    build: Callable[[Any, Any], Platform | None]
    #: A chat platform's section of the settings, under the platform's name; None: it has none of its own.
    settings: type[PlatformSettings] | None = None


PLATFORMS: dict[str, PlatformKind] = {
    "slack": PlatformKind(slack.build, SlackSettings),
    "telegram": PlatformKind(telegram.build, TelegramSettings),
    "teams": PlatformKind(teams.build, TeamsSettings),
    "api": PlatformKind(api.build),
}

#: kbbot's settings: ``bot.settings.Settings`` and each chat platform's section.
Settings = create_model(
    "Settings", __base__=bot.settings.Settings, __module__=__name__,
    **{name: (kind.settings, Field(default_factory=kind.settings))
       for name, kind in PLATFORMS.items() if kind.settings is not None})


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None) -> bot.settings.Settings:
    """``bot.settings.load_settings`` as ``Settings`` (with every platform's section): what ``kbbot`` reads."""
    return bot.settings.load_settings(path, env, model=Settings)


def build_platforms(runtime: Any, conversations: Any) -> dict[str, Platform]:
    """The configured platforms on one conversation service of a started runtime; the chat platforms
    among them answer the turns taken over from a replica that died."""
    platforms = {}
    for name, kind in PLATFORMS.items():
        platform = kind.build(runtime, conversations)
        if platform is not None:
            platforms[name] = platform
            if platform.delivery is not None:
                conversations.turns.serve(platform.delivery)
    return platforms
