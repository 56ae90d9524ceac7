"""What kbbot is about: the scope the topic guard checks and the products it tells apart.

Loaded from ``config/topics.yaml`` by the settings; pipeline components get a ``Topics``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=256)
def _name_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True))
    return re.compile(f"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])", re.I)


@dataclass(frozen=True)
class Product:
    """A product model that questions may need to name (``HL-M200``), with other spellings."""

    name: str
    aliases: tuple[str, ...] = ()
    kind: str = ""

    def named_in(self, text: str) -> bool:
        return bool(_name_pattern((self.name, *self.aliases)).search(text or ""))


@dataclass(frozen=True)
class Topics:
    """In-scope subjects, examples of what is out of scope, and the product models."""

    in_scope: tuple[str, ...] = ()
    out_of_scope: tuple[str, ...] = ()
    products: tuple[Product, ...] = ()
    assistant: str = "the company's after-sales and helpdesk assistant"

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], where: str = "topics") -> Topics:
        """Builds from the parsed YAML; raises ValueError naming the bad key."""
        if not isinstance(raw, dict):
            raise ValueError(f"{where} must be a mapping")
        unknown = set(raw) - {"assistant", "in_scope", "out_of_scope", "products"}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")

        def strings(key: str) -> tuple[str, ...]:
            value = raw.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                raise ValueError(f"{where}.{key} must be a list of non-empty strings")
            return tuple(v.strip() for v in value)

        products = []
        for i, item in enumerate(raw.get("products") or []):
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict) or not str(item.get("name") or "").strip():
                raise ValueError(f"{where}.products[{i}] needs a name")
            aliases = item.get("aliases") or []
            if not isinstance(aliases, list):
                raise ValueError(f"{where}.products[{i}].aliases must be a list")
            products.append(Product(str(item["name"]).strip(), tuple(str(a).strip() for a in aliases if str(a).strip()),
                                    str(item.get("kind") or "")))
        return cls(in_scope=strings("in_scope"), out_of_scope=strings("out_of_scope"), products=tuple(products),
                   assistant=str(raw.get("assistant") or cls.assistant))

    def products_in(self, text: str) -> list[Product]:
        """The products ``text`` names, in the order of the catalogue."""
        return [p for p in self.products if p.named_in(text)]

    def scope_summary(self) -> str:
        return "; ".join(self.in_scope)
