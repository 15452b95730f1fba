"""Analysis layer: access maps, dependency kinds, tile propagation, traffic and footprint.

Example
-------
>>> from tvm_ext.analysis import propagate, traffic
>>> traffic(graph, [0, 1], (4, 128)).global_bytes / 2**20     # Welder §2
840.0
"""
from .access_map import Access, AccessMap, edge_kinds, func_access_maps, node_access_maps
from .dependency import DependencyKind, classify_access
from .footprint import BestFitAllocator, Buffer, FootprintReport, Placement, footprint, plan_best_fit, tile_buffers
from .propagate import TileSpec, escaping_outputs, group_members, output_tile_regions, propagate
from .region import Region, element_bytes, iter_tiles, num_tiles, tile_grid, tile_region
from .traffic import TensorTraffic, TrafficReport, group_traffic_default, min_traffic, traffic

__all__ = [
    "Access", "AccessMap", "edge_kinds", "func_access_maps", "node_access_maps",
    "DependencyKind", "classify_access",
    "BestFitAllocator", "Buffer", "FootprintReport", "Placement", "footprint", "plan_best_fit", "tile_buffers",
    "TileSpec", "escaping_outputs", "group_members", "output_tile_regions", "propagate",
    "Region", "element_bytes", "iter_tiles", "num_tiles", "tile_grid", "tile_region",
    "TensorTraffic", "TrafficReport", "group_traffic_default", "min_traffic", "traffic",
]
