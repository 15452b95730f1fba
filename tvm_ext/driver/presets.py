"""Presets: which generators propose kernels, how the selector picks, what happens to the rest.

A preset with no generators is TVM's own CUDA pipeline (``baseline``). Any other preset runs the
selection spine (:mod:`tvm_ext.driver.stages`): its generators' candidates go to its selector,
and the call nodes no chosen candidate covers are handled by its *rest* policy (``"fuseops"``:
TVM's ``FuseOps``, as the baseline would; ``"none"``: the selector covers everything).

Example
-------
>>> get_preset("stitch").generators
('stitch', 'dlight')
>>> [p.name for p in list_presets() if p.implemented]
['baseline', 'stitch', 'cutlass', 'full', 'orchestrate', 'subprogram', 'tilegraph']
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from dataclasses import dataclass
from typing import Iterator

from ..errors import PresetError
from ..select.budget import PlanningBudget

#: The preset of ``tvm_ext.compile``, ``inspect``, the ``"tvm_ext"`` pipeline and the CLI: ``full``,
#: modelled no slower than baseline, stitch or cutlass on every seed model (bench/modelled/).
DEFAULT_PRESET = "full"
_ACTIVE_PRESET: contextvars.ContextVar[str | None] = contextvars.ContextVar("tvm_ext_preset", default=None)
SELECTORS = ("priority", "blp")
#: The tile graph's own planning budget, in its own unit: a tile configuration priced, a schedule
#: built and a group asked counting :data:`~tvm_ext.tilegraph.planning.SCHEDULE_UNITS` and
#: :data:`~tvm_ext.tilegraph.planning.GROUP_UNITS` (``planning_units``). *Measured* on this
#: project's 2-core machine, two builds at a time (13 seed models' ``full`` builds): 0.13 ms a
#: unit on average, so the ceiling of 150000 units is about 20 s, where the old 30 s bound by the
#: clock; MobileNet-V2's and the LSTM's units cost 0.3 ms (44-49 s alone, 52 s two builds at a
#: time), hence a safety net of 90 s, which the work binds before unless the machine is more than
#: about 2x slower. 1000 per node, at least 20000, below it. *Assumed*: the amounts, a bound on
#: compile time (issue 38's 120 s per ``inspect``), the seconds a safety net.
TILE_GRAPH_BUDGET = PlanningBudget(work_per_node=1000.0, min_work=20000.0, max_work=150000.0, max_seconds=90.0)
#: Orchestrate's convex sets, in its unit (:func:`tvm_ext.orchestrate.generator.planning_units`: a
#: stitched node, a set dlight builds as 5). *Measured* (``scripts/planning_units.py``): 4.5-7.0 ms
#: a unit on 10 seed models, the LSTM 10.7, so the ceiling of 8000 units is 36-56 s here (the LSTM
#: 86 s). No seed model reaches it (the ``orchestrate`` preset's cap of 1000 distinct kernels
#: binds first on 6 of the 8 whose sets the old 30 s cut: modelled 0-11% faster than with the 30 s);
#: ``full``'s sets of up to 4 nodes stay below 4500. The 180 s a safety net that two builds at a
#: time on this machine stay within. *Assumed*: the amounts, a bound on compile time.
ORCHESTRATE_BUDGET = PlanningBudget(work_per_node=100.0, min_work=1000.0, max_work=8000.0, max_seconds=180.0)
#: Subprogram's pieces, in its unit (statements designed, a tensor-core stage as
#: :data:`~tvm_ext.subprogram.generator.TENSOR_CORE_STAGE_UNITS`). *Measured*: 6-18 ms of designing
#: a unit on 11 seed models, so 2000 units is 13-36 s here; the seed models need 300-1800 (DETR-R50
#: 2400, where the old 30 s stopped it after 44.8 s of ``full``: one 238-statement piece takes 11-14 s).
#: *Assumed*: the amounts, a bound on compile time; 60 s a safety net.
SUBPROGRAM_BUDGET = PlanningBudget(work_per_node=10.0, min_work=500.0, max_work=2000.0, max_seconds=60.0)
#: Every preset's budget unless it sets its own: :class:`PlanningBudget`'s defaults (stitch and any
#: generator without its own), the searching generators' their own, in their own units: where each
#: stops is the same on any machine and under any load.
DEFAULT_BUDGET = PlanningBudget(per_generator=(("tilegraph", TILE_GRAPH_BUDGET),
                                               ("orchestrate", ORCHESTRATE_BUDGET),
                                               ("orchestrate_small", ORCHESTRATE_BUDGET),
                                               ("subprogram", SUBPROGRAM_BUDGET)))
#: ``full``'s: subprogram's ceiling at 1000 units. Where ``full`` runs it beside CUTLASS and the tile
#: graph it is selected for 1 kernel of the 20 seed models (Swin-T), and its 2000 units took 31-44 s
#: of DETR-R50's and Swin-T's builds, over the 120 s issue 38 allows. *Assumed*: a bound on compile
#: time; what it costs in modelled time is measured against an unlimited build (README, "Compile time").
FULL_BUDGET = DEFAULT_BUDGET.with_generator("subprogram", dataclasses.replace(SUBPROGRAM_BUDGET, max_work=1000.0))
REST_POLICIES = ("none", "fuseops")


@dataclass(frozen=True)
class Preset:
    """A named combination of techniques.

    Parameters
    ----------
    name : str
        Registry key, e.g. ``"baseline"``.
    description : str
        One line for ``tvm-ext presets`` and the README table.
    generators : tuple of str
        Registered generator names in priority order; empty for TVM's own pipeline.
    selector : str
        ``"priority"`` (candidates in generator order, first come first served) or ``"blp"``.
    rest : str
        What covers the call nodes the selection leaves: ``"fuseops"`` or ``"none"``.
    tir_pipeline : str
        The TIR pipeline ``tvm.compile`` must use for this preset's kernels: ``"tvm_ext"`` (every
        preset but ``baseline``) adds barriers and index guards TVM's lowering misses and gives
        kernels with grid barriers cooperative launch and launch bounds; ``"default"`` is TVM's.
    techniques : tuple of str
        Technique names for listings (papers the preset reproduces).
    implemented : bool
        False for presets that are announced but not built yet.
    cuda_graph : bool
        Capture the static parts of ``main`` in CUDA graphs (TVM's ``RewriteCUDAGraph``) and
        price launches as graph replays. Every built-in preset but ``baseline`` (TVM's own
        pipeline as a user gets it): a static-shape model at batch 1 is tens to hundreds of
        launches of a few microseconds each. Kernels with a grid barrier are captured too (a
        graph's kernel node has a cooperative attribute: CUDA driver API, ``CUkernelNodeAttrValue``,
        since CUDA 11.1; not yet run on a GPU here).
    recompute : bool
        Offer candidates that recompute cheap shared nodes (Korch; :mod:`tvm_ext.select.recompute`);
        needs the ``"blp"`` selector.
    fission : bool
        Split operators into primitives first (Korch's fission, :class:`tvm_ext.fission.Fission`)
        where the cost model prices the selection lower than without it
        (:class:`~tvm_ext.driver.graph_choice.CheaperOf`, whole module).
    horizontal : bool
        Combine independent GEMMs sharing an input (SOUFFLE's horizontal transform,
        :class:`tvm_ext.subprogram.HorizontalMatmul`) where the cost model prices the selection
        lower than without it (:class:`~tvm_ext.driver.graph_choice.CheaperOf`, whole module).
    check_kernels : bool
        Emulate every kernel a generator schedules on the CPU (its lowered device code with CUDA's
        semantics, :func:`~tvm_ext.checks.emulate_function`) before it is used: a kernel with
        findings goes to dlight and the selection is re-run without it, as a kernel that fails to
        lower is. Seconds per kernel; ``tvm-ext compile --check-kernels``.
    ptxas : bool
        After the schedule stage, compile the kernels once with ``ptxas -v``
        (:mod:`~tvm_ext.driver.ptxas_facts`): each kernel is priced with its spills, and a
        cost-based selection whose chosen kernels spill is run once more with their spills priced.
        2-4 s a seed model; on in every built-in preset.
    budget : PlanningBudget
        What each searching generator (tilegraph, orchestrate, subprogram) may spend planning one
        function, scaled by its call nodes (:mod:`tvm_ext.select.budget`); when it is spent the
        generator hands over the candidates it has and the selection report says so.
    """

    name: str
    description: str
    generators: tuple[str, ...] = ()
    selector: str = "priority"
    rest: str = "none"
    tir_pipeline: str = "default"
    techniques: tuple[str, ...] = ()
    implemented: bool = True
    cuda_graph: bool = False
    recompute: bool = False
    fission: bool = False
    horizontal: bool = False
    check_kernels: bool = False
    ptxas: bool = True
    budget: PlanningBudget = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if self.recompute and self.selector != "blp":
            raise PresetError(f"preset '{self.name}': recompute needs the 'blp' selector (a priority selector "
                              "takes disjoint kernels only)")
        if self.selector not in SELECTORS:
            raise PresetError(f"preset '{self.name}': selector must be one of {SELECTORS}, got {self.selector!r}")
        if self.rest not in REST_POLICIES:
            raise PresetError(f"preset '{self.name}': rest must be one of {REST_POLICIES}, got {self.rest!r}")

    @property
    def uses_spine(self) -> bool:
        """Whether the preset selects kernels (anything but TVM's own pipeline)."""
        return bool(self.generators)


_PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset, override: bool = False) -> Preset:
    """Add a preset to the registry and register its ``tvm_ext.<name>`` Relax pipeline."""
    if preset.name in _PRESETS and not override:
        raise PresetError(f"preset '{preset.name}' is already registered")
    _PRESETS[preset.name] = preset
    from .pipeline import register_preset_pipeline

    register_preset_pipeline(preset.name)
    return preset


def unregister_preset(name: str) -> None:
    """Remove a preset (tests register temporary ones); its ``tvm_ext.<name>`` pipeline stays
    registered and fails with the unknown-preset error."""
    _PRESETS.pop(name, None)


def list_presets() -> list[Preset]:
    """All registered presets, implemented or not."""
    return list(_PRESETS.values())


def get_preset(name: str | Preset) -> Preset:
    """Look up an implemented preset (a ``Preset`` is returned as it is); a clear error names
    what exists."""
    if isinstance(name, Preset):
        if not name.implemented:
            raise PresetError(f"preset '{name.name}' is not implemented yet")
        return name
    available = sorted(p.name for p in _PRESETS.values() if p.implemented)
    if name not in _PRESETS:
        raise PresetError(f"unknown preset '{name}'; available presets: {', '.join(available)}")
    preset = _PRESETS[name]
    if not preset.implemented:
        raise PresetError(f"preset '{name}' ({preset.description}) is not implemented yet; "
                          f"available presets: {', '.join(available)}")
    return preset


@contextlib.contextmanager
def use_preset(name: str) -> Iterator[Preset]:
    """Make ``name`` the preset of the ``"tvm_ext"`` pipeline inside the ``with`` block."""
    preset = get_preset(name)
    token = _ACTIVE_PRESET.set(name)
    try:
        yield preset
    finally:
        _ACTIVE_PRESET.reset(token)


def active_preset() -> Preset:
    """The preset the ``"tvm_ext"`` pipeline uses now (``TVM_EXT_PRESET`` env var, else the default)."""
    return get_preset(_ACTIVE_PRESET.get() or os.environ.get("TVM_EXT_PRESET") or DEFAULT_PRESET)


def register_builtin_presets() -> None:
    """The presets of the package (idempotent)."""
    if _PRESETS:
        return
    register_preset(Preset("baseline", "TVM 0.27's default CUDA pipeline: dlight schedules (none that races), TVM's TIR lowering"))
    register_preset(Preset("stitch", "AStitch: memory-intensive subgraphs stitched into one kernel, then dlight",
                           generators=("stitch", "dlight"), tir_pipeline="tvm_ext", techniques=("stitch",),
                           cuda_graph=True))
    register_preset(Preset("cutlass", "Bolt: GEMM/conv offload to CUTLASS with epilogue fusion, then baseline",
                           generators=("cutlass",), rest="fuseops", tir_pipeline="tvm_ext", techniques=("cutlass",),
                           cuda_graph=True))
    register_preset(Preset("full", "every technique's candidates, one BLP selection by the cost model, CUDA graphs",
                           generators=("cutlass", "stitch", "dlight", "fuseops", "orchestrate_small", "subprogram",
                                       "tilegraph"),
                           selector="blp",
                           tir_pipeline="tvm_ext",
                           techniques=("cutlass", "stitch", "orchestrate", "subprogram", "tilegraph"),
                           budget=FULL_BUDGET,
                           cuda_graph=True, recompute=True, horizontal=True))
    register_preset(Preset("orchestrate", "Korch: operator fission, convex candidate kernels from execution "
                                          "states, BLP selection with recomputation",
                           generators=("dlight", "fuseops", "orchestrate"), selector="blp", tir_pipeline="tvm_ext",
                           techniques=("fission", "orchestrate"), recompute=True, fission=True, cuda_graph=True))
    register_preset(Preset("subprogram", "SOUFFLE: Q/K/V-style GEMMs combined, subprograms merged into grid-synced "
                                         "multi-stage kernels, chosen against TVM's fusion by the cost model",
                           generators=("subprogram", "dlight", "fuseops"), selector="blp", tir_pipeline="tvm_ext",
                           techniques=("subprogram",), horizontal=True, cuda_graph=True))
    register_preset(Preset("tilegraph", "Welder: operators connected through registers and shared memory by "
                                        "tile graphs, chosen against TVM's kernels by the cost model",
                           generators=("tilegraph", "dlight", "fuseops"), selector="blp", tir_pipeline="tvm_ext",
                           techniques=("tilegraph",), cuda_graph=True))


__all__ = ["DEFAULT_PRESET", "Preset", "REST_POLICIES", "SELECTORS", "active_preset", "get_preset", "list_presets",
           "register_builtin_presets", "register_preset", "unregister_preset", "use_preset"]
