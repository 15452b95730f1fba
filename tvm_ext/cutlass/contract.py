"""Every CUTLASS library call checked on the host against the kernel's own rules (no GPU needed).

A library call is right when the operation accepts it and computes the right thing in the
right place. The GPU is the wrong place to find out (an illegal address kills the CUDA
context), and a Python model of CUTLASS's rules is the wrong check (it is right where our
understanding is). So the check runs the project's own code on the host, as CUTLASS's own tests
do with ``can_implement`` and a host reference (:mod:`.contract_program` builds the program):

1. the glue fills the launcher's arguments from the call's tensors, exactly as in a build, and
   checks their element counts, dtypes, contiguity and alignment;
2. the launcher builds the operation's arguments and, instead of running it, hands them to the
   contract hook, which asks the operation's ``can_implement``, applies any adapter mapping and
   reports, from the kernel's own layouts, strides and problem, the lowest and highest element
   it reads or writes through every pointer, and the value and destination element of a sample
   of outputs it emulates on the host data (corners and pseudo-random points);
3. :func:`verdict` compares each range with the tensor the pointer lies in, requires every write
   to land in the output, and compares each emulated output with the Relax reference of the
   element at the address written (:mod:`.contract_data`; tolerance:
   :func:`~tvm_ext.testing.tolerance.tolerance_for` of the narrower of the epilogue's and the
   output's dtype: Relax rounds an activation before a fused cast, the kernel does not).

A finding is a sentence naming the operand and the element. Results are cached per call (the
instance's source, the glue function and the headers), so a model's check costs seconds once
its instances have been checked. The generator proposes only calls that pass
(:class:`~tvm_ext.cutlass.generator.CutlassGenerator`); ``tvm-ext check`` prints the verdicts.

Example
-------
>>> results = check_calls([ContractCall(offload, kernel_for(offload, cfg, "sm_80"))])
>>> results[0].ok, results[0].can_implement
(True, 'Success')
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import tvm

from ..testing.tolerance import scaled_atol, tolerance_for
from .contract_data import filled, reference_at
from .config import KernelConfig
from .contract_program import ContractCall, build_program, headers_digest, params_of, run_program
from .instance import Kernel, kernel_for
from .nvcc import cache_dir, source_key
from .workload import ROLE_SCALAR, Offload
from .wrapper import emit_glue_function

_LOG = logging.getLogger(__name__)
#: Bump when the verdict's rules change: cached results are then re-derived.
VERDICT_VERSION = "2"
#: Configurations :func:`first_accepted` tries per offload before it gives up on CUTLASS for it.
MAX_TRIES = 4
#: CUDA's grid limits (y and z; x is 2^31 - 1).
GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class ContractResult:
    """The verdict on one library call.

    Attributes
    ----------
    symbol : str
        The offloaded function.
    instance : str
        The instance key (:func:`~tvm_ext.cutlass.instance.instance_key`).
    workload : str
        The workload key.
    can_implement : str
        CUTLASS's status string (``"Success"``), or ``""`` when the glue refused the call first.
    findings : tuple of str
        What is wrong; empty when the call is right.
    samples : int
        Outputs emulated and compared with the reference.
    family : str
        The operation family the hook saw (``gemm_2x``, ``gemm_3x``, ``conv2d_2x``, ``b2b_gemm``...).
    """

    symbol: str
    instance: str
    workload: str
    can_implement: str
    findings: tuple[str, ...]
    samples: int
    family: str

    @property
    def ok(self) -> bool:
        """Whether the call is right."""
        return not self.findings

    @property
    def refused(self) -> bool:
        """Whether the operation (or the glue) refuses the call outright."""
        return self.can_implement != "Success"

    def line(self) -> str:
        """One line for reports."""
        if self.ok:
            return f"{self.symbol}: ok ({self.family}, can_implement {self.can_implement}, {self.samples} outputs emulated)"
        return f"{self.symbol}: {'REFUSED' if self.refused else 'WRONG'}: " + "; ".join(self.findings)


def call_key(call: ContractCall) -> str:
    """Cache key of a call's verdict: instance source, glue function, misalignment, headers (not the
    target arch: a 2.x instance is the same source for every arch, a 3.x one names its own)."""
    glue = emit_glue_function(dataclasses.replace(call.offload, symbol="call"), call.kernel.entry, call.kernel.config)
    parts = [call.kernel.source, glue, repr(call.misalign), headers_digest(), VERDICT_VERSION]
    return source_key("\0".join(parts), ["contract"])


def _cache_path(key: str) -> Path:
    path = cache_dir() / "contract"
    path.mkdir(parents=True, exist_ok=True)
    return path / f"{key}.json"


def _operand_findings(report: dict, sizes: dict[str, int]) -> list[str]:
    findings = []
    for op in report.get("operands", []):
        role, buf, elem = op["role"], op["buffer"], op["elem"]
        verb = "written" if op["write"] else "read"
        if buf is None:
            findings.append(f"{role} is {verb} through a pointer into no tensor")
            continue
        first = op["offset"] + op["lo"] * elem
        end = op["offset"] + (op["hi"] + 1) * elem
        if first < 0 or end > sizes[buf]:
            findings.append(f"{role} is {verb} up to element {end // elem - 1:,} of {buf}, which has "
                            f"{sizes[buf] // elem:,}")
        if op["write"] and buf != "out":
            findings.append(f"{role} is written into the input {buf}, not the output")
    grid = report.get("grid")
    if grid and any(g > limit for g, limit in zip(grid, GRID_LIMITS)):
        findings.append(f"grid {tuple(grid)} exceeds CUDA's limits {GRID_LIMITS}")
    bad: dict[str, list[int]] = {}
    for role, offset in report.get("bad_reads", []):
        bad.setdefault(role, []).append(offset)
    for role, offsets in bad.items():
        findings.append(f"the emulation read {role} outside every tensor ({len(offsets)} reads recorded, first at "
                        f"element {offsets[0]} from its pointer)")
    return findings


def _sample_findings(call: ContractCall, samples: list) -> list[str]:
    findings = []
    outside = [s for s in samples if s[0] != "out"]
    if outside:
        where = "no tensor" if outside[0][0] is None else f"the input {outside[0][0]}"
        findings.append(f"{len(outside)} of {len(samples)} emulated outputs are written into {where}")
    inside = [s for s in samples if s[0] == "out"]
    if not inside:
        return findings
    params = params_of(call)
    tensors = {p.role: filled(p.shape, p.seed) for p in params if p.role not in ("out", ROLE_SCALAR)}
    index = np.array([s[1] for s in inside], dtype=np.int64)
    got = np.array([np.nan if s[2] is None else s[2] for s in inside], dtype=np.float64)
    ref = reference_at(call.offload, tensors, index)
    rtol, atol = tolerance_for(_compared_dtype(call.offload.workload))
    atol = scaled_atol(atol, float(np.sqrt(np.mean(ref**2))) if ref.size else 0.0)
    bad = ~(np.abs(got - ref) <= atol + rtol * np.abs(ref))
    if bad.any():
        i = int(np.argmax(bad))
        findings.append(f"{int(bad.sum())} of {len(inside)} emulated outputs differ from the Relax reference "
                        f"(out[{index[i]}] = {got[i]:g}, reference {ref[i]:g})")
    return findings


def _compared_dtype(wl) -> str:
    """The dtype whose tolerance applies: with a fused cast (fp16 -> fp32) the Relax reference
    rounds the epilogue in ``out_dtype`` and the kernel keeps fp32, so the narrower one."""
    final = wl.final_dtype
    out = getattr(wl, "out_dtype", final)
    return out if tvm.DataType(out).bits < tvm.DataType(final).bits else final


def verdict(call: ContractCall, raw: dict) -> ContractResult:
    """The result of one call from its program output (see the module docstring)."""
    wl = call.offload.workload
    base = dict(symbol=call.offload.symbol, instance=call.kernel.key, workload=wl.key())
    if "error" in raw:
        error = re.sub(r"tvm_ext_contract_call_\d+", "the call", raw["error"])
        return ContractResult(**base, can_implement="", findings=(f"the glue refuses the call: {error}",),
                              samples=0, family="")
    report = raw["report"]
    status = report.get("can_implement", "")
    findings = [] if status == "Success" else [f"can_implement refuses it: {status}"]
    sizes = {p.name: p.bytes for p in params_of(call)}
    findings += _operand_findings(report, sizes)
    samples = report.get("samples", [])
    findings += _sample_findings(call, samples)
    if not samples and status == "Success":
        findings.append("no output was emulated (empty problem)")
    return ContractResult(**base, can_implement=status, findings=tuple(findings), samples=len(samples),
                          family=report.get("family", ""))


def check_calls(calls: Sequence[ContractCall], *, use_cache: bool = True) -> list[ContractResult]:
    """Check library calls; results in call order.

    Calls checked before (same instance source, glue function and headers) come from the cache;
    the rest run in one contract program.

    Raises
    ------
    KernelCompileError
        The contract program did not compile or run (a bug in the emitted code, not a verdict).
    CutlassSetupError
        No nvcc, g++ or CUTLASS headers.
    """
    results: list[ContractResult | None] = [None] * len(calls)
    todo = []
    for i, call in enumerate(calls):
        path = _cache_path(call_key(call))
        if use_cache and path.exists():
            data = json.loads(path.read_text())
            data.update(symbol=call.offload.symbol, findings=tuple(data["findings"]))
            results[i] = ContractResult(**data)
        else:
            todo.append((i, call))
    if todo:
        _LOG.info("CUTLASS contract: %d calls, %d instances on the host", len(todo),
                  len({c.kernel.entry for _, c in todo}))
        program = build_program([c for _, c in todo])
        for (i, call), raw in zip(todo, run_program(program, len(todo))):
            results[i] = verdict(call, raw)
            target = _cache_path(call_key(call))
            staged = target.with_suffix(f".{os.getpid()}.tmp")
            staged.write_text(json.dumps(asdict(results[i])))
            staged.replace(target)
    return [r for r in results if r is not None]


def call_path(call: ContractCall) -> str:
    """The code path a call exercises, for tables: operation, epilogue and what varies at run time
    or by instance (batched operands, split-K, convolution stride, TF32, narrow vectors)."""
    wl, cfg = call.offload.workload, call.kernel.config
    kind = {"gemm": f"GEMM {'3.x' if cfg.api == '3x' else '2.x'}", "conv2d": "conv2d", "b2b_gemm": "b2b GEMM",
            "b2b_conv2d": "b2b conv2d", "attention": "fused attention"}[wl.kind]
    parts = [kind, wl.epilogue.suffix.strip("_") or "plain"]
    if wl.kind == "attention":
        parts[1] = "causal" if wl.causal else parts[1]
    if wl.kind == "gemm" and wl.batch > 1:
        parts.append("batched B" if wl.b_batched else "batched A, shared B")
    if cfg.split_k > 1:
        parts.append("split-K")
    if wl.kind == "conv2d":
        parts.append("unit stride" if tuple(wl.stride) == (1, 1) else "strided")
    if wl.dtype == "float32":
        parts.append("TF32")
    full = 128 // (16 if wl.dtype != "float32" else 32)
    if min(cfg.alignment) < full:
        parts.append("alignment " + "/".join(map(str, cfg.alignment)))
    return ", ".join(parts)


@dataclass(frozen=True)
class Acceptance:
    """What :func:`first_accepted` found for one offload: the kernel to build (None when every
    configuration tried was refused) and the findings of those refused on the way."""

    kernel: Kernel | None
    refused: tuple[ContractResult, ...] = ()

    def reason(self) -> str:
        """Why no kernel was accepted (or which were passed over), for reports."""
        if not self.refused:
            return ""
        return (f"the contract check refused {len(self.refused)} configuration(s), the first because "
                + "; ".join(self.refused[0].findings))


def first_accepted(offloads: Sequence[Offload], ranked: Sequence[Sequence[tuple[KernelConfig, bool]]], arch: str,
                   *, tries: int = MAX_TRIES) -> list[Acceptance]:
    """For each offload, the first of its ``ranked`` configurations (best first, with whether each
    was measured) whose call passes :func:`check_calls`; at most ``tries`` per offload, checked
    round by round so that each round is one contract program."""
    chosen: list[Acceptance] = [Acceptance(None) for _ in offloads]
    tried = [0] * len(offloads)
    pending = list(range(len(offloads)))
    while pending:
        calls, owners = [], []
        for i in pending:
            if tried[i] < min(tries, len(ranked[i])):
                cfg, measured = ranked[i][tried[i]]
                tried[i] += 1
                calls.append(ContractCall(offloads[i], kernel_for(offloads[i], cfg, arch, measured)))
                owners.append(i)
        pending = []
        for i, call, result in zip(owners, calls, check_calls(calls)):
            if result.ok:
                chosen[i] = Acceptance(call.kernel, chosen[i].refused)
            else:
                chosen[i] = Acceptance(None, chosen[i].refused + (result,))
                pending.append(i)
    return chosen


__all__ = ["Acceptance", "call_path", "ContractCall", "ContractResult", "MAX_TRIES", "call_key", "check_calls",
           "first_accepted", "verdict"]
