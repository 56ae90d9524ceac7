"""What every settings section shares: pydantic models that refuse unknown keys (``Section``, with
``Problem`` and ``Texts`` from ``pipelines.sections``, where the source kinds' settings use them too), the
environment variables that set them (declared on their fields), and a bad value explained in one line
that names its key, or the variable it came from."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from pydantic import BaseModel, BeforeValidator, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from bot.errors import SettingsError
from pipelines.redact import redact_url
from pipelines.sections import Problem as Problem
from pipelines.sections import Section as Section
from pipelines.sections import Texts as Texts


@dataclass(frozen=True)
class Env:
    """Field metadata: the environment variable that sets this setting over the settings file.

    ``only``: never read from the file (a secret, or a setting that is only ever deployment's): a file
    that has it is refused, naming the variable to use instead.
    """

    name: str
    only: bool = False


def reveal(secret: SecretStr | None) -> str:
    """A secret's value where a client needs it; ``""`` when unset."""
    return secret.get_secret_value() if secret is not None else ""


def as_ids(value: Any) -> list[str]:
    """User, team, channel or chat ids as text (YAML numbers become text); a bare id is a list of one,
    and ``key:`` (null) an empty one."""
    if value is None:
        value = []
    elif isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(
            isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip() for v in value):
        raise ValueError("must be a list of ids (text or numbers)")
    return [str(v).strip() for v in value]


def _spaces(value: Any) -> list[str]:
    # An empty list would switch the space filter off (every space searchable) and a plain string
    # would be read as one space per character: both are refused.
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"must be a non-empty list of knowledge space names, e.g. [default]; got {value!r}")
    return value


def _text(value: Any) -> Any:
    """``policy_version: 1`` in YAML is a number; the setting is text."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Ids = Annotated[list[str], BeforeValidator(as_ids)]
#: Knowledge spaces: a non-empty list.
Spaces = Annotated[list[str], BeforeValidator(_spaces)]
Text = Annotated[str, BeforeValidator(_text)]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def env_fields(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Env]]:
    """Every (key path, Env) of ``model`` and its sections (not of list items: those come only from the file)."""
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Env):
                yield (*path, name), meta
        section = info.annotation if inspect.isclass(info.annotation) else None
        if section is not None and issubclass(section, BaseModel):
            yield from env_fields(section, (*path, name))


class EnvironmentSource(PydanticBaseSettingsSource):
    """The environment variables declared with ``Env``, each put at its key path; an empty one is unset.

    Hand-written because pydantic-settings' ``EnvSettingsSource`` reaches a nested field only through
    a delimiter (``SLACK__BOT_TOKEN``) or a prefix scheme (every field a variable): either would rename
    the documented variables (``SLACK_BOT_TOKEN``, ``WEAVIATE_URL``) or let any stray ``SLACK_*``
    variable in. It also reads a given mapping, so ``load_settings(env=...)`` is isolated from
    ``os.environ``.
    """

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env = env
        #: key path -> the variable that set it, so an error names what the operator actually set.
        self.origins: dict[tuple[str | int, ...], Env] = {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # values are gathered per key path in __call__

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for path, env in env_fields(self.settings_cls):
            value = self.env.get(env.name)
            if value is None or not value.strip():
                continue
            self.origins[path] = env
            node = values
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
        return values


def refuse_environment_only(model: type[BaseModel], raw: Mapping[str, Any], where: str) -> None:
    """A settings file holding a secret (or another environment-only setting) fails naming the variable."""
    for path, env in env_fields(model):
        if not env.only:
            continue
        node: Any = raw
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
            if node is None:
                break
        else:
            raise SettingsError(f"{where}: {'.'.join(path)} is read only from the environment: remove it from "
                                f"the file and set {env.name}")


# --- explaining a ValidationError ---------------------------------------------------------------

_PHRASES = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "too_short": "must have at least {min_length} item(s)",
    "string_too_short": "must not be empty",
    "string_pattern_mismatch": "must match {pattern}",
    "missing": "is required",
}


def _field_at(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> FieldInfo | None:
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            break  # a key of a mapping setting (slack.channel_spaces.C0X): the mapping's field
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _model_in(field.annotation)
    return field


def _shown(value: Any) -> str:
    if isinstance(value, str) and "://" in value:
        return repr(redact_url(value))
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class Explainer:
    """Turns pydantic's errors into lines like ``retrieval.top_k must be at least 1, got 0``.

    ``origins`` names the environment variable behind a key path (the line names the variable, not
    the key); ``raw`` is the file's content, whose source names label ``sources[i] (name)``.
    """

    def __init__(self, model: type[BaseModel], origins: Mapping[tuple[str | int, ...], Env] | None = None,
                 raw: Mapping[str, Any] | None = None) -> None:
        self.model, self.origins, self.raw = model, origins or {}, raw or {}

    def where(self, loc: tuple[str | int, ...]) -> str:
        if loc in self.origins:
            return self.origins[loc].name
        text = ""
        for i, part in enumerate(loc):
            if isinstance(part, int):
                text += f"[{part}]"
                if loc[:i] == ("sources",):
                    entries = self.raw.get("sources")
                    entry = entries[part] if isinstance(entries, list) and part < len(entries) else None
                    if isinstance(entry, Mapping) and entry.get("name"):
                        text += f" ({entry['name']})"
            else:
                text += f".{part}" if text else str(part)
        return text

    def line(self, error: Mapping[str, Any]) -> str:
        loc = tuple(error["loc"])
        # A bound of a float field is a float: "at least 1", not "at least 1.0".
        ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in (error.get("ctx") or {}).items()}
        cause = ctx.get("error")
        if isinstance(cause, Problem):
            loc += cause.at
        where = self.where(loc) or "the settings file"
        kind = error["type"]
        if kind == "extra_forbidden":
            field = _field_at(self.model, loc[:-1])
            parent = self.model if not loc[:-1] else _model_in(field.annotation) if field is not None else None
            known = list(parent.model_fields) if parent is not None else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            return f"unknown setting {where}" + (f" (did you mean {close[0]}?)" if close else "")
        if kind in ("value_error", "assertion_error") and cause is not None:
            text = str(cause)
            return f"{where}{text}" if text.startswith(":") else f"{where} {text}"
        if kind == "literal_error":
            choices = ctx["expected"].replace("'", "").replace(" or ", ", ")
            return f"{where} is {_shown(error['input'])}; expected one of {choices}"
        phrase = _PHRASES.get(kind)
        text = phrase.format(**ctx) if phrase else error["msg"][:1].lower() + error["msg"][1:]
        if kind == "greater_than" and ctx.get("gt") == 0:
            text = "must be positive"
        if kind != "missing" and not self._secret(loc):
            text += f", got {_shown(error['input'])}"
        return f"{where} {text}"

    def _secret(self, loc: tuple[str | int, ...]) -> bool:
        field = _field_at(self.model, loc)
        return field is not None and "SecretStr" in str(field.annotation)

    def __call__(self, error: ValidationError) -> SettingsError:
        lines = list(dict.fromkeys(self.line(e) for e in error.errors(include_url=False)))
        more = f"\n(and {len(lines) - 5} more)" if len(lines) > 5 else ""
        return SettingsError("\n".join(lines[:5]) + more)


#: The scheme of a Redis URL behind Sentinels (``REDIS_SENTINELS``): ``bot.state.redis`` connects to it.
SENTINEL_SCHEME = "redis+sentinel"


def sentinel_url(sentinels: str, master_name: str) -> str:
    """``REDIS_SENTINELS`` (``host:port,host:port``) and ``REDIS_MASTER_NAME`` as one URL."""
    hosts = [h.strip() for h in sentinels.split(",") if h.strip()]
    if not hosts or not master_name.strip():
        raise ValueError("REDIS_SENTINELS needs host:port entries and REDIS_MASTER_NAME a name")
    for host in hosts:
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"REDIS_SENTINELS entries are host:port, got {host!r}")
    return f"{SENTINEL_SCHEME}://{','.join(hosts)}/{master_name.strip()}"
