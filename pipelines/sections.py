"""What every settings section is made of: a pydantic model that refuses unknown keys, the complaint
that names a key below the one validated, and a list of texts.

Here, below ``bot``, because the source kinds (``pipelines.sources``) declare their settings with them;
``bot.settings.base`` explains their errors and reads the environment.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


class Section(BaseModel):
    """A section of the settings file: an unknown (or misspelt) key is refused; assignments are checked too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Problem(ValueError):
    """A validator's complaint about a key below the one it validates: ``at`` is the rest of the key path.

    The text follows the key: ``"must be …"`` reads ``key must be …``; a text starting with ``:`` is
    joined without the space (``key: 'soon' is not an interval``).
    """

    def __init__(self, text: str, *, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(text)
        self.at = at


def _texts(value: Any) -> list[str]:
    value = [value] if isinstance(value, str) else ([] if value is None else value)
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError("must be a list of non-empty strings")
    return [v.strip() for v in value]


#: Non-empty strings, stripped; a bare string is a list of one.
Texts = Annotated[list[str], BeforeValidator(_texts)]
