"""Korch's operator fission (ASPLOS'24, §4) as Relax rewrites, run before ``LegalizeOps``.

Each rule rewrites one high-level Relax operator into an equivalent graph of primitive ops
(elementwise, reduce, broadcast, layout, linear), so a kernel selector can recombine the
pieces (e.g. a softmax's reductions with the GEMM before it). Every rule is its own module
pass; :class:`Fission` applies a selection of them. A call a rule cannot handle (unknown
attribute values, symbolic sizes a constant needs) is left unchanged and logged.

Modules, one concept each:

* :mod:`~tvm_ext.fission.registry` - rule name -> pass class (:func:`register_fission_rule`);
* :mod:`~tvm_ext.fission.rules` - the rewriting mutator and the helpers rules share;
* :mod:`~tvm_ext.fission.softmax` - softmax, log_softmax;
* :mod:`~tvm_ext.fission.norm` - layer, rms, group, instance and (inference) batch norm;
* :mod:`~tvm_ext.fission.statistics` - variance and std;
* :mod:`~tvm_ext.fission.activation` - gelu, gelu_tanh, silu;
* :mod:`~tvm_ext.fission.attention` - fused multi-head attention;
* :mod:`~tvm_ext.fission.algebraic` - a last-axis sum as a GEMM with ones (optional);
* :mod:`~tvm_ext.fission.umbrella` - :class:`Fission`.

Example
-------
>>> import tvm_ext.fission as F
>>> F.list_fission_rules()
['softmax', 'log_softmax', 'layer_norm', 'rms_norm', 'group_norm', 'instance_norm', 'batch_norm', 'variance', 'gelu', 'gelu_tanh', 'silu', 'attention']
>>> mod = F.Fission()(mod)
>>> mod = tvm.transform.Sequential([F.FissionSoftmax(), F.FissionLayerNorm()])(mod)
"""
from __future__ import annotations

from .registry import UnknownFissionRuleError, get_fission_rule, list_fission_rules, register_fission_rule
from .softmax import FissionLogSoftmax, FissionSoftmax
from .norm import FissionBatchNorm, FissionGroupNorm, FissionInstanceNorm, FissionLayerNorm, FissionRmsNorm
from .statistics import FissionVariance
from .activation import FissionGelu, FissionGeluTanh, FissionSilu
from .attention import FissionAttention
from .algebraic import SumToMatmul
from .umbrella import Fission

__all__ = [
    "Fission", "FissionAttention", "FissionBatchNorm", "FissionGelu", "FissionGeluTanh", "FissionGroupNorm",
    "FissionInstanceNorm", "FissionLayerNorm", "FissionLogSoftmax", "FissionRmsNorm", "FissionSilu",
    "FissionSoftmax", "FissionVariance", "SumToMatmul", "UnknownFissionRuleError", "get_fission_rule",
    "list_fission_rules", "register_fission_rule",
]
