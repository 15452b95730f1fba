"""Connected components of a relation (union-find): the one grouping the graph passes share.

Example
-------
>>> components([1, 2, 3, 4], [(1, 3)])
[[1, 3], [2], [4]]
"""
from __future__ import annotations

from typing import Hashable, Iterable, TypeVar

T = TypeVar("T", bound=Hashable)


def components(items: Iterable[T], links: Iterable[tuple[T, T]]) -> list[list[T]]:
    """``items`` grouped into the connected components of ``links`` (pairs of items).

    Each component keeps the order of ``items``; components are ordered by their first item.
    """
    order = list(items)
    parent = {x: x for x in order}

    def find(x: T) -> T:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in links:
        parent[find(a)] = find(b)
    groups: dict[T, list[T]] = {}
    for x in order:
        groups.setdefault(find(x), []).append(x)
    return list(groups.values())


__all__ = ["components"]
