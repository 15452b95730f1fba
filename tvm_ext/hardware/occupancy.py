"""Theoretical occupancy of a kernel launch, following the CUDA Occupancy Calculator.

The rules are those of ``cudaOccMaxActiveBlocksPerMultiprocessor`` in the CUDA toolkit's
``cuda_occupancy.h`` (CC 7.0 and newer, default shared-memory carveout preference):

* warps: a block occupies ``ceil(threads / warp_size)`` warp slots of ``max_warps_per_sm``;
* registers: each warp gets ``round_up(regs_per_thread * warp_size, register_allocation_unit)``
  registers; the register file is split evenly over ``sub_partitions_per_sm`` partitions and
  a warp lives in one, so ``floor(regs_per_partition / regs_per_warp) * partitions`` warps fit;
* shared memory: a block takes ``round_up(shared + reserved, shared_memory_allocation_unit)``
  bytes, where ``reserved`` is the 1 KiB per block the driver keeps on CC 8.0+, out of
  ``shared_memory_per_sm`` (the largest carveout);
* blocks: at most ``max_blocks_per_sm`` resident blocks.

A launch that cannot run at all (too many threads, registers per thread or per block, or more
shared memory than the opt-in maximum) raises ``ValueError``; it never yields 0 blocks.
Shared memory above ``max_shared_memory_per_block`` but within the opt-in maximum is allowed
(it must be dynamic shared memory with the opt-in attribute set, which TVM's CUDA runtime does
for ``shared.dyn`` buffers); :attr:`Occupancy.needs_optin` reports it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .device_spec import DeviceSpec, FrozenMap

Limiter = Literal["warps", "registers", "shared_memory", "blocks"]
#: Order used to pick :attr:`Occupancy.limiter` when several limits tie.
LIMITER_ORDER: tuple[Limiter, ...] = ("warps", "registers", "shared_memory", "blocks")


@dataclass(frozen=True)
class Occupancy:
    """Result of :func:`occupancy` for one launch configuration on one device.

    Attributes
    ----------
    blocks_per_sm : int
        Resident blocks per SM (always >= 1).
    warps_per_sm : int
        Resident warps per SM (``blocks_per_sm`` x warps per block).
    occupancy : float
        ``warps_per_sm / max_warps_per_sm``.
    limiter : str
        The resource that bounds ``blocks_per_sm``: ``"warps"`` (warp/thread slots of the SM),
        ``"registers"``, ``"shared_memory"`` or ``"blocks"`` (resident-block cap). On a tie, the
        first in :data:`LIMITER_ORDER`.
    limiters : tuple of str
        Every resource whose limit equals ``blocks_per_sm``.
    block_limits : Mapping
        Blocks per SM allowed by each resource; a resource the block does not use is absent.
    registers_per_block : int
        Registers allocated to one block (after per-warp rounding).
    shared_bytes_allocated_per_block : int
        Shared memory allocated to one block (request + reserve, rounded to the allocation unit).
    needs_optin : bool
        Whether the block needs more shared memory than the default per-block limit.
    sm_count : int
        SMs of the device, for :attr:`blocks_per_wave`.
    """

    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float
    limiter: Limiter
    limiters: tuple[Limiter, ...]
    block_limits: Mapping[str, int]
    registers_per_block: int
    shared_bytes_allocated_per_block: int
    needs_optin: bool
    sm_count: int

    @property
    def blocks_per_wave(self) -> int:
        """Blocks the whole device holds at once: ``blocks_per_sm * sm_count``."""
        return self.blocks_per_sm * self.sm_count

    def waves(self, num_blocks: int) -> int:
        """Number of waves (``ceil(num_blocks / blocks_per_wave)``) a grid of ``num_blocks`` needs."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        return -(-num_blocks // self.blocks_per_wave)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def occupancy(
    spec: DeviceSpec,
    threads_per_block: int,
    registers_per_thread: int = 32,
    shared_bytes_per_block: int = 0,
) -> Occupancy:
    """Compute the theoretical occupancy of a launch on ``spec``.

    Parameters
    ----------
    spec : DeviceSpec
        The device.
    threads_per_block : int
        Threads per block (need not be a multiple of the warp size).
    registers_per_thread : int
        Registers per thread as reported by ptxas (0 means the kernel uses none).
    shared_bytes_per_block : int
        Static plus dynamic shared memory per block, in bytes.

    Returns
    -------
    Occupancy

    Raises
    ------
    ValueError
        If the launch is invalid on this device: threads per block outside
        ``1..max_threads_per_block``, registers per thread above ``max_registers_per_thread``,
        registers per block above ``max_registers_per_block``, or shared memory above
        ``max_shared_memory_per_block_optin``.
    """
    _check_int("threads_per_block", threads_per_block, 1)
    _check_int("registers_per_thread", registers_per_thread, 0)
    _check_int("shared_bytes_per_block", shared_bytes_per_block, 0)
    if threads_per_block > spec.max_threads_per_block:
        raise ValueError(
            f"{threads_per_block} threads per block exceeds the {spec.max_threads_per_block} allowed on {spec.name}"
        )
    if registers_per_thread > spec.max_registers_per_thread:
        raise ValueError(
            f"{registers_per_thread} registers per thread exceeds the {spec.max_registers_per_thread} allowed on "
            f"{spec.name}"
        )
    if shared_bytes_per_block > spec.max_shared_memory_per_block_optin:
        raise ValueError(
            f"{shared_bytes_per_block} bytes of shared memory per block exceeds the opt-in maximum of "
            f"{spec.max_shared_memory_per_block_optin} bytes on {spec.name}"
        )

    warps_per_block = -(-threads_per_block // spec.warp_size)
    limits: dict[str, int] = {"warps": spec.max_warps_per_sm // warps_per_block, "blocks": spec.max_blocks_per_sm}

    registers_per_warp = _round_up(registers_per_thread * spec.warp_size, spec.register_allocation_unit)
    registers_per_block = registers_per_warp * warps_per_block
    # The hardware checks the per-block register limit as if warps were spread over all
    # sub-partitions, i.e. with the warp count rounded up to a multiple of the partition count.
    registers_checked = registers_per_warp * _round_up(warps_per_block, spec.sub_partitions_per_sm)
    if max(registers_per_block, registers_checked) > spec.max_registers_per_block:
        raise ValueError(
            f"{threads_per_block} threads x {registers_per_thread} registers needs {registers_checked} registers per "
            f"block (allocated per warp in units of {spec.register_allocation_unit}), more than the "
            f"{spec.max_registers_per_block} allowed on {spec.name}"
        )
    if registers_per_warp > 0:
        per_partition = spec.registers_per_sm // spec.sub_partitions_per_sm
        warps_by_registers = (per_partition // registers_per_warp) * spec.sub_partitions_per_sm
        limits["registers"] = warps_by_registers // warps_per_block

    shared_allocated = _round_up(
        shared_bytes_per_block + spec.reserved_shared_memory_per_block, spec.shared_memory_allocation_unit
    )
    if shared_allocated > 0:
        limits["shared_memory"] = spec.shared_memory_per_sm // shared_allocated

    blocks = min(limits.values())
    if blocks == 0:  # unreachable for a validated spec; guards against inconsistent hand-made specs
        raise ValueError(f"launch cannot fit on one SM of {spec.name}: per-resource block limits {limits}")
    limiters = tuple(name for name in LIMITER_ORDER if limits.get(name) == blocks)
    warps = blocks * warps_per_block
    return Occupancy(
        blocks_per_sm=blocks,
        warps_per_sm=warps,
        occupancy=warps / spec.max_warps_per_sm,
        limiter=limiters[0],
        limiters=limiters,
        block_limits=FrozenMap(limits),
        registers_per_block=registers_per_block,
        shared_bytes_allocated_per_block=shared_allocated,
        needs_optin=shared_bytes_per_block > spec.max_shared_memory_per_block,
        sm_count=spec.sm_count,
    )


def max_registers_for_blocks(spec: DeviceSpec, threads_per_block: int, blocks_per_sm: int) -> int:
    """Largest registers-per-thread count that still lets ``blocks_per_sm`` blocks reside.

    Useful for a register cap (``__launch_bounds__`` / ``maxrregcount``). Raises
    ``ValueError`` if even 0 registers cannot give that many blocks (warp or block slots).
    """
    _check_int("blocks_per_sm", blocks_per_sm, 1)
    base = occupancy(spec, threads_per_block, 0)
    if base.blocks_per_sm < blocks_per_sm:
        raise ValueError(
            f"{blocks_per_sm} blocks of {threads_per_block} threads cannot reside on one SM of {spec.name} "
            f"(at most {base.blocks_per_sm}, limited by {base.limiter})"
        )
    low, high = 0, spec.max_registers_per_thread
    while low < high:  # largest r with blocks(r) >= blocks_per_sm; blocks(r) is non-increasing in r
        mid = (low + high + 1) // 2
        try:
            fits = occupancy(spec, threads_per_block, mid).blocks_per_sm >= blocks_per_sm
        except ValueError:
            fits = False
        if fits:
            low = mid
        else:
            high = mid - 1
    return low


__all__ = ["LIMITER_ORDER", "Limiter", "Occupancy", "max_registers_for_blocks", "occupancy"]
