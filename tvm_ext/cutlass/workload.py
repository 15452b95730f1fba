"""What an offloaded composite computes: GEMM / convolution problem, dtypes, epilogue, operands.

:func:`workload_from_function` reads a ``Codegen="tvm_ext_cutlass"`` function made by the
partitioner; the codegen, the database and the profiler all speak in these workloads. Every
workload follows the :class:`Workload` protocol; the parser of each composite operator is
registered with :func:`register_parser` by the module that defines its workload (single
GEMMs and convolutions here, back-to-back pairs in :mod:`.b2b` and :mod:`.b2b_conv`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import tvm
from tvm import relax

from .checks import dtype_of, split_bias_residual, static_shape
from .epilogue import SOURCE_OPERANDS, Epilogue
from .errors import CutlassCodegenError
from .patterns import CompositeName

#: Roles of a composite's parameters, in call order.
ROLE_A, ROLE_B, ROLE_BIAS, ROLE_RESIDUAL, ROLE_SCALAR = "a", "b", "bias", "residual", "scalar"
#: Roles of the fused attention core's query, key and value.
ROLE_Q, ROLE_K, ROLE_V = "q", "k", "v"


class Workload(Protocol):
    """What every CUTLASS workload provides."""

    #: ``"gemm"``, ``"conv2d"``, ``"b2b_gemm"`` or ``"b2b_conv2d"``: the key of every per-kind table.
    kind: str
    op: str
    dtype: str
    final_dtype: str
    #: Independent problems of one launch (GEMM batch; 1 otherwise).
    batch: int

    def key(self) -> str:
        """Database key of the problem (epilogue-independent)."""

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        """M, N, K of the (first) GEMM, per batch entry."""

    @property
    def flops(self) -> int:
        """Floating-point work of one call."""

    @property
    def max_alignment(self) -> tuple[int, int, int]:
        """Largest vector widths (elements) of A, B and C."""


@dataclass(frozen=True)
class GemmWorkload:
    """``D[batch, M, N] = epilogue(A[batch, M, K] @ B[batch, K, N])`` (B may be stored ``[N, K]``).

    ``batch == 1`` for 2-D weights (leading axes of A fold into M); ``b_batched`` tells whether
    B has its own batch axis.
    """

    op: str
    batch: int
    m: int
    n: int
    k: int
    dtype: str
    out_dtype: str
    final_dtype: str
    layout_b: str          # "row": B is [K, N]; "col": B is [N, K] (dense weight)
    epilogue: Epilogue
    b_batched: bool = False

    kind = "gemm"

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k

    def key(self) -> str:
        """Database key of the problem (epilogue-independent)."""
        return (f"gemm_b{self.batch}_m{self.m}_n{self.n}_k{self.k}_"
                f"{'rr' if self.layout_b == 'row' else 'rc'}{'_bb' if self.b_batched else ''}")

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def max_alignment(self) -> tuple[int, int, int]:
        """Largest vector widths (elements, 128-bit max) that the leading dims allow for A, B, C."""
        lead_b = self.n if self.layout_b == "row" else self.k
        return (_align(self.k, self.dtype), _align(lead_b, self.dtype), _align(self.n, self.final_dtype))


@dataclass(frozen=True)
class Conv2dWorkload:
    """NHWC/OHWI forward convolution as an implicit GEMM (M = N*P*Q, N = K, K = R*S*C)."""

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    p: int
    q: int
    pad: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    dtype: str
    out_dtype: str
    final_dtype: str
    epilogue: Epilogue

    op = "conv2d"
    kind = "conv2d"
    batch = 1

    def key(self) -> str:
        return (f"conv2d_n{self.n}_h{self.h}_w{self.w}_c{self.c}_k{self.k}_r{self.r}_s{self.s}"
                f"_pad{self.pad[0]}x{self.pad[1]}_str{self.stride[0]}x{self.stride[1]}"
                f"_dil{self.dilation[0]}x{self.dilation[1]}")

    @property
    def gemm_mnk(self) -> tuple[int, int, int]:
        return self.n * self.p * self.q, self.k, self.r * self.s * self.c

    @property
    def flops(self) -> int:
        m, n, k = self.gemm_mnk
        return 2 * m * n * k

    @property
    def max_alignment(self) -> tuple[int, int, int]:
        return (_align(self.c, self.dtype), _align(self.c, self.dtype), _align(self.k, self.final_dtype))


def _align(extent: int, dtype: str) -> int:
    bits = tvm.DataType(dtype).bits
    for vec in (8, 4, 2, 1):
        if vec * bits <= 128 and extent % vec == 0:
            return vec
    return 1


@dataclass(frozen=True)
class Offload:
    """One offloaded function: its symbol, workload and the role of each parameter."""

    symbol: str
    composite: str
    workload: GemmWorkload | Conv2dWorkload
    roles: tuple[str, ...]
    param_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]


def composite_function(func: relax.Function) -> tuple[str, relax.Function]:
    """The composite name and inner function of a ``Codegen`` function."""
    if "Composite" in (func.attrs or {}):
        return str(func.attrs["Composite"]), func
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Function) and "Composite" in (value.attrs or {}):
                return str(value.attrs["Composite"]), value
    raise CutlassCodegenError("function has no composite (run the tvm_ext_cutlass partitioner first)")


def _bindings(func: relax.Function) -> dict:
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


#: ``parser(composite, inner_function) -> (workload, {parameter: role})``.
WorkloadParser = Callable[[CompositeName, relax.Function], tuple]
_PARSERS: dict[str, WorkloadParser] = {}


def register_parser(op: str, parser: WorkloadParser) -> None:
    """Register the workload parser of composites of operator ``op`` (``"dense"``, ``"b2b_gemm"``...)."""
    _PARSERS[op] = parser


def workload_from_function(func: relax.Function, symbol: str = "") -> Offload:
    """Describe a partitioned function (outer ``Codegen`` function or its composite).

    Raises
    ------
    CutlassCodegenError
        No composite, or a composite operator without a registered parser.
    """
    name, inner = composite_function(func)
    comp = CompositeName.parse(name)
    if comp.op not in _PARSERS:
        raise CutlassCodegenError(f"no workload parser for composite operator '{comp.op}' ({name})")
    workload, roles = _PARSERS[comp.op](comp, inner)
    return Offload(symbol=symbol or str(func.attrs.get("global_symbol", "")), composite=name, workload=workload,
                   roles=tuple(roles[p] for p in inner.params),
                   param_shapes=tuple(static_shape(p) or () for p in inner.params),
                   out_shape=static_shape(inner.body.body) or ())


def _single_op(comp: CompositeName, inner: relax.Function) -> tuple:
    """Workload and roles of a single GEMM or convolution composite."""
    name = comp.name
    values = _bindings(inner)
    params = list(inner.params)
    op_call = next((v for v in values.values() if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                    and v.op.name in ("relax.matmul", "relax.nn.conv2d")), None)
    if op_call is None:
        raise CutlassCodegenError(f"composite {name} has no matmul or conv2d")
    roles = {p: ROLE_SCALAR for p in params}
    lhs, rhs = op_call.args
    if comp.op == "dense":
        rhs = values[rhs].args[0]
    roles[lhs], roles[rhs] = ROLE_A, ROLE_B
    operands = _source_operands(values, op_call, len(SOURCE_OPERANDS[comp.epilogue.source]),
                                through=comp.epilogue.residual_after_act)
    out_shape = static_shape(op_call)
    if comp.epilogue.source == "bias_residual" and not comp.epilogue.residual_after_act:
        operands = list(split_bias_residual(*operands, out_shape))   # after the act, the adds' order says
    for operand, role in zip(operands, SOURCE_OPERANDS[comp.epilogue.source]):
        if operand not in roles:
            raise CutlassCodegenError(f"composite {name}: the {role} operand is not a parameter")
        roles[operand] = ROLE_BIAS if role == "bias" else ROLE_RESIDUAL
    out_dtype = dtype_of(op_call)
    final_dtype = dtype_of(inner.body.body)
    if comp.op == "conv2d":
        workload = _conv_workload(op_call, lhs, rhs, comp.epilogue, out_dtype, final_dtype)
    else:
        workload = _gemm_workload(comp.op, lhs, rhs, comp.epilogue, out_dtype, final_dtype)
    return workload, roles


def _source_operands(values: dict, op_call: relax.Call, count: int, through: bool = False) -> list:
    """The operands of the first ``count`` adds chained after ``op_call`` (either argument order);
    with ``through``, the chain also runs through the other ops that read it (an activation
    between the bias and the residual add)."""
    chain = next(var for var, value in values.items() if value.same_as(op_call))
    operands = []
    for var, value in values.items():
        if len(operands) == count:
            break
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            continue
        reads = any(a.same_as(chain) for a in value.args)
        if value.op.name == "relax.add":
            lhs, rhs = value.args
            if lhs.same_as(chain) or rhs.same_as(chain):
                operands.append(rhs if lhs.same_as(chain) else lhs)
                chain = var
        elif through and operands and reads:
            chain = var
    if len(operands) != count:
        raise CutlassCodegenError(f"expected {count} epilogue adds after the operator, found {len(operands)}")
    return operands


def _gemm_workload(op: str, lhs, rhs, ep: Epilogue, out_dtype: str, final_dtype: str) -> GemmWorkload:
    a_shape, b_shape = static_shape(lhs), static_shape(rhs)
    if a_shape is None or b_shape is None:
        raise CutlassCodegenError("GEMM operands need static shapes")
    k = a_shape[-1]
    if op == "dense":
        n, layout_b = b_shape[0], "col"
    else:
        n, layout_b = b_shape[-1], "row"
    batched = op == "batch_matmul"
    batch = 1
    for d in a_shape[:-2]:
        batch *= d
    m = a_shape[-2] if batched else a_shape[-2] * batch
    return GemmWorkload(op=op, batch=batch if batched else 1, m=m, n=n, k=k, dtype=dtype_of(lhs),
                        out_dtype=out_dtype, final_dtype=final_dtype, layout_b=layout_b, epilogue=ep,
                        b_batched=batched)


def _conv_workload(call: relax.Call, data, weight, ep: Epilogue, out_dtype: str, final_dtype: str) -> Conv2dWorkload:
    n, h, w, c = static_shape(data)
    k, r, s, _ = static_shape(weight)
    _, p, q, _ = static_shape(call)
    pad = [int(v) for v in call.attrs.padding]
    if pad[0] != pad[2] or pad[1] != pad[3]:
        raise CutlassCodegenError(f"asymmetric padding {pad} is not supported")
    return Conv2dWorkload(n=n, h=h, w=w, c=c, k=k, r=r, s=s, p=p, q=q, pad=(pad[0], pad[1]),
                          stride=tuple(int(v) for v in call.attrs.strides),
                          dilation=tuple(int(v) for v in call.attrs.dilation),
                          dtype=dtype_of(data), out_dtype=out_dtype, final_dtype=final_dtype, epilogue=ep)


for _op in ("dense", "matmul", "batch_matmul", "conv2d"):
    register_parser(_op, _single_op)
