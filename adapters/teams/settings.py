"""Settings of Microsoft Teams: the ``teams:`` section of ``config/kbbot.yaml`` plus environment.

The app's id, secret and Entra tenant come only from the environment (a file holding one is refused) and
are ``SecretStr``: never in a repr or a log. The login, OpenID and connector URLs are Microsoft's public
cloud unless overridden (a sovereign cloud, or a test's fake).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, StrictBool

from bot.settings.base import Env, Ids, Spaces
from bot.settings.platforms import PlatformSettings, Seconds, SpacesByChat

OPENID_CONFIGURATION_URL = "https://login.botframework.com/v1/.well-known/openidconfiguration"
LOGIN_URL = "https://login.microsoftonline.com"
GRAPH_URL = "https://graph.microsoft.com"
#: Where proactive messages go when no activity has named a service URL yet (Teams' public one).
SERVICE_URL = "https://smba.trafficmanager.net/teams/"


class TeamsSettings(PlatformSettings):
    """The ``teams:`` section (``digest_to``: a channel's or group chat's conversation id)."""

    SECTION = "teams"

    #: stream: Teams' streaming protocol in personal chats (informative update, streaming updates, the
    #: final message); edit: one message posted and updated. Channels and group chats always edit
    #: (Teams streams only in personal chats).
    stream_mode: Literal["stream", "edit"] = "stream"
    #: Entra tenants, teams and conversations (channel or group chat ids) kbbot answers in; empty = all.
    #: Personal chats are no conversations here.
    allowed_tenants: Ids = []
    allowed_teams: Ids = []
    allowed_channels: Ids = []
    #: Users (``29:…`` ids or Entra object ids) allowed to ask; empty = everyone.
    allowed_users: Ids = []
    #: Channel or group chat id -> knowledge spaces searched for questions asked there.
    channel_spaces: SpacesByChat = {}
    #: Spaces for conversations without a mapping, and for personal chats.
    default_spaces: Spaces = ["default"]
    #: Streaming: minimum seconds between two requests of one stream (Teams: one a second at most,
    #: 1.5-2 s recommended).
    stream_interval_s: Annotated[float, Field(ge=1.0)] = 1.5
    #: Edit mode: minimum seconds between two updates of one answer.
    edit_interval_s: Seconds = 1.5
    #: Longest text per message in characters; longer answers are split (an activity may hold about
    #: 28 KB of JSON, where one Chinese character can take 6 bytes).
    max_message_chars: int = Field(4000, ge=1, le=12000)
    #: 👍/👎 through Teams' feedback loop under each answer.
    feedback: StrictBool = True
    #: User ids (``29:…``) allowed to send ``status`` and ``refresh [SOURCE]``.
    admins: Ids = []
    #: User ids (``29:…``) who may keep experts' replies and decide re-checked approvals.
    reviewers: Ids = []
    #: The Bot Connector for messages kbbot starts (reviewers' notes, the digest) before any activity
    #: named one; each activity's own ``serviceUrl`` is used for its conversation.
    service_url: Annotated[str, Env("TEAMS_SERVICE_URL")] = SERVICE_URL
    openid_url: Annotated[str, Env("TEAMS_OPENID_URL")] = OPENID_CONFIGURATION_URL
    login_url: Annotated[str, Env("TEAMS_LOGIN_URL")] = LOGIN_URL
    #: Users' Entra groups from Microsoft Graph as ``group:<object id>`` principals (the app needs Graph's
    #: ``User.Read.All`` or ``GroupMember.Read.All`` application permission, and ``TEAMS_TENANT_ID``).
    graph_groups: StrictBool = False
    graph_url: Annotated[str, Env("TEAMS_GRAPH_URL")] = GRAPH_URL
    #: The login service for Graph's token; unset: ``login_url`` (one cloud signs in for both).
    graph_login_url: Annotated[str | None, Env("TEAMS_GRAPH_LOGIN_URL")] = None
    app_id: Annotated[SecretStr | None, Env("TEAMS_APP_ID", only=True)] = None
    app_secret: Annotated[SecretStr | None, Env("TEAMS_APP_SECRET", only=True)] = None
    #: The app's Entra tenant (single-tenant registrations); unset: ``botframework.com`` (multi-tenant).
    tenant_id: Annotated[SecretStr | None, Env("TEAMS_TENANT_ID", only=True)] = None


    @property
    def enabled(self) -> bool:
        return self.app_id is not None

    def spaces_for(self, conversation: str) -> tuple[str, ...]:
        return tuple(self.channel_spaces.get(conversation) or self.default_spaces)

    def is_reviewer(self, user: str) -> bool:
        return bool(user) and user in self.reviewers

    def problems(self) -> list[str]:
        if self.enabled and self.app_secret is None:
            return ["TEAMS_APP_ID is set but TEAMS_APP_SECRET is not (kbbot's replies need the app's token)"]
        if self.enabled and self.graph_groups and self.tenant_id is None:
            return ["teams.graph_groups needs TEAMS_TENANT_ID (Graph's token is for the app's own tenant)"]
        return []
