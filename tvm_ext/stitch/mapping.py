"""Adaptive thread mapping (AStitch §3.3, §4.3 "Tensor Shape Adaptation").

A row reduction of ``rows`` rows of ``row_length`` elements is mapped either by *packing* or
by *splitting*:

* **split** when ``rows < blocks_per_wave`` and ``row_length > 1024``: each row is spread
  over ``split`` blocks (``split = min(ceil(row_length / 1024), blocks_per_wave // rows)``) whose
  partial results are combined across blocks;
* **pack** otherwise: ``threads_x`` threads share a row (the row length rounded up to a power of
  two, at least a warp, at most the block); *horizontal packing* puts
  ``rows_per_block = block_threads // threads_x`` rows in one block (fewer if that would leave
  SMs idle); *vertical packing* then folds row groups so that the grid fits one wave:
  ``grid = min(row_groups, blocks_per_wave)`` blocks, each looping over ``tasks_per_block``
  row groups.

Example (the paper's shapes, V100: 160 blocks of 1024 threads per wave)
-------
>>> row_mapping(750000, 32, load_device("v100")).kind, _.rows_per_block
('pack', 32)
>>> row_mapping(64, 30000, load_device("v100")).kind, _.split
('split', 2)
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware import DeviceSpec, occupancy

#: Block size AStitch launches with (§4.5: the largest block gives the fewest blocks per wave).
DEFAULT_BLOCK_THREADS = 1024
#: Row length above which a row may be split over several blocks (§4.3).
SPLIT_ROW_LENGTH = 1024


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class ThreadMapping:
    """How one dominant op's work is laid out on blocks and threads.

    Attributes
    ----------
    kind : str
        ``"pack"`` (whole rows per block), ``"split"`` (a row over several blocks) or
        ``"flat"`` (elementwise: contiguous elements per block).
    rows : int
        Independent rows (reduction results; for ``"flat"`` the element count).
    row_length : int
        Elements reduced per row (1 for ``"flat"``).
    threads_x : int
        Threads sharing one row (``threadIdx.x``).
    rows_per_block : int
        Rows per block at a time (horizontal packing, ``threadIdx.y``).
    split : int
        Blocks per row (1 unless ``kind == "split"``).
    grid : int
        Blocks launched.
    tasks_per_block : int
        Row groups (or element chunks) each block processes in turn (vertical packing).
    blocks_per_wave : int
        The wave size the mapping was fitted to.
    """

    kind: str
    rows: int
    row_length: int
    threads_x: int
    rows_per_block: int
    split: int
    grid: int
    tasks_per_block: int
    blocks_per_wave: int

    @property
    def threads_per_block(self) -> int:
        """Threads of one block (``threads_x * rows_per_block``)."""
        return self.threads_x * self.rows_per_block

    @property
    def row_groups(self) -> int:
        """Units of work before vertical packing (blocks an unpacked launch would need)."""
        if self.kind == "split":
            return self.rows * self.split
        if self.kind == "flat":
            return _ceil_div(self.rows, self.threads_per_block)
        return _ceil_div(self.rows, self.rows_per_block)

    @property
    def fits_one_wave(self) -> bool:
        """Whether every block of the grid is resident at once."""
        return self.grid <= self.blocks_per_wave


def blocks_per_wave(spec: DeviceSpec, threads: int, registers: int = 32, shared_bytes: int = 0) -> int:
    """Blocks of ``threads`` threads resident on the whole device at once (occupancy calculator)."""
    return occupancy(spec, threads, registers, shared_bytes).blocks_per_wave


def _vertical(groups: int, wave: int) -> tuple[int, int]:
    """(grid, tasks per block) folding ``groups`` units into at most ``wave`` blocks."""
    grid = max(1, min(groups, wave))
    tasks = _ceil_div(groups, grid)
    return _ceil_div(groups, tasks), tasks


def row_mapping(rows: int, row_length: int, spec: DeviceSpec, *, block_threads: int = DEFAULT_BLOCK_THREADS,
                wave: int | None = None, allow_split: bool = True, fold: bool = True) -> ThreadMapping:
    """Map a row reduction with the paper's split-or-pack rule.

    Parameters
    ----------
    rows, row_length : int
        Shape of the reduction (``rows`` results of ``row_length`` elements each).
    spec : DeviceSpec
        The device.
    block_threads : int
        Threads per block to pack rows into (1024, as in the paper).
    wave : int, optional
        Blocks per wave; default: occupancy of ``block_threads`` threads with 32 registers.
    allow_split : bool
        Whether task splitting may be chosen.
    fold : bool
        Apply vertical packing (grid within one wave).
    """
    if rows < 1 or row_length < 1:
        raise ValueError(f"row mapping needs positive sizes, got rows={rows}, row_length={row_length}")
    block_threads = min(block_threads, spec.max_threads_per_block)
    wave = wave if wave is not None else blocks_per_wave(spec, block_threads)
    if allow_split and rows < wave and row_length > SPLIT_ROW_LENGTH:
        split = min(_ceil_div(row_length, SPLIT_ROW_LENGTH), wave // rows)
        if split >= 2:
            return ThreadMapping("split", rows, row_length, block_threads, 1, split, rows * split, 1, wave)
    threads_x = min(block_threads, max(spec.warp_size, _next_pow2(row_length)))
    rows_per_block = max(1, block_threads // threads_x)
    # horizontal packing must not leave SMs idle that a smaller packing would fill
    while rows_per_block > 1 and _ceil_div(rows, rows_per_block) < spec.sm_count:
        rows_per_block //= 2
    groups = _ceil_div(rows, rows_per_block)
    grid, tasks = _vertical(groups, wave) if fold else (groups, 1)
    return ThreadMapping("pack", rows, row_length, threads_x, rows_per_block, 1, grid, tasks, wave)


def flat_mapping(elements: int, spec: DeviceSpec, *, threads_x: int, rows_per_block: int = 1,
                 wave: int | None = None, fold: bool = True) -> ThreadMapping:
    """Map an elementwise op: contiguous chunks of ``threads_x * rows_per_block`` elements per task."""
    if elements < 1:
        raise ValueError(f"flat mapping needs a positive element count, got {elements}")
    threads = threads_x * rows_per_block
    wave = wave if wave is not None else blocks_per_wave(spec, threads)
    groups = _ceil_div(elements, threads)
    grid, tasks = _vertical(groups, wave) if fold else (groups, 1)
    return ThreadMapping("flat", elements, 1, threads_x, rows_per_block, 1, grid, tasks, wave)


__all__ = ["DEFAULT_BLOCK_THREADS", "SPLIT_ROW_LENGTH", "ThreadMapping", "blocks_per_wave", "flat_mapping",
           "row_mapping"]
