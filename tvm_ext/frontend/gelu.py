"""GELU written out in elementary operators recognised as one ``R.nn.gelu`` / ``R.nn.gelu_tanh``.

ONNX has a ``Gelu`` operator only from opset 20; before that exporters write it out, and that is
what BERT, ViT, ConvNeXt, Swin and Segformer (erf form) and GPT-2 (tanh form) hold::

    0.5 * x * (1 + erf(x / sqrt(2)))                                  # R.nn.gelu
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))      # R.nn.gelu_tanh

Written out, the activation is five to nine elementwise operators after a GEMM, which no GEMM
epilogue takes: every preset then runs it as its own kernel or fuses it as TVM can. As one
operator it is an activation CUTLASS fuses into the GEMM's epilogue (``dense_bias_gelu``),
as TensorRT's and onnxruntime's GELU fusions do. The factors and sums may come in any order or
grouping, ``x / sqrt(2)`` may be ``x * (1 / sqrt(2))`` and ``x ** 3`` may be ``x * x * x``; each
constant must be a scalar within :data:`RTOL` of its value (a float16 or bfloat16 one within
its own rounding). A written-out form whose parts are
also read elsewhere is still replaced (the parts stay for their other readers).

A GELU of a reshaped value is applied before the reshape (an elementwise operator commutes with
it): GPT-2's ``Conv1D`` reshapes its GEMM's output to 3-D and back around the activation, and
the epilogue can take the activation only when it reads the GEMM's sum directly
(``RemoveRedundantReshape`` then folds the pair of reshapes).

Example
-------
>>> mod = FuseGelu()(mod)      # lv54 = R.multiply(R.multiply(lv49, R.add(R.erf(...), 1)), 0.5)
>>> mod["main"]                # lv54 = R.nn.gelu(lv49)
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, rewrite_call, wildcard

from ..ir_update import with_functions

#: Relative tolerance of a float32 constant against its exact value; a narrower float constant
#: (a model exported in float16 or bfloat16) is allowed its own rounding, one unit in the last place.
RTOL = 1e-4
_ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}

_HALF, _ONE, _SQRT2, _INV_SQRT2 = 0.5, 1.0, math.sqrt(2.0), 1.0 / math.sqrt(2.0)
_TANH_SCALE, _CUBE_COEFF, _THREE = math.sqrt(2.0 / math.pi), 0.044715, 3.0


def _commuted(op: str, lhs: DFPattern, rhs: DFPattern) -> DFPattern:
    return is_op(op)(lhs, rhs) | is_op(op)(rhs, lhs)


def _product_of_three(a: DFPattern, b: DFPattern, c: DFPattern) -> DFPattern:
    """``a * b * c`` in any order and grouping."""
    forms = [_commuted("relax.multiply", _commuted("relax.multiply", *rest), last)
             for *rest, last in ((a, b, c), (a, c, b), (b, c, a))]
    return forms[0] | forms[1] | forms[2]


class _Form:
    """One written-out GELU: its pattern, the constants it needs, and the operator it becomes."""

    def __init__(self, inner: str):
        self.x = wildcard()
        self.half, self.one = is_const(), is_const()
        self.constants: list[tuple[DFPattern, tuple[float, ...]]] = [(self.half, (_HALF,)), (self.one, (_ONE,))]
        if inner == "erf":
            scale = is_const()
            scaled = is_op("relax.divide")(self.x, scale) | _commuted("relax.multiply", self.x, scale)
            self.constants.append((scale, (_SQRT2, _INV_SQRT2)))
            core, self.op = is_op("relax.erf")(scaled), relax.op.nn.gelu
        else:
            three, coeff, scale = is_const(), is_const(), is_const()
            cube = is_op("relax.power")(self.x, three) | _product_of_three(self.x, self.x, self.x)
            inner_sum = _commuted("relax.add", self.x, _commuted("relax.multiply", cube, coeff))
            core = is_op("relax.tanh")(_commuted("relax.multiply", inner_sum, scale))
            self.constants += [(three, (_THREE,)), (coeff, (_CUBE_COEFF,)), (scale, (_TANH_SCALE,))]
            self.op = relax.op.nn.gelu_tanh
        self.pattern = _product_of_three(self.x, _commuted("relax.add", core, self.one), self.half)

    def _close(self, const: tvm.ir.Constant, values: tuple[float, ...]) -> bool:
        dtype = str(const.ty.dtype)
        if not (dtype.startswith(("float", "bfloat", "int", "uint"))) or const.value.numpy().size != 1:
            return False
        value = float(const.value.numpy().astype("float32").reshape(()))
        tolerance = max(RTOL, _ULP.get(dtype, 0.0))
        return any(math.isclose(value, v, rel_tol=tolerance) for v in values)

    def rewrite(self, expr: relax.Expr, matches: dict) -> relax.Expr:
        """``R.nn.gelu(x)`` for a match whose constants are GELU's, else ``expr`` unchanged."""
        for pattern, values in self.constants:
            if pattern in matches and not self._close(matches[pattern], values):
                return expr
        x = matches[self.x]
        ty = x.ty
        if not isinstance(ty, relax.TensorType) or ty.dtype not in ("float16", "float32", "bfloat16"):
            return expr
        if not tvm_ffi.structural_equal(expr.ty, ty):   # no broadcast through a constant
            return expr
        return self.op(x)


def _before_reshapes(func: relax.Function) -> relax.Function:
    """``gelu(reshape(z, s))`` as ``reshape(gelu(z), s)``, for both GELU operators."""
    for name, op in (("relax.nn.gelu", relax.op.nn.gelu), ("relax.nn.gelu_tanh", relax.op.nn.gelu_tanh)):
        reshape = is_op("relax.reshape")(wildcard(), wildcard())

        def moved(expr: relax.Expr, matches: dict, op=op, reshape=reshape) -> relax.Expr:
            source, shape = matches[reshape].args
            return relax.op.reshape(op(source), shape)

        func = rewrite_call(is_op(name)(reshape), moved, func)
    return func


def fuse_gelu(func: relax.Function) -> relax.Function:
    """``func`` with every written-out GELU (see the module docstring) replaced by one operator,
    applied before the reshapes it reads through."""
    for inner in ("erf", "tanh"):
        form = _Form(inner)
        func = rewrite_call(form.pattern, form.rewrite, func)
    return _before_reshapes(func)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FuseGelu")
class FuseGelu:
    """Module pass: :func:`fuse_gelu` on every Relax function."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                new = fuse_gelu(func)
                if not new.same_as(func):
                    updates[gv] = new
        return with_functions(mod, updates)


__all__ = ["RTOL", "FuseGelu", "fuse_gelu"]
