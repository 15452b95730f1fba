"""CUTLASS offload as passes: NHWC conversion, channel padding, partition, RunCodegen.

The ``cutlass`` preset runs the first two as the generator's preparation passes
(:class:`~tvm_ext.cutlass.generator.CutlassGenerator`) and chooses offloads by selection;
:func:`offload_passes` is the technique as a pass list usable alone, before legalization
(partition every match, each with :func:`~tvm_ext.cutlass.codegen.choose_config`'s
configuration). Convolutions that CUTLASS may take are converted to NHWC/OHWI with one
``ConvertLayout`` over the whole function, so layout transposes appear only where NCHW tensors
enter or leave the NHWC region (model input and output), never around each convolution; weight
transposes of constants are folded.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import tvm
from tvm import relax

from ..errors import UnknownDeviceError
from ..hardware import device_from_target
from ..select.database import DATABASE_ENV, Database
from .b2b import b2b_patterns
from .b2b_conv import b2b_conv_patterns
from .candidates import arch_number
from .checks import dtype_of
from .padding import PadConvChannels
from .patterns import CODEGEN_NAME, OP_KINDS, partition_for_cutlass
from .precision import input_dtypes

_LOG = logging.getLogger(__name__)


def target_arch(target: tvm.target.Target) -> str | None:
    """``"sm_90a"`` etc. from a CUDA target, None when it names none."""
    arch = target.attrs.get("arch")
    return str(arch) if arch else None


def offload_reason(target: tvm.target.Target) -> str | None:
    """Why nothing can be offloaded to CUTLASS for ``target`` (None when it can)."""
    if target.kind.name != "cuda":
        return f"target kind {target.kind.name} is not CUDA"
    arch = target_arch(target)
    if arch is None:
        return "the CUDA target names no arch"
    if arch_number(arch) < 80:
        return f"{arch} is older than sm_80"
    return None


def _convs_to_convert(mod: tvm.IRModule) -> int:
    count = 0

    @relax.expr_functor.visitor
    class _Finder(relax.PyExprVisitor):
        def visit_call_(self, call):  # noqa: N802 - visitor API
            nonlocal count
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
                attrs = call.attrs
                if (str(attrs.data_layout) != "NHWC" and int(attrs.groups) == 1
                        and dtype_of(call.args[0]) in input_dtypes()):
                    count += 1
            super().visit_call_(call)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _Finder().visit_expr(func)
    return count


def _count_transposes(mod: tvm.IRModule) -> int:
    return sum(func.script().count("R.permute_dims") for _, func in mod.functions_items()
               if isinstance(func, relax.Function))


def _boundary_tensors(mod: tvm.IRModule) -> int:
    """4-D inputs and outputs of the Relax functions: where entry/exit transposes may sit."""
    count = 0
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        types = [p.ty for p in func.params] + [func.ret_ty]
        while types:
            ty = types.pop()
            if isinstance(ty, relax.TupleType):
                types.extend(ty.fields)
            elif isinstance(ty, relax.TensorType) and ty.ndim == 4:
                count += 1
    return count


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.ConvertConvToNHWC")
def convert_conv_to_nhwc(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """NHWC/OHWI for every conv2d when at least one dense conv of an offloadable dtype (16-bit, or
    float32 while TF32 is allowed) can be offloaded.

    The conversion is kept only if it adds a bounded number of transposes where the NHWC region
    begins and ends: at most ``2 + 2 * (4-D inputs and outputs)`` (e.g. ResNet-50: one after the
    input, one before the classifier's reshape). Layout-opaque operators (e.g. ``call_tir`` pads
    from an importer) would otherwise put a transpose pair around every convolution; then the
    module is left in NCHW, its convolutions stay with TVM, and a warning says so.
    """
    if _convs_to_convert(mod) == 0:
        return mod
    before = _count_transposes(mod)
    converted = relax.transform.FoldConstant()(relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod))
    added, allowed = _count_transposes(converted) - before, 2 + 2 * _boundary_tensors(mod)
    if added > allowed:
        _LOG.warning("NHWC conversion skipped: it would add %d layout transposes (at most %d may sit at the NHWC region's entries and exits); "
                     "convolutions stay NCHW and are not offloaded to CUTLASS", added, allowed)
        return mod
    return converted


def PartitionForCutlass(ops: tuple[str, ...] = OP_KINDS, extra_patterns=None) -> tvm.transform.Pass:  # noqa: N802
    """Pass form of :func:`partition_for_cutlass` (TVM-style factory; named for ``disabled_pass``).

    ``extra_patterns`` is a list of FusionPatterns or a callable returning one (evaluated per run,
    e.g. to read the tuning database when the pass runs).
    """

    @tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.Partition")
    def _partition(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        extra = extra_patterns() if callable(extra_patterns) else extra_patterns
        return partition_for_cutlass(mod, ops, extra)

    return _partition


def codegen_options(target: tvm.target.Target, database: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Options of the ``tvm_ext_cutlass`` codegen for ``target``: its arch, the device the target
    policy gives, and the measurement database (``database``, else ``$TVM_EXT_DATABASE``)."""
    db = Path(database) if database is not None else (Path(os.environ[DATABASE_ENV])
                                                      if os.environ.get(DATABASE_ENV) else None)
    options = {"arch": target_arch(target) or "", "database": str(db) if db is not None and db.exists() else ""}
    try:
        options["device"] = device_from_target(target).name
    except UnknownDeviceError as err:
        _LOG.warning("CUTLASS configurations chosen for the arch's default device: %s", err)
    return options


def offload_passes(target: tvm.target.Target, database: str | os.PathLike[str] | None = None,
                   ops: tuple[str, ...] = OP_KINDS) -> list[tvm.transform.Pass]:
    """Passes that move CUTLASS-able GEMMs/convs (+ epilogues) into CUTLASS kernels.

    NHWC conversion and channel padding (convolutions), partition, then ``RunCodegen``.

    Parameters
    ----------
    target : tvm.target.Target
        CUDA target; its ``arch`` selects the kernels (``sm_90a``: CUTLASS 3.x for aligned
        GEMMs). Targets below sm_80 or non-CUDA targets get no passes.
    database : path, optional
        JSON-lines measurement database (default ``$TVM_EXT_DATABASE``; missing file = none).
    ops : tuple of str
        Operator kinds to offload.
    """
    reason = offload_reason(target)
    if reason is not None:
        _LOG.info("CUTLASS offload skipped: %s", reason)
        return []
    options = codegen_options(target, database)
    passes = prepare_passes(ops)
    b2b = b2b_pattern_source(options)
    return passes + [PartitionForCutlass(ops, b2b), relax.transform.RunCodegen(target_options={CODEGEN_NAME: options})]


def prepare_passes(ops: tuple[str, ...] = OP_KINDS) -> list[tvm.transform.Pass]:
    """Layout passes before partitioning: NHWC conversion and channel padding for convolutions."""
    return [convert_conv_to_nhwc, PadConvChannels] if "conv2d" in ops else []


def b2b_pattern_source(options: dict[str, str]):
    """A callable giving the back-to-back patterns (which consult the measurement database), or
    None without a database (b2b fusion is then never offered)."""
    db, arch, device = options["database"], options["arch"], options.get("device", "")
    if not db:
        return None
    return lambda: b2b_patterns(Database(db), device, arch) + b2b_conv_patterns(Database(db), device, arch)
