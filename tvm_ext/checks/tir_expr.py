"""Lowered TIR expressions as Python closures over one thread block's lanes.

An expression compiles once into a closure ``f(block) -> value``; a value is a Python number
(uniform over the block's threads), a numpy array with one entry per thread (``(T,)``) or, for a
vector type, ``(T, lanes)`` / ``(lanes,)``. Arithmetic follows CUDA's: C integer division and
remainder, ``fmaxf``/``fminf`` for float min and max, float16 rounded at every operation.
Loads, warp shuffles and ``if_then_else`` honour the block's active-lane mask, so a lane a
branch does not take reads nothing (no out-of-bounds access, no log entry).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special
import tvm
from tvm import tirx

from ..analysis.work import TRANSCENDENTAL
from ..errors import TvmExtError
from .values import element_dtype, lanes_of
from .wmma import OPS as TENSOR_CORE_OPS
from .wmma import access_ptr

Closure = Callable[[Any], Any]


class Unemulated(TvmExtError):
    """The kernel uses something the emulator does not model (the kernel is listed unchecked)."""


def _fix(value, dt: np.dtype):
    """``value`` in element type ``dt`` (arrays cast; uniform ints stay Python ints)."""
    if isinstance(value, np.ndarray):
        return value if value.dtype == dt else value.astype(dt)
    if dt.kind in "iu":
        return int(value)
    if dt.kind == "b":
        return bool(value)
    return dt.type(value)


def _trunc_div(a, b):
    if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
        b = b or 1
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    b = np.where(b == 0, 1, b)
    q = np.floor_divide(a, b)
    return np.where(((a - q * b) != 0) & ((np.asarray(a) < 0) != (b < 0)), q + 1, q)


def _nonzero(b):
    """A divisor with 0 replaced by 1 (a lane that divides by zero computes nothing it keeps)."""
    return np.where(b == 0, 1, b) if isinstance(b, np.ndarray) else (b or 1)


def _floor_div(a, b, dt):
    if dt.kind == "f":
        return np.floor(a / b)
    return a // _nonzero(b)


def _floor_mod(a, b, dt):
    if dt.kind == "f":
        return a - np.floor(a / b) * b
    return a % _nonzero(b)


def binary_op(kind: str, dt: np.dtype):
    """The numpy function of a binary TIR node kind (``"FloorDiv"``, ``"LT"``, ...) for element
    type ``dt``, CUDA semantics; None for another kind."""
    floats = dt.kind == "f"
    table = {
        "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
        "Div": (lambda a, b: a / b) if floats else _trunc_div,
        "Mod": (lambda a, b: np.fmod(a, b)) if floats else (lambda a, b: a - _trunc_div(a, b) * b),
        "FloorDiv": lambda a, b: _floor_div(a, b, dt), "FloorMod": lambda a, b: _floor_mod(a, b, dt),
        "Min": np.fmin if floats else np.minimum, "Max": np.fmax if floats else np.maximum,
        "EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
        "GE": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
        "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor,
        "LShift": np.left_shift, "RShift": np.right_shift,
    }
    return table.get(kind)


_UNARY_MATH = {
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x).astype(np.asarray(x).dtype),
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.rint, "nearbyint": np.rint,
    "trunc": np.trunc, "erf": scipy.special.erf, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
}
_BINARY_MATH = {"pow": np.power, "fmod": np.fmod, "atan2": np.arctan2, "copysign": np.copysign,
                "hypot": np.hypot, "nextafter": np.nextafter}
#: CUDA device functions TVM's codegen may name directly (call_extern / call_pure_extern).
_EXTERN = {"__expf": "exp", "expf": "exp", "hexp": "exp", "__logf": "log", "logf": "log", "hlog": "log",
           "sqrtf": "sqrt", "hsqrt": "sqrt", "rsqrtf": "rsqrt", "hrsqrt": "rsqrt", "tanhf": "tanh",
           "__tanhf": "tanh", "erff": "erf", "fabsf": "fabs", "__habs": "fabs", "floorf": "floor",
           "ceilf": "ceil"}
#: Intrinsic calls that are the binary node kinds of :func:`binary_op`.
_INTRINSIC_BINARY = {"shift_left": "LShift", "shift_right": "RShift", "bitwise_and": "BitwiseAnd",
                     "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor"}


def _pointer(value):
    """(storage, byte offset) of a pointer value or of a buffer view (what a data variable of a
    buffer declared over merged shared memory is bound to)."""
    return value.pointer() if hasattr(value, "pointer") else value


def dtype_of(expr) -> np.dtype:
    """Element numpy dtype of a TIR expression."""
    return element_dtype(expr.ty.dtype)


class ExprCompiler:
    """Closures for expressions; ``slot(var)`` gives a variable's place in the block's environment.

    ``memory`` supplies ``load(view, index, block, stmt)``; ``warp`` supplies the shuffle and
    active-mask intrinsics (:mod:`tvm_ext.checks.emulator`).
    """

    def __init__(self, slot: Callable[[Any], int], memory, warp) -> None:
        self.slot, self.memory, self.warp = slot, memory, warp
        self.stmt = -1          # statement whose expressions are being compiled (for the access log)

    def __call__(self, e) -> Closure:
        kind = type(e).__name__
        method = getattr(self, "_" + kind, None)
        if method is not None:
            return method(e)
        op = binary_op(kind, dtype_of(e.a)) if hasattr(e, "b") else None
        if op is not None:
            return self._binop(e, op)
        raise Unemulated(f"expression {kind} is not emulated")

    # constants and variables
    def _IntImm(self, e):
        dt = dtype_of(e)
        value = bool(e.value) if dt.kind == "b" else int(e.value)
        return lambda b: value

    def _FloatImm(self, e):
        value = dtype_of(e).type(e.value)
        return lambda b: value

    def _Var(self, e):
        i = self.slot(e)
        return lambda b: b.env[i]

    def _binop(self, e, op):
        return self._apply(op, self(e.a), self(e.b), dtype_of(e))

    @staticmethod
    def _apply(op, fa, fb, dt):
        def run(b):
            with np.errstate(all="ignore"):
                return _fix(op(fa(b), fb(b)), dt)
        return run

    def _Not(self, e):
        fa = self(e.a)
        return lambda b: np.logical_not(fa(b))

    def _BitwiseNot(self, e):
        fa = self(e.a)
        return lambda b: np.invert(fa(b))

    def _Cast(self, e):
        fv, dt = self(e.value), dtype_of(e)

        def run(b):
            with np.errstate(all="ignore"):
                return _fix(np.asarray(fv(b)).astype(dt) if dt.kind == "b" else fv(b), dt)
        return run

    def _Select(self, e):
        return self._masked_choice(self(e.condition), self(e.true_value), self(e.false_value), dtype_of(e),
                                   lanes_of(e.ty.dtype))

    def _masked_choice(self, fc, ft, ff, dt, lanes: int = 1):
        def run(b):
            c = fc(b)
            if not isinstance(c, np.ndarray):
                return ft(b) if c else ff(b)
            saved = b.mask
            c = np.broadcast_to(c, saved.shape) if c.ndim == 1 else c
            rows = c if c.ndim == 1 else c.any(axis=-1)
            b.mask = saved & rows
            t = ft(b) if b.mask.any() else 0
            rows_f = ~c if c.ndim == 1 else ~c.all(axis=-1)
            b.mask = saved & rows_f
            f = ff(b) if b.mask.any() else 0
            b.mask = saved
            cond = c[..., None] if lanes > 1 and c.ndim == 1 else c
            return _fix(np.where(cond, t, f), dt)
        return run

    def _Let(self, e):
        i, fv, fb = self.slot(e.var), self(e.value), self(e.body)

        def run(b):
            b.env[i] = fv(b)
            return fb(b)
        return run

    def _Ramp(self, e):
        fb, fs, lanes = self(e.base), self(e.stride), int(e.lanes)
        steps = np.arange(lanes, dtype=np.int64)
        return lambda b: np.asarray(fb(b), dtype=np.int64)[..., None] + np.asarray(fs(b), dtype=np.int64)[..., None] * steps

    def _Broadcast(self, e):
        fv, lanes, dt = self(e.value), int(e.lanes), dtype_of(e)
        return lambda b: np.repeat(np.asarray(fv(b), dtype=dt)[..., None], lanes, axis=-1)

    def _Shuffle(self, e):
        parts = [self(v) for v in e.vectors]
        indices = [int(i) for i in e.indices]

        def run(b):
            values = [np.asarray(p(b)) for p in parts]     # each part once: loads log and count
            whole = np.concatenate([v[..., None] if v.ndim < 1 else v for v in values], axis=-1)
            picked = whole[..., indices]
            return picked[..., 0] if len(indices) == 1 else picked
        return run

    def _TensorLoad(self, e):
        if len(e.indices) != 1:
            raise Unemulated("a load with more than one index (buffer not flattened)")
        view, index, stmt, memory = self.slot(e.source), self(e.indices[0]), self.stmt, self.memory
        lanes = lanes_of(e.ty.dtype)
        return lambda b: memory.load(b.env[view], index(b), b, stmt, lanes)

    _BufferLoad = _TensorLoad

    def _StringImm(self, e):
        value = str(e.value)
        return lambda b: value

    # calls
    def _Call(self, e):
        if not isinstance(e.op, tvm.ir.Op):
            raise Unemulated(f"a call of {e.op} is not emulated")
        name = e.op.name.split(".", 1)[-1] if e.op.name.startswith(("tirx.", "prim.")) else e.op.name
        dt = dtype_of(e) if isinstance(e.ty, tvm.ir.PrimType) and str(e.ty.dtype) not in ("handle", "void", "") else None
        if name in ("call_extern", "call_pure_extern"):
            callee = str(e.args[0].value)
            mapped = _EXTERN.get(callee)
            if mapped is None:
                raise Unemulated(f"extern call {callee} is not emulated")
            return self._math(mapped, [self(a) for a in list(e.args)[1:]], dt)
        if name in _UNARY_MATH or name in _BINARY_MATH:
            return self._math(name, [self(a) for a in e.args], dt)
        args = list(e.args)
        if name == "if_then_else":
            return self._masked_choice(self(args[0]), self(args[1]), self(args[2]), dt, lanes_of(e.ty.dtype))
        if name in ("likely", "tvm_thread_invariant"):
            return self(args[0])
        if name == "reinterpret":
            f = self(args[0])
            return lambda b: np.ascontiguousarray(np.asarray(f(b))).view(dt)
        if name == "buffer_data":
            view = self.slot(args[0])
            return lambda b: b.env[view].pointer()
        if name == "type_annotation":
            return lambda b: dt
        if name == "tvm_access_ptr":
            data, offset = self(args[1]), self(args[2])
            elem = element_dtype(args[0].ty.dtype)
            # the data is a pointer (``buffer_data``) or a buffer's data variable, bound to its view
            return lambda b: access_ptr(elem, _pointer(data(b)), offset(b))
        if name in TENSOR_CORE_OPS:
            parts, stmt = [self(a) for a in args], self.stmt
            return lambda b: self.warp.tensor_core(b, name, [p(b) for p in parts], stmt)
        if name == "tvm_warp_activemask":
            return lambda b: self.warp.activemask(b)
        if name in ("tvm_warp_shuffle", "tvm_warp_shuffle_down", "tvm_warp_shuffle_up"):
            mode = name.rsplit("_", 1)[-1] if name != "tvm_warp_shuffle" else "idx"
            mask, value, lane, width = (self(a) for a in args[:4])
            stmt = self.stmt
            return lambda b: self.warp.shuffle(b, mode, mask(b), value(b), lane(b), width(b), stmt)
        if name in _INTRINSIC_BINARY:
            return self._apply(binary_op(_INTRINSIC_BINARY[name], dt), self(args[0]), self(args[1]), dt)
        if name == "bitwise_not":
            fa = self(args[0])
            return lambda b: np.invert(fa(b))
        raise Unemulated(f"intrinsic {e.op.name} is not emulated")

    def _math(self, name, args: list[Closure], dt):
        fn = _UNARY_MATH.get(name) or _BINARY_MATH[name]
        counted = name in TRANSCENDENTAL

        def run(b):
            values = [np.asarray(a(b)) for a in args]
            with np.errstate(all="ignore"):
                out = fn(*[v.astype(np.float32) if v.dtype == np.float16 else v for v in values])
            if counted:   # executed work: the lanes that run it
                b.launch.count(transcendentals=b.rows().size * (out.shape[-1] if np.ndim(out) == 2 else 1))
            return _fix(np.asarray(out), dt) if dt is not None else out
        return run


def is_sync(stmt) -> str | None:
    """``"block"`` for ``__syncthreads``, ``"warp"`` for ``__syncwarp``, ``"grid"`` for a grid
    barrier, else None."""
    if not isinstance(stmt, tirx.Evaluate) or not isinstance(stmt.value, tvm.ir.Call):
        return None
    op = stmt.value.op
    name = op.name if isinstance(op, tvm.ir.Op) else ""
    if name == "tirx.cuda.grid_sync":
        return "grid"
    if name == "tirx.tvm_storage_sync":
        scope = str(stmt.value.args[0].value)
        return {"shared": "block", "shared.dyn": "block", "warp": "warp"}.get(scope, scope)
    return None


__all__ = ["ExprCompiler", "Unemulated", "dtype_of", "is_sync"]
