"""Resource-aware launch configuration (AStitch §4.5, "assume-relax-apply").

A kernel with a grid barrier must have no more blocks than fit on the device at once, but the
blocks per wave depend on the registers the compiler will use, known only after compiling.
So: *assume* 32 registers per thread and compute the blocks per SM from the planned block
size and shared memory; *relax* the register bound to the largest count that still gives
that many blocks per SM (it grows when shared memory or warp slots, not registers, limit);
*apply* it with ``__launch_bounds__(threads, blocks_per_sm)`` so the compiler keeps to it.

Example
-------
>>> cfg = launch_config(load_device("v100"), 1024, shared_bytes=0)
>>> cfg.blocks_per_sm, cfg.blocks_per_wave, cfg.register_cap
(2, 160, 32)
"""
from __future__ import annotations

from dataclasses import dataclass

from ..hardware import DeviceSpec, max_registers_for_blocks, occupancy
from ..select.analytic import ASSUMED_REGISTERS


@dataclass(frozen=True)
class LaunchConfig:
    """Launch shape and register bound of one stitched kernel.

    Attributes
    ----------
    threads_per_block : int
    shared_bytes : int
        Planned shared memory per block.
    assumed_registers : int
        The register count assumed first (32).
    blocks_per_sm : int
        Resident blocks per SM at the assumed count (the target the cap preserves).
    blocks_per_wave : int
        ``blocks_per_sm * sm_count``: the largest grid a grid barrier allows.
    register_cap : int
        The relaxed bound: the most registers per thread that keep ``blocks_per_sm``.
    limiter : str
        What limits ``blocks_per_sm`` at the assumed count.
    """

    threads_per_block: int
    shared_bytes: int
    assumed_registers: int
    blocks_per_sm: int
    blocks_per_wave: int
    register_cap: int
    limiter: str


def launch_config(spec: DeviceSpec, threads_per_block: int, shared_bytes: int = 0,
                  assumed_registers: int = ASSUMED_REGISTERS) -> LaunchConfig:
    """Assume-relax-apply for one kernel (see the module docstring).

    Raises
    ------
    ValueError
        The block cannot run on ``spec`` at all (too many threads or too much shared memory).
    """
    occ = occupancy(spec, threads_per_block, assumed_registers, shared_bytes)
    cap = max_registers_for_blocks(spec, threads_per_block, occ.blocks_per_sm)
    cap = min(cap, spec.max_registers_per_thread)
    # the cap was found for zero shared memory; keep it only if shared memory still allows the blocks
    while cap > assumed_registers and occupancy(spec, threads_per_block, cap, shared_bytes).blocks_per_sm \
            < occ.blocks_per_sm:
        cap -= 1
    return LaunchConfig(threads_per_block, shared_bytes, assumed_registers, occ.blocks_per_sm,
                        occ.blocks_per_wave, cap, occ.limiter)


__all__ = ["ASSUMED_REGISTERS", "LaunchConfig", "launch_config"]
