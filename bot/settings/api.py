"""Settings of the HTTP API (``api:`` in ``config/kbbot.yaml``): who may call it and what each caller searches.

Each entry of ``api.tokens`` is a caller: a ``name`` (what logs, rate limits and thread keys name),
its bearer token, and the knowledge ``spaces`` its questions search. The token itself is best kept out
of the file: ``token_env`` names the environment variable that holds it. ``KBBOT_API_TOKEN`` adds one
caller named ``default`` with ``api.default_spaces``. Tokens are ``SecretStr``: never in a repr or a log.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from bot.settings.base import Env, Section, Spaces, reveal

ENV_TOKEN = "KBBOT_API_TOKEN"


class ApiToken(BaseModel):
    """One caller of the API."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    token: SecretStr | None = None
    token_env: str | None = None
    spaces: tuple[str, ...] = Field(default=("default",), min_length=1)

    @model_validator(mode="after")
    def _one_token(self) -> ApiToken:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("needs exactly one of token (the value) or token_env (the variable holding it)")
        return self

    def resolve(self, env: Mapping[str, str]) -> ApiToken:
        """This caller with ``token`` read from ``token_env``."""
        if self.token_env is None:
            return self
        value = env.get(self.token_env)
        if not value:
            raise ValueError(f"the environment variable {self.token_env} is not set")
        return self.model_copy(update={"token": SecretStr(value), "token_env": None})


class ApiSettings(Section):
    #: Callers: ``{name, token_env (or token), spaces}`` each.
    tokens: list[ApiToken] = []
    #: Spaces of the ``KBBOT_API_TOKEN`` caller.
    default_spaces: Spaces = ["default"]
    #: The model name ``/v1/models`` lists and completions report.
    model: str = "kbbot"
    #: How long an ``Idempotency-Key`` is remembered: a request sent again within it is not answered twice.
    dedupe_ttl_s: float = Field(3600, gt=0)
    #: The largest request body accepted (KiB).
    max_body_kb: int = Field(256, ge=1)
    #: The ``default`` caller's token.
    default_token: Annotated[SecretStr | None, Env(ENV_TOKEN, only=True)] = None
    _callers: list[ApiToken] = PrivateAttr(default_factory=list)
    _problems: list[str] = PrivateAttr(default_factory=list)

    @property
    def callers(self) -> list[ApiToken]:
        return self._callers

    @property
    def enabled(self) -> bool:
        return bool(self._callers)

    def resolve_callers(self, env: Mapping[str, str]) -> ApiSettings:
        """Reads each caller's ``token_env`` from ``env``; ``problems`` says which are missing.

        By hand: the variables' names are data of the file, which no settings source can know.
        """
        self._callers, self._problems = [], []
        for index, caller in enumerate(self.tokens):
            try:
                self._callers.append(caller.resolve(env))
            except ValueError as exc:
                self._problems.append(f"api.tokens[{index}]: {exc}")
        if self.default_token is not None:
            self._callers.append(ApiToken(name="default", token=self.default_token, spaces=tuple(self.default_spaces)))
        return self

    def problems(self) -> list[str]:
        found = list(self._problems)
        names = [c.name for c in self._callers]
        if len(set(names)) != len(names):
            found.append(f"api.tokens: each caller needs a name of its own ({ENV_TOKEN}'s is `default`)")
        values = [reveal(c.token) for c in self._callers]
        if len(set(values)) != len(values):
            found.append("api.tokens: two callers share a token")
        return found

    def caller(self, presented: str) -> ApiToken | None:
        """The caller whose token is ``presented`` (compared in constant time), else None."""
        found = None
        for caller in self._callers:
            # aiohttp keeps undecodable header bytes as surrogates: they encode back to what was sent.
            if hmac.compare_digest(reveal(caller.token).encode(), presented.encode("utf-8", "surrogateescape")):
                found = caller
        return found
