"""Rectangular tensor regions and output-tile grids.

A :class:`Region` is a box: one half-open range ``[start, start + extent)`` per dimension.
Regions produced by the analysis are always clamped to their tensor's shape, so an extent
of zero means "nothing of this tensor is needed".

Example
-------
>>> r = Region.tile((98304, 128), (4, 128))
>>> r.ranges, r.num_elements
(((0, 4), (0, 128)), 512)
>>> tile_region((10, 10), (4, 4), (2, 0)).ranges   # the last, partial tile along dim 0
((8, 2), (0, 4))
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Iterable, Sequence


from ..errors import AnalysisError
from ..graph.opgraph import element_bytes


@dataclass(frozen=True)
class Region:
    """A box of a tensor: ``ranges[d] = (start, extent)`` for each dimension ``d``."""

    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        for start, extent in self.ranges:
            if extent < 0:
                raise AnalysisError(f"region extent must be >= 0, got {self.ranges}")
            if not isinstance(start, int) or not isinstance(extent, int):
                raise AnalysisError(f"region bounds must be ints, got {self.ranges}")

    @classmethod
    def full(cls, shape: Sequence[int]) -> "Region":
        """The whole tensor.

        Examples
        --------
        >>> Region.full((2, 3)).ranges
        ((0, 2), (0, 3))
        """
        return cls(tuple((0, int(d)) for d in shape))

    @classmethod
    def empty(cls, rank: int) -> "Region":
        """A region holding no element (every extent is zero)."""
        return cls(tuple((0, 0) for _ in range(rank)))

    @classmethod
    def tile(cls, shape: Sequence[int], tile: Sequence[int]) -> "Region":
        """The tile of shape ``tile`` at the origin of a tensor of shape ``shape``.

        Examples
        --------
        >>> Region.tile((6, 6), (4, 8)).ranges    # capped at the tensor
        ((0, 4), (0, 6))
        """
        return tile_region(shape, tile, (0,) * len(tuple(shape)))

    @classmethod
    def from_bounds(cls, bounds: Sequence[tuple[int, int]], shape: Sequence[int],
                    interior: bool = False) -> "Region":
        """Region from inclusive ``(lo, hi)`` bounds, fitted into ``shape``.

        With ``interior=False`` the box is intersected with the tensor (a tile at the border loses
        the part outside, e.g. the padding of a convolution). With ``interior=True`` only the extent
        is capped at the dimension and the box is shifted inside the tensor: this is the region of a
        representative tile away from every border.

        Examples
        --------
        >>> Region.from_bounds([(-1, 4)], (8,)).ranges
        ((0, 5),)
        >>> Region.from_bounds([(-1, 4)], (8,), interior=True).ranges
        ((0, 6),)
        """
        if len(bounds) != len(shape):
            raise AnalysisError(f"bounds {list(bounds)} do not match rank of shape {tuple(shape)}")
        ranges = []
        for (lo, hi), dim in zip(bounds, shape):
            dim = int(dim)
            if interior:
                extent = max(0, min(hi - lo + 1, dim))
                start = min(max(lo, 0), dim - extent)
            else:
                start, stop = max(lo, 0), min(hi + 1, dim)
                if stop <= start:
                    start, stop = min(start, dim), min(start, dim)
                extent = stop - start
            ranges.append((int(start), int(extent)))
        return cls(tuple(ranges))

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.ranges)

    @property
    def starts(self) -> tuple[int, ...]:
        """First index per dimension."""
        return tuple(s for s, _ in self.ranges)

    @property
    def extents(self) -> tuple[int, ...]:
        """Size per dimension (the tile shape)."""
        return tuple(e for _, e in self.ranges)

    @property
    def num_elements(self) -> int:
        """Number of elements in the box."""
        return prod(self.extents)

    @property
    def is_empty(self) -> bool:
        """Whether the box holds no element."""
        return any(e == 0 for e in self.extents)

    def bounds(self) -> list[tuple[int, int]]:
        """Inclusive ``(lo, hi)`` per dimension."""
        return [(s, s + e - 1) for s, e in self.ranges]

    def union(self, other: "Region") -> "Region":
        """Bounding box of both regions (an empty region adds nothing).

        Examples
        --------
        >>> Region(((0, 2),)).union(Region(((4, 1),))).ranges
        ((0, 5),)
        """
        if other.rank != self.rank:
            raise AnalysisError(f"cannot unite regions of rank {self.rank} and {other.rank}")
        if other.is_empty:
            return self
        if self.is_empty:
            return other
        ranges = []
        for (s0, e0), (s1, e1) in zip(self.ranges, other.ranges):
            lo, hi = min(s0, s1), max(s0 + e0, s1 + e1)
            ranges.append((lo, hi - lo))
        return Region(tuple(ranges))

    def contains(self, other: "Region") -> bool:
        """Whether ``other`` lies inside this box (an empty region lies anywhere)."""
        if other.is_empty:
            return True
        return all(s0 <= s1 and s1 + e1 <= s0 + e0
                   for (s0, e0), (s1, e1) in zip(self.ranges, other.ranges))

    def nbytes(self, dtype: str) -> int:
        """Bytes of the box for elements of ``dtype``.

        Examples
        --------
        >>> Region.tile((98304, 64), (4, 64)).nbytes("float32")
        1024
        """
        return self.num_elements * element_bytes(dtype)


def _check_tile(shape: Sequence[int], tile: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape, tile = tuple(int(d) for d in shape), tuple(int(t) for t in tile)
    if len(shape) != len(tile):
        raise AnalysisError(f"tile {tile} has rank {len(tile)}, tensor shape {shape} has rank {len(shape)}")
    if any(t <= 0 for t in tile):
        raise AnalysisError(f"tile sizes must be positive, got {tile}")
    return shape, tile


def tile_grid(shape: Sequence[int], tile: Sequence[int]) -> tuple[int, ...]:
    """Number of tiles along each dimension (the last tile may be partial).

    Examples
    --------
    >>> tile_grid((98304, 128), (4, 128))
    (24576, 1)
    """
    shape, tile = _check_tile(shape, tile)
    return tuple(-(-d // min(t, d)) if d else 0 for d, t in zip(shape, tile))


def num_tiles(shape: Sequence[int], tile: Sequence[int]) -> int:
    """Total number of tiles covering a tensor.

    Examples
    --------
    >>> num_tiles((98304, 128), (16, 128))
    6144
    """
    return prod(tile_grid(shape, tile))


def tile_region(shape: Sequence[int], tile: Sequence[int], index: Sequence[int]) -> Region:
    """The region of tile number ``index`` (one index per dimension) of a tensor.

    Tiles at the far border are cut to the tensor, so every tile lies inside it.

    Examples
    --------
    >>> tile_region((8, 8), (2, 4), (1, 1)).ranges
    ((2, 2), (4, 4))
    """
    shape, tile = _check_tile(shape, tile)
    index = tuple(int(i) for i in index)
    grid = tile_grid(shape, tile)
    if len(index) != len(shape) or any(not 0 <= i < max(g, 1) for i, g in zip(index, grid)):
        raise AnalysisError(f"tile index {index} is outside the tile grid {grid}")
    ranges = []
    for d, t, i in zip(shape, tile, index):
        start = i * t
        ranges.append((min(start, d), max(0, min(t, d - start))))
    return Region(tuple(ranges))


def iter_tiles(shape: Sequence[int], tile: Sequence[int]) -> Iterable[Region]:
    """Every tile region of a tensor, in row-major tile order.

    Examples
    --------
    >>> [r.ranges for r in iter_tiles((4,), (3,))]
    [((0, 3),), ((3, 1),)]
    """
    grid = tile_grid(shape, tile)
    total = prod(grid)
    for flat in range(total):
        index, rest = [], flat
        for g in reversed(grid):
            index.append(rest % g)
            rest //= g
        yield tile_region(shape, tile, tuple(reversed(index)))
