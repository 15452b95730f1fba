"""The stitching planner (AStitch §4.3-4.5): from a fused PrimFunc to a :class:`StitchPlan`.

1. Step 1 (:mod:`~tvm_ext.stitch.dominance`): local ops, dominants, sub-dominants, groups.
   Local ops are inlined (in a scratch schedule); an op that cannot be inlined becomes a
   candidate and planning restarts.
2. Step 2: each group gets rows from its dominant (a reduction's results; an elementwise
   group adopts its producer's rows when row-aligned: proactive adaptation) and the
   dominant's thread mapping (:func:`~tvm_ext.stitch.mapping.row_mapping`). A split mapping
   (few long rows) is realized by ``rfactor``: a partial-result op per (row, split) whose
   results a second op combines.
3. Step 3: every op left (dominant, sub-dominant, output) gets its scheme: ``regional``
   (consumers read the same rows, so the value stays on chip: shared memory), ``global``
   (a workspace in global memory and a grid barrier) or ``output`` (nobody inside reads it).
   Regional ops join their consumers' *stage* (one loop nest); stages are separated by grid
   barriers where a global value crosses them.
4. Memory (§4.4): if the regional buffers exceed the shared memory of a block, regional ops
   are demoted to global one at a time, largest first.
5. Launch (§4.5): :func:`~tvm_ext.stitch.launch.launch_config` gives blocks per wave and the
   register cap; a kernel with a grid barrier gets at most one wave of blocks (vertical
   packing); without a barrier, a single-stage kernel keeps its natural grid.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from ..errors import TVM_ERRORS, TvmExtError
from ..hardware import DeviceSpec
from ..analysis import element_bytes
from ..graph import components
from ..tir.inline import inline_with_schedule
from .dominance import Dominance, find_dominants
from .launch import LaunchConfig, launch_config
from .locality import reads_same_row, row_split
from .mapping import DEFAULT_BLOCK_THREADS, ThreadMapping, row_mapping
from .ops import StitchGraph, StitchOp, StitchOpError

logger = logging.getLogger(__name__)

_MAX_REPLANS = 16


class StitchPlanError(TvmExtError):
    """No stitched kernel can be planned for a PrimFunc (the caller falls back to separate kernels)."""


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of the planner.

    Attributes
    ----------
    block_threads : int
        Threads per block to pack rows into (1024 in the paper).
    allow_split : bool
        Allow task splitting of few long rows.
    shared_limit : int, optional
        Shared memory per block the regional buffers may use (default: the device's
        non-opt-in per-block limit, the most static ``__shared__`` memory a kernel can have).
    """

    block_threads: int = DEFAULT_BLOCK_THREADS
    allow_split: bool = True
    shared_limit: int | None = None


@dataclass(frozen=True)
class Stage:
    """One loop nest of the kernel: a root op and the regional ops computed inside it.

    Attributes
    ----------
    root : str
        Op whose loops carry the mapping (the stage's last op).
    members : tuple of str
        Regional ops computed per row inside the root's row loop, in program order.
    rows : int or None
        Rows of the stage (``None``: a flat elementwise layout).
    inner : int
        Elements per row of the root (its reduction length for a reduction root).
    natural_blocks : int
        Blocks the stage needs without vertical packing.
    tasks : int
        Row groups (or chunks) each block processes in turn.
    """

    root: str
    members: tuple[str, ...]
    rows: int | None
    inner: int
    natural_blocks: int
    tasks: int = 1


@dataclass
class StitchPlan:
    """Everything the schedule builder needs for one stitched kernel (op names throughout)."""

    dominance: Dominance
    materialized: tuple[str, ...]
    schemes: dict[str, str]
    rows: dict[str, int | None]
    mappings: dict[str, ThreadMapping]
    stages: list[Stage]
    threads_x: int
    rows_per_block: int
    grid: int
    launch: LaunchConfig
    needs_grid_sync: bool
    shared_bytes: int
    demoted: tuple[str, ...] = ()
    split: dict[str, int] = field(default_factory=dict)
    inlined_func: tirx.PrimFunc | None = None
    graph: StitchGraph | None = None

    @property
    def dominants(self) -> tuple[str, ...]:
        """Final dominant ops."""
        return self.dominance.dominants

    @property
    def sub_dominants(self) -> dict[str, str]:
        """Sub-dominant op -> its dominant."""
        return self.dominance.sub_dominants

    @property
    def threads_per_block(self) -> int:
        """Threads of one block."""
        return self.threads_x * self.rows_per_block

    def barriers(self) -> int:
        """Grid barriers the kernel will have: before a stage that reads a global or output value
        an earlier stage wrote since the last barrier (the rule of
        :func:`~tvm_ext.tir.insert_grid_sync`, at stage level). Without the op graph (a plan read
        back from JSON) the upper bound, one between every two stages."""
        if not self.needs_grid_sync:
            return 0
        if self.graph is None:
            return max(1, len(self.stages) - 1)
        in_memory = {n for n, scheme in self.schemes.items() if scheme in ("global", "output")}
        count, written = 0, set()
        for stage in self.stages:
            names = (*stage.members, stage.root)
            reads = {p.name for n in names for p, _ in self.graph.producers(self.graph.op(n))} - set(names)
            if reads & written:
                count, written = count + 1, set()
            written |= in_memory.intersection(names)
        return count

    def ops_with_scheme(self, scheme: str) -> tuple[str, ...]:
        """Materialized ops of one scheme (``"regional"``, ``"global"``, ``"output"``)."""
        return tuple(n for n in self.materialized if self.schemes.get(n) == scheme)

    def summary(self) -> dict[str, object]:
        """A JSON-friendly description (for reports and function attributes)."""
        return {
            "dominants": list(self.dominants), "sub_dominants": dict(self.sub_dominants),
            "schemes": dict(self.schemes), "stages": [s.root for s in self.stages],
            "block": [self.threads_x, self.rows_per_block], "grid": self.grid,
            "grid_sync": self.needs_grid_sync, "shared_bytes": self.shared_bytes,
            "register_cap": self.launch.register_cap, "blocks_per_sm": self.launch.blocks_per_sm,
            "split": dict(self.split), "demoted": list(self.demoted),
        }


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def inline_locals(func: tirx.PrimFunc, local: tuple[str, ...]) -> tuple[tvm.s_tir.Schedule, list[str]]:
    """A schedule of ``func`` with the ops ``local`` inlined; also the names that would not inline
    (:func:`tvm_ext.tir.inline.inline_with_schedule`: one substitution pass, not one
    ``compute_inline`` per op, each re-analysing the whole function)."""
    return inline_with_schedule(func, local)


def apply_split(sch: tvm.s_tir.Schedule, op: StitchOp, split: int) -> str:
    """rfactor the reduction of ``op`` into ``split`` partial results; returns the new op's name."""
    block = sch.get_sblock(op.name)
    loops = sch.get_loops(block)
    n_red = len(op.reduce_vars)
    red = sch.fuse(*loops[len(loops) - n_red:]) if n_red > 1 else loops[-1]
    outer, _ = sch.split(red, [split, None])
    try:  # the partial results get a new last axis of the written buffer (0-d for a full reduction)
        rf = sch.rfactor(outer, factor_axis=len(op.shape))
    except TVM_ERRORS as err:
        raise StitchPlanError(f"cannot split the reduction '{op.name}': {str(err).splitlines()[-1][:200]}") from None
    return sch.get(rf).name_hint


def _row_of(op: StitchOp, rows: int | None) -> int | None:
    """``rows`` if ``op`` is row-aligned with it (a reduction must match exactly)."""
    if rows is None:
        return None
    if op.is_reduce:
        return rows if op.rows == rows else None
    return rows if row_split(op.spatial, rows) is not None else None


def _rows_for_consumers(g1: StitchGraph, op: StitchOp) -> int | None:
    """Rows for an elementwise dominant with no row-mapped producer: the finest leading-dims
    product under which some consumer reads it row by row (so its value can stay on chip)."""
    acc, options = 1, []
    for d in op.spatial[:-1]:
        acc *= int(d)
        options.append(acc)
    for r in reversed(options):
        if any(_row_of(c, r) is not None and reads_same_row(op, c, r) for c, _ in g1.consumers(op)):
            return r
    return None


def _assign_rows(g1: StitchGraph, dom: Dominance, present: set[str]) -> tuple[dict[str, int | None], dict[str, int]]:
    """Rows per materialized op (step 2 with proactive adaptation); also each group's rows."""
    rows: dict[str, int | None] = {}
    group_rows: dict[str, int | None] = {}
    for dname in dom.dominants:
        members = [g1.op(n) for n in dom.groups[dname] if n in present]
        d = g1.op(dname) if dname in present else None
        r: int | None = None
        if d is not None and d.is_reduce:
            r = d.rows
        elif d is not None:
            for producer, _ in g1.producers(d):  # proactive: adopt the producer's rows
                pr = rows.get(producer.name)
                if pr is not None and reads_same_row(producer, d, pr):
                    r = pr
                    break
            if r is None:
                r = _rows_for_consumers(g1, d)
        group_rows[dname] = r
        for m in members:
            aligned = _row_of(m, r)
            rows[m.name] = m.rows if aligned is None and m.is_reduce else aligned
    for op in g1.ops:  # ops outside every group (cannot happen for planned funcs) stay flat
        rows.setdefault(op.name, op.rows if op.is_reduce else None)
    return rows, group_rows


def _schemes(g1: StitchGraph, rows: dict[str, int | None], demoted: set[str]) -> dict[str, str]:
    schemes: dict[str, str] = {}
    for op in g1.ops:
        consumers = [c for c, _ in g1.consumers(op)]
        if not consumers:
            schemes[op.name] = "output"
            continue
        r = rows.get(op.name)
        regional = (op.name not in demoted and not op.writes_output and r is not None
                    and all(rows.get(c.name) == r and reads_same_row(op, c, r) for c in consumers))
        schemes[op.name] = "regional" if regional else "global"
    return schemes


def _stages(g1: StitchGraph, schemes: dict[str, str]) -> tuple[list[tuple[str, list[str]]], str | None]:
    """Group ops into stages along regional edges; returns (root, members) lists or an op to demote."""
    regional_edges = [(op.name, c.name) for op in g1.ops if schemes[op.name] == "regional"
                      for c, _ in g1.consumers(op)]
    out = []
    for names in components([op.name for op in g1.ops], regional_edges):
        ops = [g1.op(n) for n in names]
        sinks = [o for o in ops if schemes[o.name] != "regional"]
        if len(sinks) != 1:
            regional = [o for o in ops if schemes[o.name] == "regional"]
            return [], regional[0].name
        root = sinks[0]
        if any(o.index > root.index for o in ops):
            return [], next(o.name for o in ops if schemes[o.name] == "regional")
        out.append((root.name, [o.name for o in ops if o.name != root.name]))
    out.sort(key=lambda s: g1.op(s[0]).index)
    return out, None


def _shared_bytes(g1: StitchGraph, schemes: dict[str, str], rows: dict[str, int | None],
                  threads_x: int, rows_per_block: int, warp: int) -> dict[str, int]:
    """Shared memory per block: every cross-thread reduction's per-warp staging and broadcast slot
    (TVM's lowering allocates them for any reduction; a regional reduction's result lives in that
    slot), and the rows a regional non-reduction op keeps per block (those can be demoted)."""
    need: dict[str, int] = {}
    for op in g1.ops:
        b = element_bytes(op.dtype)
        if op.is_reduce:
            need[op.name] = rows_per_block * (max(1, threads_x // warp) + 1) * b
        elif schemes[op.name] == "regional":
            per_row = op.num_elements // max(1, rows[op.name] or 1)
            need[op.name] = rows_per_block * per_row * b
    return need


def plan_prim_func(func: tirx.PrimFunc, spec: DeviceSpec, options: PlanOptions | None = None) -> StitchPlan:
    """Plan one stitched kernel for ``func`` (a fused, unscheduled PrimFunc) on ``spec``.

    Raises
    ------
    StitchPlanError
        The function has no stitchable structure (several writes per block, symbolic shapes,
        empty tensors), or no mapping fits the device.
    """
    options = options or PlanOptions()
    empty = [p.name for p in func.params
             if any(isinstance(d, tirx.IntImm) and int(d) == 0 for d in getattr(p.ty, "shape", None) or ())]
    if empty:  # nothing to stitch; TVM's default lowering handles empty tensors
        raise StitchPlanError(f"tensor(s) {', '.join(empty)} have no elements")
    try:
        g0 = StitchGraph.from_prim_func(func)
    except StitchOpError as err:
        raise StitchPlanError(str(err)) from None
    forced: set[str] = set()
    for _ in range(_MAX_REPLANS):
        dom = find_dominants(g0, force_candidates=frozenset(forced))
        sch, failed = inline_locals(func, dom.local)
        if failed:
            forced.update(failed)
            continue
        return _plan_inlined(sch, dom, spec, options)
    raise StitchPlanError(f"could not inline the local ops of the function (last failures: {sorted(forced)})")


def _plan_inlined(sch: tvm.s_tir.Schedule, dom: Dominance, spec: DeviceSpec, options: PlanOptions) -> StitchPlan:
    g1 = StitchGraph.from_prim_func(sch.mod["main"])
    present = {op.name for op in g1.ops}
    block_threads = min(options.block_threads, spec.max_threads_per_block)
    # step 2: the primary dominant (first reduction, else first dominant) fixes the block shape
    reduce_doms = [d for d in dom.dominants if d in present and g1.op(d).is_reduce]
    mappings: dict[str, ThreadMapping] = {}
    split: dict[str, int] = {}
    for dname in reduce_doms:
        d = g1.op(dname)
        mappings[dname] = row_mapping(d.rows, d.reduce_extent, spec, block_threads=block_threads,
                                      allow_split=options.allow_split)
    primary = mappings[reduce_doms[0]] if reduce_doms else None
    if primary is not None and primary.kind == "split":
        d = g1.op(reduce_doms[0])
        rf_name = apply_split(sch, d, primary.split)
        split[d.name] = primary.split
        groups = dict(dom.groups)
        groups[d.name] = groups[d.name] + (rf_name,)
        dom = Dominance(dom.local, dom.candidates, dom.dominants, {**dom.sub_dominants, rf_name: d.name}, groups)
        g1 = StitchGraph.from_prim_func(sch.mod["main"])
        present = {op.name for op in g1.ops}
        threads_x, rows_per_block = block_threads, 1
    elif primary is not None:
        threads_x, rows_per_block = primary.threads_x, primary.rows_per_block
    else:
        threads_x, rows_per_block = block_threads, 1
    rows, _ = _assign_rows(g1, dom, present)
    if split:
        rows[rf_name] = g1.op(rf_name).rows

    demoted: set[str] = set()
    limit = options.shared_limit if options.shared_limit is not None else spec.max_shared_memory_per_block
    while True:
        schemes = _schemes(g1, rows, demoted)
        stages, demote = _stages(g1, schemes)
        if demote is not None:
            demoted.add(demote)
            continue
        need = _shared_bytes(g1, schemes, rows, threads_x, rows_per_block, spec.warp_size)
        total = sum(need.values())
        demotable = {n: v for n, v in need.items() if schemes[n] == "regional" and not g1.op(n).is_reduce}
        if total > limit and demotable:
            worst = max(demotable, key=lambda n: demotable[n])
            logger.info("shared memory %d B > %d B: demoting '%s' from regional to global", total, limit, worst)
            demoted.add(worst)
            continue
        if total > limit:
            raise StitchPlanError(f"the reductions alone need {total} B of shared memory per block, "
                                  f"more than {limit} B")
        break

    threads = threads_x * rows_per_block
    try:
        launch = launch_config(spec, threads, total)
    except ValueError as err:
        raise StitchPlanError(f"no launch of {threads} threads with {total} B shared memory fits "
                              f"{spec.name}: {err}") from None
    built: list[Stage] = []
    for root_name, members in stages:
        root = g1.op(root_name)
        r = rows.get(root_name)
        inner = root.reduce_extent if root.is_reduce else (root.num_elements // r if r else 1)
        natural = _ceil_div(r, rows_per_block) if r else _ceil_div(root.num_elements, threads)
        built.append(Stage(root_name, tuple(members), r, inner, natural))
    consumed_global = any(schemes[op.name] == "global" for op in g1.ops)
    needs_sync = consumed_global
    biggest = max(s.natural_blocks for s in built)
    if needs_sync or len(built) > 1:
        grid = max(1, min(biggest, launch.blocks_per_wave))
    else:
        grid = biggest
    built = [Stage(s.root, s.members, s.rows, s.inner, s.natural_blocks, _ceil_div(s.natural_blocks, grid))
             for s in built]
    materialized = tuple(op.name for op in g1.ops)
    return StitchPlan(dominance=dom, materialized=materialized, schemes=schemes, rows=rows, mappings=mappings,
                      stages=built, threads_x=threads_x, rows_per_block=rows_per_block, grid=grid, launch=launch,
                      needs_grid_sync=needs_sync, shared_bytes=total, demoted=tuple(sorted(demoted)), split=split,
                      inlined_func=sch.mod["main"], graph=g1)


__all__ = ["PlanOptions", "Stage", "StitchPlan", "StitchPlanError", "apply_split", "inline_locals", "plan_prim_func"]
