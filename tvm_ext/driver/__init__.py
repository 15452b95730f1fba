"""Presets and the one build driver used by ``tvm_ext.compile``, ``tvm.compile`` pipelines, the
CLI, the report, the CPU oracle and the benchmarks.

* :mod:`.presets` — :class:`Preset` (generators, selector, rest policy) and the registry;
* :mod:`.stages` — the stages of a preset (graph, schedule, lower) and :func:`build`;
* :mod:`.apply_plans` — the schedule stage's plan builder (:class:`ApplyPlans`);
* :mod:`.pipeline` — registration as named Relax pipelines, :func:`compile`.
"""
from __future__ import annotations

from .apply_plans import ApplyPlans
from .pipeline import compile, load_module, register_pipelines, register_preset_pipeline  # noqa: A004
from .presets import (DEFAULT_PRESET, Preset, active_preset, get_preset, list_presets, register_builtin_presets,
                      register_preset, use_preset)
from .stages import (CUDA_GRAPH_CONFIG, StagedBuild, StagePasses, build, cost_model, graph_passes, preset_passes,
                     preset_pipeline)

__all__ = ["ApplyPlans", "CUDA_GRAPH_CONFIG", "DEFAULT_PRESET", "Preset", "StagePasses", "StagedBuild",
           "active_preset", "build", "compile", "cost_model", "get_preset", "graph_passes", "list_presets", "load_module",
           "preset_passes", "preset_pipeline", "register_builtin_presets", "register_pipelines",
           "register_preset", "register_preset_pipeline", "use_preset"]
