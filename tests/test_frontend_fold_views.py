"""Layout calls on constants folded in numpy (``tvm_ext.frontend.fold_views``): the module
``FoldConstant`` then produces is the one it produces alone, without compiling those calls."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.frontend.fold_views import FoldConstantViews, fold_constant_views

_W = np.arange(24, dtype="float32").reshape(2, 3, 4)
_BOUND = np.array(np.nan, dtype="float32")      # a Clip without a bound, as the importer writes it


def _module():
    w, bound = relax.const(_W), relax.const(_BOUND)

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((4, 6), "float32")):
            with R.dataflow():
                a = R.reshape(w, R.shape([4, 6]))
                b = R.permute_dims(a, axes=[1, 0])
                c = R.expand_dims(b, axis=[0])
                d = R.squeeze(c, axis=[0])
                e = R.flatten(d)
                nan = R.isnan(bound)
                lo = R.where(nan, R.const(-3.0, "float32"), bound)
                y = R.add(x, R.permute_dims(d, axes=[1, 0]))
                z = R.maximum(y, lo)
                R.output(z, e)
            return (z, e)

    return Module


def _ops(mod: tvm.IRModule) -> set[str]:
    found: set[str] = set()
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
                found.add(binding.value.op.name)
    return found


def test_constant_layout_calls_fold_to_what_fold_constant_makes():
    mod = _module()
    folded = FoldConstantViews()(mod)
    assert _ops(folded) == {"relax.add", "relax.maximum"}     # every constant call is a constant now
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(folded), relax.transform.FoldConstant()(mod))


def test_a_call_on_a_non_constant_stays():
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                y = R.reshape(x, R.shape([3, 2]))
                R.output(y)
            return y

    assert fold_constant_views(Module).same_as(Module)


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_dtypes_numpy_cannot_hold_are_left_to_fold_constant(dtype):
    w = relax.const(np.zeros((2, 2), "float32"))

    @I.ir_module
    class Module:
        @R.function
        def main():
            with R.dataflow():
                c = R.astype(w, dtype)
                y = R.reshape(c, R.shape([4]))
                R.output(y)
            return y

    assert "relax.reshape" in _ops(fold_constant_views(Module))
