"""Count every GPU kernel launch from compiled artefacts, and say who made each kernel.

Launches per inference = for every PrimFunc the VM calls during one call of ``main``:
(calls of that PrimFunc) x (device kernels it launches per call), plus every call of a library
kernel (an external symbol listed in :data:`~tvm_ext.select.attrs.LIBRARY_KERNELS_ATTR`, e.g. a
CUTLASS GEMM) x its launches per call.

* Calls are read from the lowered Relax ``main`` (after ``CallTIRRewrite`` a call of a
  PrimFunc is a plain ``Call`` whose ``op`` is its ``GlobalVar``, a library call an
  ``ExternFunc``); calls of other Relax functions (and Relax functions passed by ``GlobalVar``,
  e.g. CUDA-graph capture functions) are followed.
* Kernels per call are read from the TIR after host/device splitting: the host function of
  a PrimFunc launches its device kernels (``<func>_kernel``, ``<func>_kernel_1``, ...)
  through ``tirx.call_ffi_kernel``; a launch inside a host loop counts once per iteration.
  :func:`tvm_ext.select.launch.launch_regions` predicts the same number from the scheduled
  PrimFunc alone (a test checks they agree).
* Who made each kernel is read from the shared attributes (:mod:`tvm_ext.select.attrs`):
  generator, schedule rule and plan.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..checks.lowered import lowered_module
from ..errors import TvmExtError
from ..select.attrs import GENERATOR_ATTR, LIBRARY_KERNELS_ATTR, PLAN_ATTR, RULE_ATTR, func_attr
from ..select.plan import plan_from_text

_CALL_FFI_KERNEL = "tirx.call_ffi_kernel"


@dataclass(frozen=True)
class KernelLaunches:
    """Launch facts of one PrimFunc or library kernel.

    Attributes
    ----------
    func : str
        PrimFunc name (its ``GlobalVar``) or the library kernel's external symbol.
    calls : int
        Calls per inference from the lowered ``main``.
    kernels_per_call : int
        Device kernels one call launches.
    kernel_names : tuple of str
        Names of those device kernels (``__global__`` functions; the symbol for a library kernel).
    generator : str
        Who built it: ``"stitch"``, ``"cutlass"``, ``"dlight"``, ...
    rule : str
        What scheduled it (a generator's verdict or dlight's rule); ``"library"`` for library kernels.
    plan : str
        One-line summary of its plan ('' when it has none).
    modelled_s : float or None
        Modelled time of one call (the cost model's, see ``cost_source``), None before pricing.
    cost_source : str
        ``"analytic"``, ``"learned"`` or ``"measured"``.
    measurement : dict or None
        What a measurement of one call needs to become a database record (key, dtype, generator,
        config with the kernel description; :func:`~tvm_ext.select.measured.record_fields`),
        None before pricing or for a kernel the cost model cannot describe.
    """

    func: str
    calls: int
    kernels_per_call: int
    kernel_names: tuple[str, ...]
    generator: str = "dlight"
    rule: str = ""
    plan: str = ""
    modelled_s: float | None = None
    cost_source: str = ""
    measurement: dict | None = None

    @property
    def launches(self) -> int:
        """Kernel launches per inference caused by this PrimFunc."""
        return self.calls * self.kernels_per_call


def primfunc_calls(mod: tvm.IRModule, entry: str = "main") -> Counter:
    """How often one call of ``entry`` calls each PrimFunc (by name), following Relax calls."""
    counts: Counter = Counter()
    known = {gv.name_hint: gv for gv in mod.get_global_vars()}
    _count_calls(mod, known, known[entry], 1, counts, ())
    return counts


def _count_calls(mod: tvm.IRModule, known: dict, gvar: tvm.ir.GlobalVar, times: int, counts: Counter,
                 stack: tuple[str, ...]) -> None:
    func = mod[gvar]
    if isinstance(func, tirx.PrimFunc):
        counts[gvar.name_hint] += times
        return
    if not isinstance(func, relax.Function) or gvar.name_hint in stack:
        return  # external functions; recursion is not unrolled
    refs: list[tvm.ir.GlobalVar] = []
    tvm_ffi.structural_walk(func.body, (tvm.ir.GlobalVar, refs.append))
    for ref in refs:
        if ref.name_hint in known:
            _count_calls(mod, known, known[ref.name_hint], times, counts, stack + (gvar.name_hint,))


def _const_extent(loop: tirx.For) -> int:
    ext = loop.extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else 1


def host_kernel_launches(host_func: tirx.PrimFunc) -> list[str]:
    """Device kernels one call of a host function launches, one entry per launch."""
    launched: list[str] = []
    factor = [1]

    def on_for(node: tirx.For, visitor) -> None:
        factor.append(factor[-1] * _const_extent(node))
        visitor.default_visit(node)
        factor.pop()

    def on_call(node: tvm.ir.Call, visitor) -> None:
        if isinstance(node.op, tvm.ir.Op) and node.op.name == _CALL_FFI_KERNEL:
            launched.extend([str(node.args[0].value)] * factor[-1])
        visitor.default_visit(node)

    tvm_ffi.structural_visit(host_func.body, [(tirx.For, on_for), (tvm.ir.Call, on_call)])
    return launched


def library_kernels(mod: tvm.IRModule) -> dict[str, dict]:
    """External symbol -> ``{"generator", "plan", "launches_per_call"}`` of the library kernels."""
    if mod.attrs is None or LIBRARY_KERNELS_ATTR not in mod.attrs:
        return {}
    return {str(k): {kk: v[kk] for kk in v.keys()} for k, v in mod.attrs[LIBRARY_KERNELS_ATTR].items()}


def extern_calls(mod: tvm.IRModule, symbols: set[str], entry: str = "main") -> Counter:
    """How often one call of ``entry`` calls each external symbol in ``symbols``, following Relax calls."""
    counts: Counter = Counter()
    known = {gv.name_hint: gv for gv in mod.get_global_vars()}

    def visit(gvar: tvm.ir.GlobalVar, stack: tuple[str, ...]) -> None:
        func = mod[gvar]
        if not isinstance(func, relax.Function) or gvar.name_hint in stack:
            return
        externs: list = []
        tvm_ffi.structural_walk(func.body, (relax.ExternFunc, externs.append))
        for ext in externs:
            if str(ext.global_symbol) in symbols:
                counts[str(ext.global_symbol)] += 1
        refs: list = []
        tvm_ffi.structural_walk(func.body, (tvm.ir.GlobalVar, refs.append))
        for ref in refs:
            if ref.name_hint in known:
                visit(known[ref.name_hint], stack + (gvar.name_hint,))

    if entry in known:
        visit(known[entry], ())
    return counts


def device_kernels(lowered: tvm.IRModule, target: tvm.target.Target,
                   tir_pipeline: str = "default") -> dict[str, list[str]]:
    """Device kernels launched per call of each PrimFunc of a lowered module.

    Runs the TIR pipeline ``tvm.compile`` uses (``tir_pipeline``) on the module's PrimFuncs
    and reads the host functions after host/device splitting.
    """
    prims = {gv: f for gv, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)}
    if not prims:
        return {}
    split = lowered_module(lowered, target, tir_pipeline)
    names = {gv.name_hint for gv in prims}
    return {gv.name_hint: host_kernel_launches(f) for gv, f in split.functions_items()
            if gv.name_hint in names and isinstance(f, tirx.PrimFunc)}


def _summary(text: str | None) -> str:
    """One-line summary of a plan attribute ('' without one)."""
    if not text:
        return ""
    try:
        return plan_from_text(text).summary()
    except TvmExtError as err:
        return f"unreadable plan ({err})"


def _described(func) -> tuple[str, str, str]:
    """(generator, rule, plan summary) of a scheduled PrimFunc from its shared attributes."""
    generator = func_attr(func, GENERATOR_ATTR) or "dlight"
    rule = func_attr(func, RULE_ATTR) or ("pre-scheduled" if func_attr(func, "tirx.is_scheduled") else "none")
    return generator, rule, _summary(func_attr(func, PLAN_ATTR))


def kernel_launches(lowered: tvm.IRModule, target: tvm.target.Target, entry: str = "main") -> list[KernelLaunches]:
    """Launch facts of every PrimFunc and library kernel one call of ``entry`` runs, most calls first."""
    calls = primfunc_calls(lowered, entry)
    kernels = device_kernels(lowered, target)
    out = []
    for name, count in calls.most_common():
        generator, rule, plan = _described(lowered[name])
        out.append(KernelLaunches(func=name, calls=count, kernels_per_call=len(kernels.get(name, [])),
                                  kernel_names=tuple(dict.fromkeys(kernels.get(name, []))),
                                  generator=generator, rule=rule, plan=plan))
    library = library_kernels(lowered)
    for symbol, count in extern_calls(lowered, set(library), entry).most_common():
        info = library[symbol]
        out.append(KernelLaunches(func=symbol, calls=count, kernels_per_call=int(info.get("launches_per_call", 1)),
                                  kernel_names=(symbol,), generator=str(info.get("generator", "library")),
                                  rule="library", plan=_summary(str(info.get("plan", "")))))
    out.sort(key=lambda k: -k.calls)
    return out


def cuda_source(executable: tvm.runtime.Executable) -> str:
    """CUDA source of a VM executable built for a CUDA target ('' when there is none)."""
    found: list[str] = []

    def visit(module, depth: int) -> None:
        if module.kind == "cuda":
            found.append(module.inspect_source())
        if depth < 4:
            for child in module.imports:
                visit(child, depth + 1)

    visit(executable.mod, 0)
    return "\n".join(found)
