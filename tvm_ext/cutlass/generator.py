"""The cutlass generator (Bolt): GEMMs and convolutions with their epilogues as library candidates.

Candidates come from the Relax calls the legalized nodes were made from
(:attr:`~tvm_ext.select.context.SelectionContext.origin`): the offload patterns (back-to-back
pairs first when measurements favour them, then single operators with their longest epilogue)
partition a copy of the pre-legalization function exactly as :func:`partition_for_cutlass`
would; each match is traced back to the legalized nodes it covers (legalization keeps the
binding variables; a weight transpose folded into a constant has no node and needs none). The
plan is the composite and its kernel configuration (:func:`~tvm_ext.cutlass.codegen.choose_config`);
a chosen candidate becomes a call of its ``Codegen`` function, which carries the plan, and the
BYOC codegen (``RunCodegen``) builds exactly that configuration.

Example
-------
>>> cands = CutlassGenerator().candidates(ctx)
>>> cands[0].plan.summary()
'cutlass tvm_ext_cutlass.dense_bias_gelu 2x_128x128x32_w2x2x1_i16x8x16_s3_sw8_k1_a8x8x8'
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import tvm
import tvm_ffi
from tvm import relax

from ..select.attrs import GENERATOR_ATTR, PLAN_ATTR
from ..select.candidate import Candidate, CodePath, LaunchShape
from ..select.context import SelectionContext
from ..select.database import default_database
from ..select.generator import register_generator
from ..select.plan import plan_to_text
from .codegen import choose_config, device_for
from .config import API_3X, KernelConfig
from .passes import b2b_pattern_source, codegen_options, offload_reason, prepare_passes, target_arch
from .patterns import CODEGEN_NAME, OP_KINDS, cutlass_patterns
from .workload import Offload, composite_function, workload_from_function

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CutlassPlan:
    """One CUTLASS kernel: the composite it computes and the template configuration.

    Attributes
    ----------
    composite : str
        Pattern name, e.g. ``"tvm_ext_cutlass.dense_bias_gelu"``.
    config : KernelConfig
        Template parameters of the instance.
    arch : str
        The arch it is built for (``sm_80``, ``sm_90a``).
    workload : str
        The workload key (database key).
    """

    generator: ClassVar[str] = "cutlass"

    composite: str
    config: KernelConfig
    arch: str
    workload: str

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"composite": self.composite, "config": self.config.to_dict(), "arch": self.arch,
                "workload": self.workload}

    def summary(self) -> str:
        """One line for reports."""
        return f"cutlass {self.composite} {self.config.name()}"


def launch_of(off: Offload, cfg: KernelConfig) -> LaunchShape:
    """Grid and block of one CUTLASS launch: output tiles (x split-K slices) of the first GEMM."""
    m, n, _ = off.workload.gemm_mnk
    tbm, tbn, tbk = cfg.threadblock
    grid = math.ceil(m / tbm) * math.ceil(n / tbn) * off.workload.batch * cfg.split_k
    stages = max(cfg.stages, 1)
    shared = stages * (tbm + tbn) * tbk * 2
    threads = 384 if cfg.api == API_3X else cfg.threads
    return LaunchShape(grid=grid, threads=threads, shared_bytes=shared)


def _same_value(pattern_value, origin_value, mapping: dict) -> bool:
    """Whether a composite's call, its variables replaced by ``mapping``, is ``origin_value``."""
    if not (isinstance(pattern_value, relax.Call) and isinstance(origin_value, relax.Call)):
        return False
    if not pattern_value.op.same_as(origin_value.op) or len(pattern_value.args) != len(origin_value.args):
        return False
    for a, b in zip(pattern_value.args, origin_value.args):
        a = mapping.get(a, a)
        if not (a.same_as(b) or (isinstance(a, tvm.ir.Constant) and tvm_ffi.structural_equal(a, b))):
            return False
    return tvm_ffi.structural_equal(pattern_value.attrs, origin_value.attrs)


@dataclass(frozen=True)
class _Site:
    """One call of a partitioned ``Codegen`` function (identical composites share one function)."""

    outer: relax.Function
    args: list

    def origin_vars(self, by_op: dict, claimed: set) -> list | None:
        """The pre-legalization variables the composite's calls compute at this site, in order:
        each call is matched with its parameters bound to this site's arguments and its earlier
        calls to the variables already matched; None if some call has no match."""
        _, inner = composite_function(self.outer)
        to_outer = dict(zip(inner.params, self.outer.params))
        for block in self.outer.body.blocks:
            for binding in block.bindings:
                if isinstance(binding.value, relax.Call) and not isinstance(binding.value.op, tvm.ir.Op):
                    to_outer = dict(zip(inner.params, binding.value.args))
        outer_to_site = dict(zip(self.outer.params, self.args))
        mapping = {p: outer_to_site.get(v, v) for p, v in to_outer.items()}
        found = []
        for blk in inner.body.blocks:
            for b in blk.bindings:
                if not (isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)):
                    return None
                match = next((o for o in by_op.get(b.value.op.name, ())
                              if o.var not in claimed and _same_value(b.value, o.value, mapping)), None)
                if match is None:
                    return None
                mapping[b.var] = match.var
                found.append(match.var)
        return found


class CutlassGenerator:
    """Bolt's library kernels as candidates (see the module docstring).

    Parameters
    ----------
    ops : tuple of str
        Operator kinds to offload (``dense``, ``batch_matmul``, ``matmul``, ``conv2d``).
    """

    name = "cutlass"
    kernel_kind = "library"

    def __init__(self, ops: tuple[str, ...] = OP_KINDS):
        self.ops = tuple(ops)

    def prepare_passes(self, target: tvm.target.Target) -> list:
        """NHWC conversion and channel padding of convolutions (none when CUTLASS cannot build)."""
        return prepare_passes(self.ops) if offload_reason(target) is None else []

    def codegen_passes(self, target: tvm.target.Target) -> list:
        """``RunCodegen`` with the codegen options of ``target``."""
        if offload_reason(target) is not None:
            return []
        return [relax.transform.RunCodegen(target_options={CODEGEN_NAME: codegen_options(target)})]

    def plan_from_json(self, data: dict[str, Any]) -> CutlassPlan:  # noqa: D102 - protocol
        return CutlassPlan(str(data["composite"]), KernelConfig.from_dict(data["config"]), str(data["arch"]),
                           str(data["workload"]))

    def _partition(self, ctx: SelectionContext) -> tvm.IRModule:
        options = codegen_options(ctx.target)
        b2b = b2b_pattern_source(options)
        patterns = (b2b() if b2b is not None else []) + cutlass_patterns(self.ops)
        mod = tvm.IRModule(dict(ctx.mod.functions_items()))
        mod[mod.get_global_var(ctx.func_name)] = ctx.origin
        return relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:
        """One candidate per offloadable match (none without the pre-legalization function)."""
        reason = offload_reason(ctx.target)
        if reason is not None or ctx.origin is None:
            logger.info("no CUTLASS candidates: %s", reason or "the pre-legalization function was not recorded")
            return []
        part = self._partition(ctx)
        arch = target_arch(ctx.target)
        device = device_for(arch, ctx.device.name)
        database = default_database()
        by_op: dict[str, list] = {}
        for block in ctx.origin.body.blocks:
            for b in block.bindings:
                if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                    by_op.setdefault(b.value.op.name, []).append(b)
        claimed: set = set()
        out = []
        for block in part[ctx.func_name].body.blocks:
            for binding in block.bindings:
                value = binding.value
                if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
                    continue
                outer = part[value.op]
                if outer.attrs is None or outer.attrs.get("Codegen") != CODEGEN_NAME:
                    continue
                site = _Site(outer, list(value.args))
                cand = self._candidate(ctx, site, by_op, claimed, arch, device, database)
                if cand is not None:
                    out.append(cand)
        return out

    def _candidate(self, ctx, site: "_Site", by_op, claimed: set, arch, device, database) -> Candidate | None:
        symbol = str(site.outer.attrs["global_symbol"])
        matched = site.origin_vars(by_op, claimed)
        if matched is None:
            ctx.drop(self.name, (), f"{symbol}: its calls are not all in the function")
            return None
        nodes = [n for n in (ctx.node_of_var(v) for v in matched) if n is not None]
        if not nodes or not ctx.graph.is_convex(nodes):
            ctx.drop(self.name, nodes, f"{symbol}: no convex node set")
            return None
        claimed.update(matched)
        off = workload_from_function(site.outer)
        cfg, _ = choose_config(off.workload, arch, device, database)
        plan = CutlassPlan(off.composite, cfg, arch, off.workload.key())
        key = f"{symbol}@{ctx.graph.nodes[nodes[-1]].name}"
        ctx.memo(("cutlass-call", key), lambda: (site.outer, site.args))
        path = CodePath.WGMMA if cfg.api == API_3X else CodePath.MMA_SYNC
        return Candidate.of(ctx.graph, nodes, plan, launch=launch_of(off, cfg), code_path=path,
                            provenance=f"CUTLASS pattern {off.composite}", key=key)

    def library_call(self, candidate: Candidate, ctx: SelectionContext) -> tuple[relax.Function, list]:
        """The candidate's ``Codegen`` function, carrying its plan, and the call's arguments."""
        outer, args = ctx.memo(("cutlass-call", candidate.key), lambda: None)
        function = outer.with_attr(PLAN_ATTR, plan_to_text(candidate.plan)).with_attr(GENERATOR_ATTR, self.name)
        return function, list(args)


register_generator(CutlassGenerator())

__all__ = ["CutlassGenerator", "CutlassPlan", "launch_of"]
