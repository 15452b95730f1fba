"""The offload stage of the ``cutlass`` preset: NHWC conversion, channel padding, partition, RunCodegen.

``offload_passes(target)`` runs BEFORE the baseline graph passes. Convolutions that CUTLASS may
take are converted to NHWC/OHWI with one ``ConvertLayout`` over the whole function, so layout
transposes appear only where NCHW tensors enter or leave the NHWC region (model input and
output), never around each convolution; weight transposes of constants are folded.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import tvm
from tvm import relax

from ..hardware import config_dir
from .b2b import b2b_patterns
from .b2b_conv import b2b_conv_patterns
from .candidates import arch_number
from .database import Database
from .checks import INPUT_DTYPES, dtype_of
from .padding import PadConvChannels
from .patterns import CODEGEN_NAME, OP_KINDS, partition_for_cutlass

_LOG = logging.getLogger(__name__)
DATABASE_ENV = "TVM_EXT_CUTLASS_DB"


def default_database_path() -> Path:
    """``$TVM_EXT_CUTLASS_DB`` or ``configs/cutlass/database.jsonl``."""
    env = os.environ.get(DATABASE_ENV)
    return Path(env) if env else config_dir() / "cutlass" / "database.jsonl"


def target_arch(target: tvm.target.Target) -> str:
    """``"sm_90a"`` etc. from a CUDA target (``sm_50`` when it names none)."""
    arch = target.attrs.get("arch")
    return str(arch) if arch else "sm_50"


def _convs_to_convert(mod: tvm.IRModule) -> int:
    count = 0

    @relax.expr_functor.visitor
    class _Finder(relax.PyExprVisitor):
        def visit_call_(self, call):  # noqa: N802 - visitor API
            nonlocal count
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
                attrs = call.attrs
                if (str(attrs.data_layout) != "NHWC" and int(attrs.groups) == 1
                        and dtype_of(call.args[0]) in INPUT_DTYPES):
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
    """NHWC/OHWI for every conv2d when at least one 16-bit dense conv can be offloaded.

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
    """Options of the ``tvm_ext_cutlass`` codegen for ``target`` (arch, database, device)."""
    db = Path(database) if database is not None else default_database_path()
    options = {"arch": target_arch(target), "database": str(db) if db.exists() else ""}
    model = target.attrs.get("model")
    if model:
        from ..hardware import list_devices

        if str(model) in list_devices():
            options["device"] = str(model)
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
        JSON-lines tuning database (default :func:`default_database_path`; missing file = none).
    ops : tuple of str
        Operator kinds to offload.
    """
    if target.kind.name != "cuda":
        _LOG.info("CUTLASS offload skipped: target kind %s", target.kind.name)
        return []
    arch = target_arch(target)
    if arch_number(arch) < 80:
        _LOG.info("CUTLASS offload skipped: %s is older than sm_80", arch)
        return []
    options = codegen_options(target, database)
    passes = [convert_conv_to_nhwc, PadConvChannels] if "conv2d" in ops else []
    db = options["database"]
    b2b = (lambda: b2b_patterns(Database(db), arch) + b2b_conv_patterns(Database(db), arch)) if db else None
    return passes + [PartitionForCutlass(ops, b2b), relax.transform.RunCodegen(target_options={CODEGEN_NAME: options})]
