"""Public pass namespace of tvm_ext (re-exports; each pass lives with its technique, or in the frontend when several use it).

Example
-------
>>> import tvm_ext.transform as T
>>> mod = T.StitchMemoryIntensive()(legalized_mod)
"""
from __future__ import annotations

from .fission import Fission
from .frontend.split_slices import SplitToSlices
from .stitch.relax_pass import StitchMemoryIntensive
from .tir.grid_sync import InsertGridSync
from .tir.launch_params import AnnotateCooperativeLaunch, ApplyLaunchBounds

__all__ = ["AnnotateCooperativeLaunch", "ApplyLaunchBounds", "Fission", "InsertGridSync", "SplitToSlices",
           "StitchMemoryIntensive"]
