"""The plan of one tile-graph kernel (what :class:`~tvm_ext.tilegraph.generator.TileGraphGenerator` decided).

A :class:`TilePlan` travels with the fused PrimFunc of a connected sub-graph (Welder's level-0
sub-graph) and says how the schedule builder (:mod:`tvm_ext.tilegraph.schedule`) builds it:

* ``output_tile`` — the tile of the kernel's output one thread block computes (Welder's top-level
  tile, chosen by :func:`~tvm_ext.tilegraph.enumerate_tiles`), one extent per spatial iterator
  of the output block; every other output the kernel stores has the output's shape and the
  same tile;
* ``threads`` — threads per block (``threads // 32`` warps on ``threadIdx.y``, a warp on
  ``threadIdx.x``), from the gcd rule of Welder §4.1;
* ``inline`` — blocks inlined into their consumers (register connection);
* every other block but the output block is computed per tile into **shared memory** (shared
  connection): ``compute_at`` at the block loop, ``set_scope("shared")``;
* ``tensor_core`` — contraction blocks built on WMMA fragments
  (:mod:`tvm_ext.tilegraph.tensor_core`); other contractions run one output per thread;
* ``padded`` — contraction blocks padded to whole WMMA fragments before tiling
  (:mod:`~tvm_ext.tilegraph.padding`), so that they run on tensor cores at extents like ViT's 197
  tokens; ``padding_flops`` is what the padding computes and discards;
* ``kstep`` — the tensor-core stages stage their operands from global memory that many
  reduction rows at a time (0: the whole reduction of the tile at once), for tiles whose whole
  operands exceed shared memory (:func:`~tvm_ext.tilegraph.tensor_core.stepped_reduction`);
* ``dynamic_shared`` — the shared buffers live in dynamic shared memory (``shared.dyn``), for a
  kernel whose shared memory exceeds the static 48 KiB (up to the device's opt-in limit).

The remaining fields are what the planner measured, for reports and pricing: the kernel's grid,
its shared footprint, its modelled global traffic (Welder's ``MemTraffic`` of the tile) and the
connect level of every edge between its member nodes.

Example
-------
>>> plan = TilePlan(output_tile=(16, 128), threads=512, inline=("T_softmax_exp",), grid=6144,
...                 shared_bytes=8320, traffic_bytes=276824064, levels=(("C", "shared"),))
>>> plan.summary()
'tilegraph: tile 16x128, grid 6144 x 512 threads, 8.1 KiB shared, 1 inlined'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class TilePlan:
    """One tile-graph kernel (see the module docstring)."""

    generator: ClassVar[str] = "tilegraph"

    output_tile: tuple[int, ...]
    threads: int
    inline: tuple[str, ...] = ()
    grid: int = 0
    shared_bytes: int = 0
    traffic_bytes: int = 0
    levels: tuple[tuple[str, str], ...] = ()
    #: ``"simt_contraction"`` when a contraction of the kernel runs one output per thread,
    #: ``"wmma_tile"`` when every contraction runs on tensor cores, else ``"simt"``
    #: (:class:`~tvm_ext.select.candidate.CodePath`).
    code_path: str = "simt"
    tensor_core: tuple[str, ...] = ()
    #: The shared buffers are dynamic shared memory (one pool, up to the opt-in limit per block):
    #: the plan's ``shared_bytes`` exceed the static limit.
    dynamic_shared: bool = False
    #: Contraction blocks padded to whole WMMA fragments before tiling.
    padded: tuple[str, ...] = ()
    #: Flops the padding adds (zero rows and columns computed and discarded), priced with the kernel.
    padding_flops: int = 0
    #: Reduction rows the tensor-core stages stage at a time (0: whole).
    kstep: int = 0

    @property
    def shared_scope(self) -> str:
        """The storage scope of the kernel's shared buffers."""
        return "shared.dyn" if self.dynamic_shared else "shared"

    def to_json(self) -> dict[str, Any]:
        """JSON form (inverse: :meth:`from_json`)."""
        return {"output_tile": list(self.output_tile), "threads": self.threads, "inline": list(self.inline),
                "grid": self.grid, "shared_bytes": self.shared_bytes, "traffic_bytes": self.traffic_bytes,
                "levels": [list(x) for x in self.levels], "code_path": self.code_path,
                "tensor_core": list(self.tensor_core), "dynamic_shared": self.dynamic_shared,
                "padded": list(self.padded), "padding_flops": self.padding_flops, "kstep": self.kstep}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TilePlan":
        """Inverse of :meth:`to_json`."""
        return cls(output_tile=tuple(int(x) for x in data["output_tile"]), threads=int(data["threads"]),
                   inline=tuple(str(x) for x in data.get("inline", ())), grid=int(data.get("grid", 0)),
                   shared_bytes=int(data.get("shared_bytes", 0)), traffic_bytes=int(data.get("traffic_bytes", 0)),
                   levels=tuple((str(t), str(lv)) for t, lv in data.get("levels", ())),
                   code_path=str(data.get("code_path", "simt")),
                   tensor_core=tuple(str(x) for x in data.get("tensor_core", ())),
                   dynamic_shared=bool(data.get("dynamic_shared", False)),
                   padded=tuple(str(x) for x in data.get("padded", ())),
                   padding_flops=int(data.get("padding_flops", 0)), kstep=int(data.get("kstep", 0)))

    def measured_config(self) -> dict[str, Any]:
        """What a measurement of this kernel is keyed by: the schedule's choices."""
        config = {"output_tile": list(self.output_tile), "threads": self.threads, "inline": list(self.inline),
                  "tensor_core": list(self.tensor_core)}
        if self.padded:         # only then: unpadded kernels keep the keys they were measured under
            config["padded"] = list(self.padded)
        if self.kstep:
            config["kstep"] = self.kstep
        return config

    def summary(self) -> str:
        """One line for reports."""
        tile = "x".join(map(str, self.output_tile))
        tc = f", {len(self.tensor_core)} on tensor cores" if self.tensor_core else ""
        tc += f" ({len(self.padded)} padded to whole fragments)" if self.padded else ""
        tc += f", operands staged {self.kstep} reduction rows at a time" if self.kstep else ""
        return (f"tilegraph: tile {tile}, grid {self.grid} x {self.threads} threads, "
                f"{self.shared_bytes / 1024:.1f} KiB shared, {len(self.inline)} inlined{tc}")


__all__ = ["TilePlan"]
