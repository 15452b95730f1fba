"""The cutlass generator (Bolt): GEMMs and convolutions with their epilogues as library candidates.

Candidates come from the Relax calls the legalized nodes were made from
(:attr:`~tvm_ext.select.context.SelectionContext.origin`): the offload patterns (back-to-back
pairs first when measurements favour them, then single operators with their longest epilogue)
partition a copy of the pre-legalization function exactly as :func:`partition_for_cutlass`
would; each match is traced back to the legalized nodes it covers (legalization keeps the
binding variables; a weight transpose folded into a constant has no node and needs none). The
plan is the composite and its kernel configuration: the best one
(:func:`~tvm_ext.cutlass.codegen.ranked_configs`: measured, else priced) whose call passes the
host-side contract check (:func:`~tvm_ext.cutlass.contract.first_accepted`: the kernel's
``can_implement``, every operand in bounds, emulated outputs equal to the Relax reference). A
call no configuration tried is accepted for is dropped with the check's findings, so it stays
with TVM and the report says why. A chosen candidate becomes a call of its ``Codegen``
function, which carries the plan, and the BYOC codegen (``RunCodegen``) builds exactly that
configuration.

Example
-------
>>> cands = CutlassGenerator().candidates(ctx)
>>> cands[0].plan.summary()
'cutlass tvm_ext_cutlass.dense_bias_gelu f16 tensor cores 2x_128x128x32_w2x2x1_i16x8x16_s3_sw8_k1_a8x8x8'

Each candidate's ``dtype`` is what its tensor cores compute in (``tfloat32`` for float32 operands,
which are offloaded only while :func:`~tvm_ext.cutlass.precision.allow_tf32` is on), and so is its
plan summary. A GEMM or convolution the patterns match but the checks reject (float32 without
TF32, odd channel counts, ...) is recorded as dropped with the reason, so the selection report
says why it stayed with TVM.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import tvm
from tvm import relax

from ..select.attrs import GENERATOR_ATTR, PLAN_ATTR
from ..select.candidate import Candidate
from ..select.context import SelectionContext
from ..select.database import default_database
from ..select.generator import register_generator
from ..select.origin import trace_partition
from ..select.plan import plan_to_text
from ..errors import KernelCompileError
from .attention import partition_attention
from .candidates import epilogue_splits_k
from .codegen import device_for, ranked_configs
from .contract import Acceptance, ContractResult, first_accepted
from .errors import CutlassCodegenError, CutlassSetupError
from .config import KernelConfig
from .passes import b2b_pattern_source, codegen_options, offload_reason, prepare_passes, target_arch
from .patterns import CODEGEN_NAME, OP_KINDS, CompositeName, Rejections, cutlass_patterns
from .precision import math_dtype, precision_label
from .pricing import describe
from .records import record_config, workload_dtype
from .workload import composite_function, workload_from_function

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
    input_dtype : str
        The operands' dtype; the tensor cores compute in its
        :func:`~tvm_ext.cutlass.precision.math_dtype` (TF32 for float32).
    """

    generator: ClassVar[str] = "cutlass"

    composite: str
    config: KernelConfig
    arch: str
    workload: str
    input_dtype: str

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"composite": self.composite, "config": self.config.to_dict(), "arch": self.arch,
                "workload": self.workload, "input_dtype": self.input_dtype}

    @property
    def precision(self) -> str:
        """How the kernel computes, e.g. ``"tf32 tensor cores"``."""
        return precision_label(self.input_dtype)

    def summary(self) -> str:
        """One line for reports: composite, precision and configuration."""
        return f"cutlass {self.composite} {self.precision} {self.config.name()}"

    def measured_config(self) -> dict[str, Any]:
        """What a measurement of this kernel is keyed by: the template configuration (and the
        launcher revision of a 2.x one: :func:`~tvm_ext.cutlass.records.record_config`)."""
        return record_config(self.config)


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
                           str(data["workload"]), str(data["input_dtype"]))

    def _partitions(self, ctx: SelectionContext, rejections: Rejections, refused_cores: list) -> list[tvm.IRModule]:
        """The pre-legalization function partitioned up to three times, so each grouping is a
        candidate: attention cores (when the operator kinds include batched matmuls; first, so a
        priority selection prefers them, as :func:`~tvm_ext.cutlass.passes.offload_passes` does),
        single operators with their longest epilogue, and, where that took a bias and a residual,
        GEMMs without that epilogue: a GEMM adding both may not split K (the broadcast epilogue
        would add the bias once per slice), one that adds the bias and leaves the residual add to
        its reader (a layer norm's kernel) may. Other epilogues split K as they are, and
        convolutions never split K: a variant without their residual would only be one kernel
        more."""
        options = codegen_options(ctx.target)
        b2b = b2b_pattern_source(options)
        patterns = (b2b() if b2b is not None else []) + cutlass_patterns(self.ops, rejections)
        mod = tvm.IRModule(dict(ctx.mod.functions_items()))
        mod[mod.get_global_var(ctx.func_name)] = ctx.origin
        out = [partition_attention(mod, refused_cores)] if "batch_matmul" in self.ops else []
        longest = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)
        out.append(longest)
        composites = [CompositeName.parse(composite_function(f)[0]) for _, f in longest.functions_items()
                      if isinstance(f, relax.Function) and f.attrs is not None and f.attrs.get("Codegen") == CODEGEN_NAME]
        gemm_ops = tuple(op for op in self.ops if op != "conv2d")   # convolutions never split K
        if any(c.op in gemm_ops and not epilogue_splits_k(c.epilogue) for c in composites):
            plain = cutlass_patterns(gemm_ops, keep=epilogue_splits_k)
            out.append(relax.transform.FuseOpsByPattern(plain, bind_constants=False, annotate_codegen=True)(mod))
        return out

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:
        """One candidate per offloadable match (none without the pre-legalization function)."""
        reason = offload_reason(ctx.target)
        if reason is not None or ctx.origin is None:
            logger.info("no CUTLASS candidates: %s", reason or "the pre-legalization function was not recorded")
            return []
        rejections, refused_cores = Rejections(), []
        parts = self._partitions(ctx, rejections, refused_cores)
        arch = target_arch(ctx.target)
        device = device_for(arch, ctx.device.name)
        database = default_database()
        is_group = lambda f: f.attrs is not None and f.attrs.get("Codegen") == CODEGEN_NAME  # noqa: E731
        out, covered, matches, seen = [], set(), [], set()
        traced = [t for part in parts for t in trace_partition(part, ctx.func_name, ctx.origin, is_group)]
        for outer, args, found in traced:
            covered.update(found)
            nodes = [n for n in (ctx.node_of_var(v) for v in found) if n is not None]
            if ctx.ordered(nodes) in seen:     # the same grouping from another partition
                continue
            seen.add(ctx.ordered(nodes))
            if not nodes or not ctx.graph.is_convex(nodes):
                ctx.drop(self.name, nodes, f"{outer.attrs['global_symbol']}: no convex node set")
                continue
            matches.append((outer, args, nodes, workload_from_function(outer)))
        for (outer, args, nodes, offload), accepted in zip(matches, self._accepted(matches, arch, device, database)):
            symbol = str(outer.attrs["global_symbol"])
            if accepted.kernel is None:
                ctx.drop(self.name, nodes, f"{symbol}: {accepted.reason()}")
                continue
            if accepted.refused:
                logger.info("%s: %s", symbol, accepted.reason())
            out.append(self._candidate(ctx, outer, args, nodes, offload, accepted.kernel.config, arch, device))
        for var, reason in rejections.items():
            node = ctx.node_of_var(var)
            if var not in covered and node is not None:
                ctx.drop(self.name, [node], f"{var.name}: {reason}")
        for variables, reason in refused_cores:
            nodes = [n for n in (ctx.node_of_var(v) for v in variables) if n is not None]
            if nodes:
                ctx.drop(self.name, nodes, f"attention core: {reason}")
        return out

    @staticmethod
    def _accepted(matches, arch, device, database) -> list[Acceptance]:
        """The first configuration of each match that the contract check accepts (a match whose
        configurations cannot be listed or checked gets none, with the reason)."""
        offloads = [m[3] for m in matches]
        try:
            ranked = [ranked_configs(off.workload, arch, device, database) for off in offloads]
            return first_accepted(offloads, ranked, arch)
        except (CutlassCodegenError, CutlassSetupError, KernelCompileError) as err:
            logger.warning("no CUTLASS candidates: the contract check could not run: %s", err)
            return [Acceptance(None, (ContractResult(off.symbol, "", off.workload.key(), "",
                                                     (f"the contract check could not run: {err}",), 0, ""),))
                    for off in offloads]

    def _candidate(self, ctx, outer, args, nodes, offload, cfg, arch, device) -> Candidate:
        wl = offload.workload
        plan = CutlassPlan(offload.composite, cfg, arch, wl.key(), wl.dtype)
        ctx.memo(("cutlass-call", ctx.ordered(nodes)), lambda: (outer, args))
        kernel = describe(wl, cfg, device)
        cand = Candidate.of(ctx.graph, nodes, plan, launch=kernel.launch, code_path=kernel.code_path,
                            global_bytes=kernel.global_bytes, unique_bytes=kernel.unique_bytes,
                            dram_bytes=kernel.dram_bytes,
                            provenance=f"CUTLASS pattern {plan.composite} on {plan.precision}", key=wl.key(),
                            record_dtype=workload_dtype(wl))
        return dataclasses.replace(cand, dtype=math_dtype(wl.dtype))  # priced at the tensor cores' rate

    def library_call(self, candidate: Candidate, ctx: SelectionContext) -> tuple[relax.Function, list]:
        """The candidate's ``Codegen`` function, carrying its plan, and the call's arguments."""
        outer, args = ctx.memo(("cutlass-call", candidate.nodes), lambda: None)
        function = outer.with_attr(PLAN_ATTR, plan_to_text(candidate.plan)).with_attr(GENERATOR_ATTR, self.name)
        return function, list(args)


register_generator(CutlassGenerator())

__all__ = ["CutlassGenerator", "CutlassPlan"]
