"""What every chat platform's settings section shares (``PlatformSettings``), and the field types they use.

Each platform's own section lives in its folder (``adapters/slack/settings.py``, ...) and is added to
the settings under the platform's name by the registry (``adapters/platforms.py``): ``bot/`` reads
these sections only through this base, never by a platform's name.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, field_validator, model_validator

from bot.errors import SettingsError
from bot.settings.base import Problem, Section, Spaces

Seconds = Annotated[float, Field(ge=0)]


def _keys_as_text(value: Any) -> Any:
    """Chat and channel ids are YAML numbers or strings as keys; the settings look them up as text."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value


#: Chat or channel id -> the knowledge spaces searched for questions asked there.
SpacesByChat = Annotated[dict[str, Spaces], BeforeValidator(_keys_as_text)]


class PlatformSettings(Section):
    """A chat platform's section of the settings (``slack:``, ``telegram:``, ...)."""

    #: Keys an older settings file holds elsewhere that are read as this section's: the dotted key
    #: path -> the key here (``bot.settings.load_settings`` moves them, with a warning).
    OLDER_KEYS: ClassVar[dict[str, str]] = {}

    #: The section's key in the settings file (``slack``, ``telegram``, ...), for the messages that name a key.
    SECTION: ClassVar[str] = ""

    #: Where the weekly digest goes on this platform (a channel or chat id); null: not here.
    digest_to: str | None = None
    #: How long a delivered event id is remembered: a redelivery within it is not answered twice.
    dedupe_ttl_s: float = Field(86400, gt=0)
    #: While its turn runs, an event's claim lasts this long and is renewed: a process that dies
    #: mid-turn frees the event for the platform's next delivery or another replica's take-over,
    #: instead of after ``dedupe_ttl_s``.
    claim_lease_s: float = Field(30, gt=0)

    @model_validator(mode="after")
    def _lease_within_dedupe(self) -> PlatformSettings:
        if self.claim_lease_s > self.dedupe_ttl_s:
            raise Problem(f"must be at most {self.SECTION}.dedupe_ttl_s", at=("claim_lease_s",))
        return self

    @field_validator("digest_to", mode="before")
    @classmethod
    def _id_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @property
    def enabled(self) -> bool:
        """Whether its credentials are set: ``kbbot serve`` builds it."""
        raise NotImplementedError

    def problems(self) -> list[str]:
        """What the environment got wrong for serving, one line each naming the variable (empty when
        valid). Not checked when the settings load: ``kbbot ask`` must not fail because the
        environment holds a Slack token without its signing secret."""
        raise NotImplementedError

    def check_serving(self) -> None:
        problems = self.problems()
        if problems:
            raise SettingsError(problems[0])
