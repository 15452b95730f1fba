"""NHWC conversion for CUTLASS convolutions, region by region.

CUTLASS takes a convolution only in NHWC/OHWI (:mod:`~tvm_ext.cutlass.patterns`); an imported
model is NCHW. :func:`convert_conv_to_nhwc` converts those parts of the graph where NHWC pays:

1. **Regions.** The bindings of each dataflow block that ``relax.transform.ConvertLayout`` can
   carry a layout through (calls of operators with a layout rule, tuples, tuple items; the
   rules TVM lacks for ``relax.nn.pad`` come from :mod:`~tvm_ext.cutlass.layout_rules`) are
   split into connected regions. An operator without a rule (``matmul``, ``reshape``, an
   opaque ``call_tir``) separates regions: a layout never crosses it. A region is a candidate
   when it holds a *dense* convolution CUTLASS could take (``groups == 1``, an offloadable
   dtype: 16-bit, or float32 while TF32 is allowed).
2. **Price.** Each candidate is converted alone (every convolution in it gets NHWC/OHWI,
   grouped and depthwise ones too, so they stay inside the region instead of adding a transpose
   pair each; CUTLASS does not take them, TVM keeps them) and the activation transposes that
   adds are counted: where NCHW tensors enter and NHWC tensors leave the region (a model's own
   transpose next to a converted tensor is composed with the added one, often into none). Global
   pools over H and W read their input in NCHW
   (:func:`~tvm_ext.cutlass.layout_rules.keep_spatial_reductions_nchw`): the transpose before
   them fuses into the reduction's kernel, while the NHWC reduction over strided axes is
   modelled far slower (NAFNet-width channel attention: 310 us instead of 12 us per call).
3. **Decide.** A region is converted when it adds at most :data:`TRANSPOSES_PER_CONV` transposes
   per dense convolution (see there); the others stay NCHW, with TVM, and are logged. All
   accepted regions are then converted together and the weight transposes folded.

The offload itself is decided later, per convolution, by the selection's cost model (cutlass
preset) or by the patterns' checks (:func:`~tvm_ext.cutlass.passes.offload_passes`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .checks import dtype_of
from .layout_rules import keep_spatial_reductions_nchw, register_layout_rules
from .permutes import fold_permutes
from .precision import input_dtypes

_LOG = logging.getLogger(__name__)

#: Activation transposes a region may add per dense convolution it hands to CUTLASS.
#: *Assumed*: 2, one entry and one exit transpose per convolution, the layout traffic of a
#: convolution converted on its own (an NHWC island, e.g. Segformer's patch embeddings between
#: reshapes). Beyond that a region moves more data through transposes than islands would; for
#: batch-1 convolutions the analytic cost model prices TVM and CUTLASS kernels within a few
#: microseconds of each other (launch-bound), so no per-region saving is modelled here: the
#: selection compares the kernels themselves after the conversion.
TRANSPOSES_PER_CONV = 2

_CONV = "relax.nn.conv2d"
_NHWC = {_CONV: ["NHWC", "OHWI"]}


def is_dense_nchw_conv(call: relax.Call) -> bool:
    """A ``conv2d`` not yet NHWC that CUTLASS could take after the conversion (groups == 1, an
    offloadable input dtype)."""
    return (isinstance(call.op, tvm.ir.Op) and call.op.name == _CONV and str(call.attrs.data_layout) != "NHWC"
            and int(call.attrs.groups) == 1 and dtype_of(call.args[0]) in input_dtypes())


@dataclass
class Region:
    """Connected bindings a layout can flow through; ``convs`` are its ``conv2d`` calls,
    ``transposes`` what converting ``converted`` of its dense ones adds (or, when none is
    converted, what converting all of them would have added)."""

    members: int = 0
    convs: list = field(default_factory=list)
    transposes: int = 0
    converted: int = 0

    @property
    def dense(self) -> int:
        """Dense convolutions CUTLASS could take."""
        return sum(1 for c in self.convs if is_dense_nchw_conv(c))

    def describe(self) -> str:
        """One line for logs: convolutions, size and transposes."""
        return (f"{self.dense} dense + {len(self.convs) - self.dense} grouped convolutions in {self.members} "
                f"bindings, {self.converted} dense converted, {self.transposes} layout transposes")


def _has_rule(call: relax.Call) -> bool:
    if not isinstance(call.op, tvm.ir.Op):
        return False
    return call.op.get_attr("FRelaxInferLayout") is not None and all(
        not isinstance(a.ty, relax.TensorType) or a.ty.ndim >= 0 for a in call.args)


def _used_vars(expr: relax.Expr) -> list[relax.Var]:
    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _used_vars(f)]
    if isinstance(expr, relax.TupleGetItem):
        return _used_vars(expr.tuple_value)
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in _used_vars(a)]
    return []


def find_regions(func: relax.Function) -> list[Region]:
    """The regions of ``func`` that hold a dense convolution (see the module docstring)."""
    parent: dict = {}

    def root(var):
        while parent[var] is not var:
            parent[var] = parent[parent[var]]
            var = parent[var]
        return var

    values = {}
    for block in getattr(func.body, "blocks", []):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, (relax.Tuple, relax.TupleGetItem)) or (isinstance(value, relax.Call) and _has_rule(value)):
                parent[binding.var] = binding.var
                values[binding.var] = value
                for used in _used_vars(value):
                    if used in parent:
                        parent[root(used)] = root(binding.var)
    regions: dict = {}
    for var, value in values.items():
        region = regions.setdefault(root(var), Region())
        region.members += 1
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == _CONV:
            region.convs.append(value)
    return [r for r in regions.values() if r.dense]


def _activation_transposes(mod: tvm.IRModule) -> int:
    """``permute_dims`` bindings in the Relax functions of ``mod`` other than weight transposes:
    those of constants (folded) and those only read as a convolution's weight."""
    count = 0
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        permutes, other_uses = [], set()
        for block in getattr(func.body, "blocks", []):
            for binding in block.bindings:
                value = binding.value
                if not isinstance(value, relax.Call):
                    other_uses.update(_used_vars(value))
                    continue
                is_conv = isinstance(value.op, tvm.ir.Op) and value.op.name == _CONV
                for i, arg in enumerate(value.args):
                    if not (is_conv and i == 1):
                        other_uses.update(_used_vars(arg))
                if (isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.permute_dims"
                        and not isinstance(value.args[0], tvm.ir.Constant)):
                    permutes.append(binding.var)
        other_uses.update(_used_vars(func.body.body))
        count += sum(1 for var in permutes if var in other_uses)
    return count


def _convert(mod: tvm.IRModule, convs: set) -> tvm.IRModule:
    """``ConvertLayout`` with NHWC/OHWI for exactly the ``conv2d`` calls in ``convs``, chains of
    transposes it leaves composed (:func:`~tvm_ext.cutlass.permutes.fold_permutes`)."""
    with keep_spatial_reductions_nchw():
        converted = relax.transform.ConvertLayout(_NHWC, layout_cb=lambda call: _NHWC if call in convs else {})(mod)
    return fold_permutes(converted)


def _choose(mod: tvm.IRModule, region: Region, base: int, max_per_conv: int) -> list:
    """The convolutions of ``region`` to convert: the first of (all of them, its dense ones, dense
    ones added one at a time while each keeps the bound) that stays within ``max_per_conv``
    transposes per dense convolution; sets ``region.transposes`` and ``region.converted``."""
    dense = [c for c in region.convs if is_dense_nchw_conv(c)]

    def added(convs: list) -> int:
        return _activation_transposes(_convert(mod, set(convs))) - base

    for convs in (region.convs, dense) if len(dense) < len(region.convs) else (dense,):
        region.transposes = added(convs)
        if region.transposes <= max_per_conv * len(dense):
            region.converted = len(dense)
            return list(convs)
    chosen: list = []
    best = 0
    for conv in dense:
        count = added(chosen + [conv])
        if count <= max_per_conv * (len(chosen) + 1):
            chosen.append(conv)
            best = count
    if chosen:
        region.transposes, region.converted = best, len(chosen)
    return chosen


def convert_regions(mod: tvm.IRModule, max_per_conv: int = TRANSPOSES_PER_CONV) -> tuple[tvm.IRModule, list[Region]]:
    """Convert the regions of ``mod`` that pay (module docstring); returns the module and every
    candidate region (how many of its dense convolutions were converted, the transposes added)."""
    register_layout_rules()
    regions = [r for _, f in mod.functions_items() if isinstance(f, relax.Function) for r in find_regions(f)]
    if not regions:
        return mod, []
    base = _activation_transposes(mod)
    accepted: list = []
    for region in regions:
        chosen = _choose(mod, region, base, max_per_conv)
        if chosen:
            accepted += chosen
            _LOG.debug("NHWC region converted: %s", region.describe())
        else:
            _LOG.info("NHWC region left in NCHW (more than %d transposes per dense convolution): %s; "
                      "its convolutions stay with TVM", max_per_conv, region.describe())
    if not accepted:
        return mod, regions
    converted = _convert(mod, set(accepted))        # weight transposes folded on the host
    _LOG.info("NHWC conversion: %d of %d dense convolutions in %d regions, %d layout transposes added",
              sum(1 for c in accepted if is_dense_nchw_conv(c)), sum(r.dense for r in regions), len(regions),
              sum(r.transposes for r in regions if r.converted))
    return converted, regions


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.ConvertConvToNHWC")
def convert_conv_to_nhwc(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """NHWC/OHWI for the convolutions of every region where it pays (:func:`convert_regions`)."""
    return convert_regions(mod)[0]


__all__ = ["Region", "TRANSPOSES_PER_CONV", "convert_conv_to_nhwc", "convert_regions", "find_regions",
           "is_dense_nchw_conv"]
