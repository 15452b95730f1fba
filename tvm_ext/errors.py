"""Exception types raised by tvm_ext, and the ones TVM raises.

Every error a user can trigger with bad input derives from :class:`TvmExtError`, so the
CLI can print a one-line message (no traceback) and exit non-zero.

:data:`TVM_ERRORS` is what to catch around a call into TVM that may fail on valid input
(a schedule primitive that refuses, a lowering that rejects a function, a pass that cannot
handle a graph). This module imports nothing, so the runtime-only bench bundle can copy it.
"""
from __future__ import annotations

#: The exceptions a failing TVM call raises. TVM's C++ errors reach Python through tvm_ffi
#: as these builtin types (``tvm_ffi.core.ERROR_NAME_TO_TYPE``):
#:
#: * ``RuntimeError`` - failed ``ICHECK``s (``tvm.error.InternalError``), schedule primitives
#:   that refuse (``ScheduleError``), ``DiagnosticError``, ``OpError``: all subclass it;
#: * ``ValueError`` - bad values: an unknown dtype name, a target kind that does not exist;
#: * ``TypeError`` - an FFI call with an argument of the wrong type ("Mismatched type on argument");
#: * ``AttributeError`` - a missing registry entry (``Op.get`` of an unregistered operator);
#: * ``KeyError`` - a lookup in a TVM ``Map`` that lacks the key;
#: * ``IndexError`` - an index past the end of a TVM ``Array``.
#:
#: Python code inside TVM (dlight rules, the ONNX converters) can also fail with
#: ``AssertionError``; the places that call such code add it, each saying why.
#: ``MemoryError``, which tvm_ffi also maps, is left to propagate.
TVM_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, TypeError, AttributeError, KeyError, IndexError)


class TvmExtError(Exception):
    """Base class of every user-facing tvm_ext error."""


class RuntimeOnlyError(TvmExtError, AttributeError):
    """A part of tvm_ext that needs TVM's compiler was asked for under a runtime-only TVM.

    Also an ``AttributeError``: it is raised where ``tvm_ext.<subpackage>`` is looked up.
    """


class ModelLoadError(TvmExtError):
    """The model file is missing, truncated, or not an ONNX model."""


class UnboundDimensionError(TvmExtError):
    """A model input has a free (symbolic) dimension that ``shapes`` does not bind."""


class ShapeOverrideError(TvmExtError):
    """A shape override names an unknown input or has the wrong rank."""


class InputBindingError(TvmExtError):
    """A value bound to a graph input names no such input, or does not fit its declared type."""


class ModelConversionError(TvmExtError):
    """The importer failed on a model that loaded and passed the operator check."""


class UnsupportedOpsError(TvmExtError):
    """The model uses operators the importer cannot convert; lists all of them at once."""

    def __init__(self, ops: dict[str, int]):
        self.ops = dict(sorted(ops.items()))
        listed = ", ".join(f"{name} (x{count})" for name, count in self.ops.items())
        super().__init__(f"unsupported ONNX operators: {listed}")


class UnknownDeviceError(TvmExtError):
    """No device description exists for the requested name (see :func:`tvm_ext.hardware.devices_dir`)."""


class PresetError(TvmExtError):
    """The requested preset does not exist or is not implemented yet."""


class NumericsMismatchError(TvmExtError):
    """A compiled result disagrees with the reference beyond tolerance."""


class DeviceConfigError(TvmExtError):
    """A device description file is malformed or lacks a requested entry."""


class AnalysisError(TvmExtError):
    """A tile, region or node set given to the analysis layer is invalid (wrong rank, unknown tensor, ...)."""


class GpuRuntimeError(TvmExtError):
    """A GPU machine's CUDA runtime is broken (the driver loads, TVM cannot use the device)."""


class KernelCompileError(TvmExtError):
    """CUDA code cannot be compiled here.

    nvcc reports errors, the CUDA toolkit (or another tool the build needs: TVM's CUDA runtime,
    ``nm``, a C compiler) is missing, the arch name is not one nvcc takes, or an exported
    library holds CUDA source instead of compiled device code.
    """


class BenchError(TvmExtError):
    """A benchmark bundle, its manifest or a measurement run is invalid or cannot proceed."""


class SkeletonError(TvmExtError):
    """A skeleton's refill record is missing, malformed or does not match its graph."""
