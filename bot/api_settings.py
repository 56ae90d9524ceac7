"""Settings of the HTTP API (``api:`` in ``config/kbbot.yaml``): who may call it and what each caller searches.

Each entry of ``api.tokens`` is a caller: a ``name`` (what logs, rate limits and thread keys name),
its bearer token, and the knowledge ``spaces`` its questions search. The token itself is best kept out
of the file: ``token_env`` names the environment variable that holds it. ``KBBOT_API_TOKEN`` adds one
caller named ``default`` with ``api.default_spaces``. Tokens are ``SecretStr``: never in a repr or a log.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

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
            raise ValueError("give exactly one of token (the value) or token_env (the variable holding it)")
        return self

    def resolve(self, env: Mapping[str, str]) -> ApiToken:
        """This caller with ``token`` read from ``token_env``."""
        if self.token_env is None:
            return self
        value = env.get(self.token_env)
        if not value:
            raise ValueError(f"the environment variable {self.token_env} is not set")
        return self.model_copy(update={"token": SecretStr(value), "token_env": None})


def _describe(where: str, error: ValidationError) -> str:
    """``where.field: what is wrong`` for the first problem pydantic found."""
    first = error.errors()[0]
    field_path = "".join(f".{part}" if isinstance(part, str) else f"[{part}]" for part in first["loc"])
    return f"{where}{field_path}: {first['msg']}"


@dataclass
class ApiSettings:
    #: Callers: ``{name, token_env (or token), spaces}`` each.
    tokens: list[Any] = field(default_factory=list)
    #: Spaces of the ``KBBOT_API_TOKEN`` caller.
    default_spaces: list[str] = field(default_factory=lambda: ["default"])
    #: The model name ``/v1/models`` lists and completions report.
    model: str = "kbbot"
    #: How long an ``Idempotency-Key`` is remembered: a request sent again within it is not answered twice.
    dedupe_ttl_s: float = 3600
    #: The largest request body accepted (KiB).
    max_body_kb: int = 256
    callers: list[ApiToken] = field(default_factory=list, init=False, repr=False)
    _problems: list[str] = field(default_factory=list, init=False, repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.callers)

    def apply_env(self, env: Mapping[str, str]) -> ApiSettings:
        """Parses ``tokens`` (with their variables) and adds ``KBBOT_API_TOKEN``; ``problems`` says what failed."""
        self.callers, self._problems = [], []
        if not isinstance(self.tokens, list):
            self._problems.append("api.tokens must be a list of {name, token_env, spaces}")
            return self
        for index, raw in enumerate(self.tokens):
            try:
                self.callers.append(ApiToken.model_validate(raw).resolve(env))
            except ValidationError as exc:
                self._problems.append(_describe(f"api.tokens[{index}]", exc))
            except ValueError as exc:
                self._problems.append(f"api.tokens[{index}]: {exc}")
        if env.get(ENV_TOKEN):
            self.callers.append(ApiToken(name="default", token=SecretStr(env[ENV_TOKEN]),
                                         spaces=tuple(self.default_spaces)))
        return self

    def problems(self) -> list[str]:
        found = list(self._problems)
        names = [c.name for c in self.callers]
        if len(set(names)) != len(names):
            found.append("api.tokens: each caller needs a name of its own (KBBOT_API_TOKEN's is `default`)")
        values = [c.token.get_secret_value() for c in self.callers if c.token is not None]
        if len(set(values)) != len(values):
            found.append("api.tokens: two callers share a token")
        if not self.default_spaces:
            found.append("api.default_spaces must name at least one space")
        if self.dedupe_ttl_s <= 0 or self.max_body_kb < 1:
            found.append("api.dedupe_ttl_s must be positive and api.max_body_kb at least 1")
        return found

    def caller(self, presented: str) -> ApiToken | None:
        """The caller whose token is ``presented`` (compared in constant time), else None."""
        found = None
        for caller in self.callers:
            assert caller.token is not None
            if hmac.compare_digest(caller.token.get_secret_value().encode(), presented.encode()):
                found = caller
        return found
