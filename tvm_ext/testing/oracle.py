"""The CPU correctness oracle: build a preset's fused graph for ``llvm`` and compare it
with onnxruntime.

After fusion (and, later, selection) and before GPU scheduling, a preset's module is
target independent, so building it for the CPU checks the graph-level work of every
technique without a GPU (DESIGN.md, "How correctness is checked without a GPU", step 1).
The default tolerances, and why, are in :mod:`tvm_ext.testing.tolerance`.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import tvm
import tvm_ffi
from tvm import relax

from ..errors import NumericsMismatchError, TvmExtError
from ..driver import DEFAULT_PRESET, build, get_preset
from .compare import OutputError, assert_close, compare_outputs, mismatch_message
from .tolerance import tolerance_for

logger = logging.getLogger(__name__)

__all__ = ["CheckResult", "CpuVM", "assert_close", "build_cpu", "check_model",
           "compare_outputs", "cpu_target", "onnxruntime_outputs", "run_cpu"]

def cpu_target() -> tvm.target.Target:
    """The target the oracle builds for."""
    return tvm.target.Target({"kind": "llvm"})


class CpuVM(relax.VirtualMachine):
    """A Relax VM on the CPU that remembers the signature of ``main``.

    Attributes
    ----------
    param_names : tuple of str
        Names of ``main``'s parameters, in order.
    param_types : tuple of (shape or None, dtype)
        Static shape (``None`` when not fully static) and dtype of each parameter.
    onnx_names : dict of str to str
        Parameter name -> ONNX input name (:func:`tvm_ext.frontend.onnx_input_names`).
    preset : str
        The preset the module was built with.
    """

    def __init__(self, executable: tvm.runtime.Executable, mod: tvm.IRModule, preset: str):
        from ..frontend import onnx_input_names

        super().__init__(executable, tvm.cpu())
        main = mod["main"]
        self.param_names = tuple(p.name for p in main.params)
        self.onnx_names = onnx_input_names(mod)
        self.param_types = tuple(_param_type(p) for p in main.params)
        self.preset = preset


def _param_type(param: relax.Var) -> tuple[tuple[int, ...] | None, str]:
    ty = param.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None, str(getattr(ty, "dtype", ""))
    dims = ty.shape.values
    if all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return tuple(int(d) for d in dims), str(ty.dtype)
    return None, str(ty.dtype)


def build_cpu(mod: tvm.IRModule, preset: str = DEFAULT_PRESET) -> CpuVM:
    """Build ``mod`` with the graph stage of ``preset`` for ``llvm``.

    Raises
    ------
    PresetError
        Unknown or not yet implemented preset.
    """
    get_preset(preset)
    target = cpu_target()
    start = time.perf_counter()
    executable = build(mod, target, preset).executable
    logger.debug("built for llvm with preset %s in %.2f s", preset, time.perf_counter() - start)
    return CpuVM(executable, mod, preset)


def _arrange_inputs(vm: relax.VirtualMachine, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    names = getattr(vm, "param_names", None)
    if names is None:
        return [np.asarray(v) for v in inputs.values()]
    if set(inputs) == set(names):
        ordered = [np.asarray(inputs[n]) for n in names]
    elif set(inputs) == {vm.onnx_names[n] for n in names}:  # keyed by the ONNX names
        ordered = [np.asarray(inputs[vm.onnx_names[n]]) for n in names]
    else:
        onnx_names = [vm.onnx_names[n] for n in names]
        also = f" or by ONNX name ({', '.join(onnx_names)})" if onnx_names != list(names) else ""
        raise TvmExtError(f"main takes {len(names)} inputs by parameter name ({', '.join(names)}){also}, "
                          f"got {len(inputs)} ({', '.join(map(str, inputs))})")
    for name, value, (shape, dtype) in zip(names, ordered, vm.param_types):
        if shape is not None and tuple(value.shape) != shape:
            raise TvmExtError(f"input '{name}' has shape {tuple(value.shape)}, main expects {shape}")
        if dtype and str(value.dtype) != dtype:
            raise TvmExtError(f"input '{name}' has dtype {value.dtype}, main expects {dtype}")
    return ordered


def _to_numpy(value: Any) -> Any:
    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    if isinstance(value, tvm_ffi.Shape):
        return np.array(list(value), dtype="int64")
    if isinstance(value, (tvm_ffi.Array, list, tuple)):
        return [_to_numpy(v) for v in value]
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    raise TvmExtError(f"cannot convert a VM result of type {type(value).__name__} to numpy")


def run_cpu(vm_or_mod: relax.VirtualMachine | tvm.IRModule, inputs: Mapping[str, Any],
            *, num_outputs: int | None = None, preset: str = DEFAULT_PRESET) -> list[Any]:
    """Run ``main`` and return its outputs as NumPy arrays.

    Parameters
    ----------
    vm_or_mod : relax.VirtualMachine or tvm.IRModule
        A VM (from :func:`build_cpu` for name checks) or a module, built with ``preset``.
    inputs : mapping of str to array
        By parameter name or, for a module from :func:`tvm_ext.frontend.from_onnx`, by ONNX
        input name (names the frontend made C identifiers included).
    num_outputs : int, optional
        Number of graph outputs. With ``1``, a tuple result is one (sequence) output;
        otherwise a tuple result is the list of outputs.

    Returns
    -------
    list
        One entry per output: an array, or a list of arrays for a sequence output.
    """
    vm = build_cpu(vm_or_mod, preset) if isinstance(vm_or_mod, tvm.IRModule) else vm_or_mod
    device = tvm.cpu()
    # np.ascontiguousarray would turn 0-d arrays into 1-d ones; np.require keeps the rank.
    args = [tvm.runtime.tensor(np.require(x, requirements="C"), device) for x in _arrange_inputs(vm, inputs)]
    result = vm["main"](*args)
    converted = _to_numpy(result)
    if isinstance(converted, list) and num_outputs != 1:
        return converted
    return [converted]


# --------------------------------------------------------------------------------------
# the ONNX check
# --------------------------------------------------------------------------------------
@dataclass
class CheckResult:
    """Outcome of :func:`check_model`.

    ``max_rel_err`` is ``max |a - b| / max(|b|, atol)`` over all outputs (see
    :mod:`tvm_ext.testing.compare`); ``ok`` means every element passed
    ``|a - b| <= atol + rtol * |b|`` (so ``max_tol_ratio <= 1``), NaNs appear exactly
    where the reference has them, and shapes agree.
    """

    ok: bool
    preset: str
    rtol: float
    atol: float
    max_abs_err: float
    max_rel_err: float
    outputs: list[OutputError] = field(default_factory=list)
    fp16: bool = False
    seed: int = 0
    max_tol_ratio: float = 0.0

    @property
    def has_nan_mismatch(self) -> bool:
        """Whether some output has a NaN the reference lacks (or lacks one it has)."""
        return any(o.nan_mismatch for o in self.outputs)

    def message(self) -> str:
        """A readable summary; names every failing output."""
        mode = "fp16" if self.fp16 else "fp32"
        head = (f"preset '{self.preset}' ({mode}, seed {self.seed}): max abs err {self.max_abs_err:.3g}, "
                f"max rel err {self.max_rel_err:.3g}, {self.max_tol_ratio:.2f} of tolerance "
                f"(rtol={self.rtol:g}, atol={self.atol:g})")
        if self.ok:
            return head + ": ok"
        return mismatch_message(self.outputs, self.rtol, self.atol, header=head + ": MISMATCH")

    def raise_on_mismatch(self) -> CheckResult:
        """Return ``self`` if ok, else raise :class:`NumericsMismatchError`."""
        if not self.ok:
            raise NumericsMismatchError(self.message())
        return self


def onnx_user_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers, in graph order."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def onnxruntime_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Reference outputs from onnxruntime's CPU provider with graph optimizations off.

    onnxruntime rejects IR versions newer than it knows even for old opsets (onnx 1.23's
    ``make_model`` writes IR 14, onnxruntime 1.31 reads up to 13), so the reference runs a
    copy whose IR version is lowered to the minimum its opset imports require.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        raise TvmExtError("onnxruntime is required for the reference (pip install onnxruntime)") from None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if model.ir_version > needed:
        model = _with_ir_version(model, needed)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, dict(feeds))]


def _with_ir_version(model: onnx.ModelProto, ir_version: int) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = ir_version
    return copy


def _reference_feeds(model: onnx.ModelProto, mod: tvm.IRModule,
                     inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our inputs (by parameter name of ``mod``) keyed by ONNX name and cast to the declared
    ONNX types (fp16 -> fp32)."""
    from ..frontend import onnx_input_names

    infos = {i.name: i for i in onnx_user_inputs(model)}
    onnx_names = onnx_input_names(mod)
    if sorted(onnx_names.values()) != sorted(infos):
        raise TvmExtError(f"the imported module takes inputs {', '.join(onnx_names.values())} but the ONNX "
                          f"graph has {', '.join(infos)}")
    feeds = {}
    for param, value in inputs.items():
        info = infos[onnx_names[param]]
        elem = info.type.tensor_type.elem_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else value.dtype
        feeds[info.name] = np.asarray(value).astype(dtype)
    return feeds


def check_model(model: str | onnx.ModelProto, preset: str = DEFAULT_PRESET, *,
                shapes: Mapping[str, Sequence[int]] | None = None, fp16: bool = False,
                bind: Mapping[str, Any] | None = None, seed: int = 0, rtol: float | None = None, atol: float | None = None) -> CheckResult:
    """Import an ONNX model, build it for the CPU with ``preset`` and compare with onnxruntime.

    Parameters
    ----------
    model : str or onnx.ModelProto
        Path or proto.
    preset : str
        Preset whose graph stage is built.
    shapes : mapping, optional
        Static shapes for inputs with free dimensions (see :func:`tvm_ext.frontend.from_onnx`).
    fp16 : bool
        Import as a pure fp16 model; the reference stays onnxruntime in fp32 on the same
        (fp16-representable) input values.
    bind : mapping, optional
        Values of graph inputs made constants (in both builds; see :func:`tvm_ext.frontend.from_onnx`).
    seed : int
        Seed of the random inputs (:func:`tvm_ext.frontend.random_inputs`).
    rtol, atol : float, optional
        Override the defaults (:func:`~tvm_ext.testing.tolerance.tolerance_for` of float16 or float32).

    Returns
    -------
    CheckResult
        Never raises on a mismatch; call :meth:`CheckResult.raise_on_mismatch` for that.
    """
    from ..frontend import from_onnx, load_onnx, random_inputs
    from ..frontend.bind import bind_inputs

    get_preset(preset)
    default_rtol, default_atol = tolerance_for("float16" if fp16 else "float32")
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol

    proto = bind_inputs(load_onnx(model), bind or {})
    mod = from_onnx(proto, shapes=shapes, fp16=fp16)
    inputs = random_inputs(mod, seed=seed)
    reference = onnxruntime_outputs(proto, _reference_feeds(proto, mod, inputs))
    ours = run_cpu(build_cpu(mod, preset), inputs, num_outputs=len(proto.graph.output))
    names = [o.name for o in proto.graph.output]
    errors = compare_outputs(ours, reference, rtol=rtol, atol=atol, names=names)
    finite = [e for e in errors if e.size]
    return CheckResult(
        ok=all(e.ok for e in errors), preset=preset, rtol=rtol, atol=atol,
        max_abs_err=max((e.max_abs_err for e in finite), default=0.0),
        max_rel_err=max((e.max_rel_err for e in finite), default=0.0),
        outputs=errors, fp16=fp16, seed=seed,
        max_tol_ratio=max((e.tol_ratio for e in finite), default=0.0))
