"""``Fission``: the selected fission rules (all by default) as one module pass.

Example
-------
>>> from tvm_ext.fission import Fission
>>> mod = Fission()(mod)                                  # every registered rule
>>> mod = Fission(["softmax", "layer_norm"])(mod)         # a selection
>>> mod = Fission(algebraic=True)(mod)                    # + last-axis sums as GEMMs with ones
"""
from __future__ import annotations

from collections.abc import Sequence

import tvm

from .algebraic import SumToMatmul
from .registry import get_fission_rule, list_fission_rules


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.Fission")
class Fission:
    """Module pass: apply the fission rules ``ops`` (each its own pass, in the given order).

    Parameters
    ----------
    ops : sequence of str or str, optional
        Rule names (:func:`~tvm_ext.fission.list_fission_rules`); all rules when None.
    algebraic : bool
        Then rewrite every float sum over the last axis into a GEMM with a ones vector
        (:class:`~tvm_ext.fission.algebraic.SumToMatmul`, Korch Fig. 2b).

    Raises
    ------
    UnknownFissionRuleError
        ``ops`` names a rule that does not exist.

    Example
    -------
    >>> seq = tvm.transform.Sequential([Fission(["softmax", "gelu"]), relax.transform.LegalizeOps()])
    """

    def __init__(self, ops: Sequence[str] | str | None = None, algebraic: bool = False):
        names = list_fission_rules() if ops is None else [ops] if isinstance(ops, str) else list(ops)
        self.ops = list(dict.fromkeys(names))
        self.passes = [get_fission_rule(name)() for name in self.ops]
        if algebraic:
            self.passes.append(SumToMatmul())

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return tvm.transform.Sequential(self.passes, name="tvm_ext.FissionRules")(mod)


__all__ = ["Fission"]
