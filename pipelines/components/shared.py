"""Values the query components hand on that Haystack's input copies share instead of copying.

Haystack deep-copies every input of every component and every output it reports, a list element by
element with a ``typing`` runtime-protocol check on each element (~15 µs on Python 3.11): the
retrieved chunks, their vector candidates and the fact lines of one turn were most of its CPU
outside the model and the stores (``bench.turn``; docs/benchmarks.md, "Turn cost"). Haystack's own rule for
components is never to change an input in place (``dataclasses.replace`` makes a changed Document;
it warns on assignment), so values that keep that rule can be shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, overload

from haystack import Document

T = TypeVar("T")


class Passage(Document):
    """A retrieved chunk as the query components hand it on: a value, shared instead of copied.

    Haystack deep-copies every component input, a list element by element with a runtime-protocol
    check on each: the ranked candidates' copies were ~20 ms of a turn's CPU.
    Haystack's own rule for components is never to change a Document in place but to make a new
    one with ``dataclasses.replace`` (which keeps the class; Haystack warns on assignment), so a
    Passage can be shared: its deep copy is itself, and assigning to one of its fields raises.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_sealed"):
            raise AttributeError(f"a Passage is not changed in place: use dataclasses.replace(passage, {name}=...)")
        super().__setattr__(name, value)

    def __deepcopy__(self, memo: dict[int, Any]) -> Passage:
        # Kept for speed, not to share state: the copies Haystack makes of the ranked chunks were ~16 ms of
        # a turn's CPU (docs/benchmarks.md, "Turn cost"; tests/test_turn_cost.py fails if it is undone).
        return self


def passages(documents: Iterable[Document]) -> list[Document]:
    """``documents`` as Passages (those that already are, as they are)."""
    return [d if isinstance(d, Passage) else Passage(id=d.id, content=d.content, blob=d.blob, meta=d.meta,
                                                     score=d.score, embedding=d.embedding,
                                                     sparse_embedding=d.sparse_embedding)
            for d in documents]


class SharedSequence(Sequence[T]):
    """A read-only sequence whose deep copy is itself: one protocol check per hand-over instead of
    one per element. It compares equal to a list or tuple of the same items, like a list would."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[T] = ()):
        self._items = tuple(items)

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        """An item, or a slice as a new list (as a list would give)."""
        if isinstance(index, slice):
            return list(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedSequence):
            return type(other) is type(self) and self._items == other._items
        return isinstance(other, (list, tuple)) and list(self._items) == list(other)

    __hash__ = None  # type: ignore[assignment]  # compares equal to lists, like a list

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._items)!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedSequence[T]:
        # Kept for speed, as ``Passage``'s: a read-only sequence needs no copy, and one check per hand-over
        # replaces one per element (the vector candidates and fact lines of every turn).
        return self


class FactLines(SharedSequence[str]):
    """The fact lines a turn found (``entity | attribute | value (from: title)``), best first."""

    __slots__ = ()
