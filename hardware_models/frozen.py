"""An immutable, hashable, picklable mapping for the `Mapping` fields of the frozen value objects."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["FrozenDict"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(Mapping[K, V]):
    """A read-only dict. Equal to any mapping with the same items; hashable when its values are."""

    __slots__ = ("_data",)
    _data: dict[K, V]

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        object.__setattr__(self, "_data", dict(data))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FrozenDict is immutable")

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return bool(self._data == dict(other.items()))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (self._data,))
