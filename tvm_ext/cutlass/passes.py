"""CUTLASS offload as passes: NHWC conversion, channel padding, partition, RunCodegen.

The ``cutlass`` preset runs the first two as the generator's preparation passes
(:class:`~tvm_ext.cutlass.generator.CutlassGenerator`) and chooses offloads by selection;
:func:`offload_passes` is the technique as a pass list usable alone, before legalization
(partition every match, each with the best configuration the contract check accepts,
:func:`~tvm_ext.cutlass.codegen.checked_kernels`). Convolutions that CUTLASS may take are converted to NHWC/OHWI region by
region (:mod:`~tvm_ext.cutlass.nhwc`): layout transposes appear only where NCHW tensors enter
or leave a converted region, and a region is converted only when those are few per dense
convolution; weight transposes of constants are folded.
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
from .attention import partition_attention
from .b2b import b2b_patterns
from .b2b_conv import b2b_conv_patterns
from .candidates import arch_number
from .nhwc import convert_conv_to_nhwc
from .fold_scales import FoldChannelScales
from .gemm_padding import PadGemmExtents
from .padding import PadConvChannels
from .patterns import CODEGEN_NAME, OP_KINDS, partition_for_cutlass

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
    attention = [PartitionAttention()] if "batch_matmul" in ops else []
    return passes + attention + [PartitionForCutlass(ops, b2b),
                                 relax.transform.RunCodegen(target_options={CODEGEN_NAME: options})]


def PartitionAttention() -> tvm.transform.Pass:  # noqa: N802
    """Pass form of :func:`~tvm_ext.cutlass.attention.partition_attention`: every attention core
    the fused kernel takes becomes one CUTLASS call (run before the single-operator partition)."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.PartitionAttention")
    def _partition(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return partition_attention(mod)

    return _partition


def prepare_passes(ops: tuple[str, ...] = OP_KINDS) -> list[tvm.transform.Pass]:
    """Layout passes before partitioning: NHWC conversion, per-channel scales folded into the
    weights and channel padding for convolutions, K and N padding of GEMMs CUTLASS cannot take for
    their alignment."""
    conv, gemm = "conv2d" in ops, bool({"matmul", "dense", "batch_matmul"} & set(ops))
    return (([convert_conv_to_nhwc] if conv else []) + ([FoldChannelScales] if conv or gemm else [])
            + ([PadConvChannels] if conv else []) + ([PadGemmExtents] if gemm else []))


def b2b_pattern_source(options: dict[str, str]):
    """A callable giving the back-to-back patterns (which consult the measurement database), or
    None without a database (b2b fusion is then never offered)."""
    db, arch, device = options["database"], options["arch"], options.get("device", "")
    if not db:
        return None
    return lambda: b2b_patterns(Database(db), device, arch) + b2b_conv_patterns(Database(db), device, arch)
