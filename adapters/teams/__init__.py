"""Microsoft Teams: channel mentions (answered in their reply chain), personal and group chats in;
streamed, cited answers out (``platform``: activities, invokes, commands; ``reply``: its messages,
streaming and rate limits; ``text``: escaping, citations, cards; ``connector``: the Bot Connector through
the Teams SDK; ``auth``: the Bot Framework's JWTs and the app's token; ``directory``: who a user is and who
reads a conversation; ``graph``: a user's Entra groups from Microsoft Graph; ``settings``: its section)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bot.settings.base import reveal

if TYPE_CHECKING:
    from adapters.teams.platform import TeamsAdapter


def build(runtime: Any, conversations: Any) -> TeamsAdapter | None:
    """Teams on ``runtime``'s settings (None when ``TEAMS_APP_ID`` is not set)."""
    s = runtime.settings
    settings = s.teams
    if not settings.enabled:
        return None
    # The SDK loads here, for ``kbbot serve``: the registry, which imports this package, is read by every command.
    from adapters.teams.directory import TeamsDirectory
    from adapters.teams.platform import TeamsAdapter
    from adapters.teams.reply import make_rates

    settings.check_serving()
    platform = TeamsAdapter(conversations, settings, rates=make_rates(settings, runtime.redis, s.redis_prefix),
                            redis=runtime.redis, prefix=s.redis_prefix)
    platform.graph = _graph(settings)
    runtime.audiences.register("teams", TeamsDirectory(platform.connector, platform.service_url_of, platform.seen,
                                                       cache_s=s.permissions.cache_s, groups=platform.graph,
                                                       graph_tenant=reveal(settings.tenant_id)))
    return platform


def _graph(settings: Any) -> Any:
    """Microsoft Graph for users' groups, when ``teams.graph_groups`` asks for it."""
    if not settings.graph_groups:
        return None
    from adapters.teams.auth import BotTokens
    from adapters.teams.graph import GRAPH_SCOPE, GraphGroups

    tokens = BotTokens(reveal(settings.app_id), reveal(settings.app_secret), reveal(settings.tenant_id),
                       login_url=settings.graph_login_url or settings.login_url, scope=GRAPH_SCOPE)
    return GraphGroups(tokens, graph_url=settings.graph_url)
