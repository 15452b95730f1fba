"""Welder (OSDI'23): tile graphs, graph connecting, tile kernels, and the ``tilegraph`` generator.

* analysis: :class:`TileGraph` models a convex sub-graph of an :class:`~tvm_ext.graph.OpGraph` as
  Welder's tile graph (§3.1: connect levels, propagation, traffic, footprint per level) and
  :func:`enumerate_tiles` ranks its output tiles Roller-style (§3.2, §4.1);
* planning: :func:`connect_graph` connects edges where the cost model prices one kernel lower
  (Fig. 7) and :func:`plan_group` gives each group its :class:`TilePlan`;
* kernels: :func:`build_tile_schedule` realizes a plan (register connection inlined, shared
  connection computed per tile in shared memory; float16 GEMM stages on tensor cores with WMMA
  fragments, :mod:`~tvm_ext.tilegraph.tensor_core`; other arithmetic SIMT);
* :class:`TileGraphGenerator` offers the connected groups to the selector (presets ``tilegraph``
  and ``full``).

Example
-------
>>> tg = TileGraph(graph, [0, 1]); tg.set_connect("C", "shared")
>>> enumerate_tiles(tg, "tvm_ext/h100")[0].output_tile
(32, 128)
"""
from .enumerate import (ASSUMED_REGISTERS_PER_THREAD, ASSUMED_THREADS_PER_BLOCK, DEFAULT_BRANCH, DEFAULT_MAX_VISITS,
                        DEFAULT_TOP_K, MMA_FRAGMENT, TileCandidate, coalesced_run, enumerate_tiles,
                        uncoalesced_extra)
from .reduction import TENSOR_CORE_DTYPES, MatmulLike, matmul_like, matmul_nodes, rstep_regions
from .plans import TilePlan
from .tensor_core import WmmaFit, wmma_fit
from .schedule import TileScheduleError, build_tile_schedule
from .block_work import BlockWork, TileWork, gcd_threads, tile_work
from .connect import ConnectedGroup, connect_graph, tile_candidate
from .planning import edge_level, plan_group, whole_reduction_plan
from .generator import TileGraphGenerator
from .tile_graph import (TENSOR_CORE_ALIGNMENT_BYTES, ConnectLevel, Edge, KernelTile, NonConvexError, TileConfig,
                         TileGraph, TileGraphError, UnknownEdgeError)

__all__ = [
    "ASSUMED_REGISTERS_PER_THREAD", "ASSUMED_THREADS_PER_BLOCK", "DEFAULT_BRANCH", "DEFAULT_MAX_VISITS",
    "DEFAULT_TOP_K", "MMA_FRAGMENT", "TileCandidate", "coalesced_run", "enumerate_tiles", "uncoalesced_extra",
    "TENSOR_CORE_DTYPES", "MatmulLike", "matmul_like", "matmul_nodes", "rstep_regions",
    "TENSOR_CORE_ALIGNMENT_BYTES", "ConnectLevel", "Edge", "KernelTile", "NonConvexError", "TileConfig",
    "TileGraph", "TileGraphError", "UnknownEdgeError", "TilePlan", "TileScheduleError", "build_tile_schedule",
    "BlockWork", "gcd_threads", "tile_work", "TileWork", "WmmaFit", "wmma_fit", "ConnectedGroup", "connect_graph", "plan_group", "tile_candidate",
    "whole_reduction_plan", "edge_level",
    "TileGraphGenerator",
]
