"""Every distinct CUTLASS instance of a model suite, compiled once per arch (the CI check).

CUTLASS kernels are shape-generic templates: one compiled instance serves every offload with
the same :func:`~tvm_ext.cutlass.instance.instance_key` (operator kind, dtypes, layouts,
epilogue, tile configuration, alignment, kernel arch); problem sizes, batch count and split-K
slices are runtime arguments that the TVM-FFI glue passes. So a suite needs one nvcc run per
distinct key and arch, not one per offload.

:func:`plan_suite` imports each model (fp16), runs the ``cutlass`` preset's offload passes up to
the partition for each arch, and collects the distinct instances plus each model's glue.
:class:`InstanceCompiler` compiles them (and the glue, with g++) in the background while later
models are still being imported, ``jobs`` nvcc processes at a time but at most ``heavy_jobs`` CUTLASS 3.x ones (about
70 s of CPU and 3.6 GB each on a small machine, against 10-20 s and 0.8 GB for 2.x).
"""
from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import tvm
from tqdm import tqdm
from tvm import relax

from ..errors import KernelCompileError
from .codegen import planned_kernels
from .contract import ContractCall, ContractResult, check_calls
from .nvcc import cached_object, compile_object
from .passes import codegen_options, offload_passes
from .patterns import CODEGEN_NAME
from .wrapper import compile_glue, emit_glue

_LOG = logging.getLogger(__name__)


@dataclass
class SuiteInstance:
    """One distinct compiled instance for one arch, and the offloads (``model/symbol``) it serves."""

    arch: str
    entry: str
    key: str
    source: str
    users: list[str] = field(default_factory=list)

    @property
    def heavy(self) -> bool:
        """CUTLASS 3.x (collective builder) instances: several times the time and memory to compile."""
        return "|3x_" in self.key


@dataclass
class SuitePlan:
    """Distinct instances per arch, offload counts, glue sources and contract verdicts per (model, arch)."""

    archs: tuple[str, ...]
    instances: dict[str, dict[str, SuiteInstance]] = field(default_factory=dict)
    offloads: dict[tuple[str, str], int] = field(default_factory=dict)
    glue: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Every offload's library call, per (model, arch), and the contract check's verdicts on
    #: them (:func:`check_suite_calls`, once every model is planned).
    calls: dict[tuple[str, str], list[ContractCall]] = field(default_factory=dict)
    verdicts: dict[tuple[str, str], list[ContractResult]] = field(default_factory=dict)
    seconds_planning: float = 0.0

    def all_instances(self) -> list[SuiteInstance]:
        return [inst for arch in self.archs for inst in self.instances.get(arch, {}).values()]

    def summary(self) -> dict[str, dict[str, int]]:
        """Per arch: offloads, distinct instances, of which CUTLASS 3.x."""
        out = {}
        for arch in self.archs:
            insts = list(self.instances.get(arch, {}).values())
            out[arch] = {"offloads": sum(n for (_, a), n in self.offloads.items() if a == arch),
                         "instances": len(insts), "instances_3x": sum(i.heavy for i in insts)}
        return out


def cuda_target(arch: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def offloaded_functions(mod: tvm.IRModule, arch: str, database: str | None = None) -> list[relax.Function]:
    """The ``Codegen`` functions the ``cutlass`` preset makes for ``arch`` (its passes before RunCodegen)."""
    passes = offload_passes(cuda_target(arch), database)
    if not passes:
        return []
    part = tvm.transform.Sequential(passes[:-1])(mod)
    return [f for _, f in part.functions_items()
            if isinstance(f, relax.Function) and f.attrs and f.attrs.get("Codegen") == CODEGEN_NAME]


def load_fp16_model(path: str | os.PathLike[str]) -> tvm.IRModule:
    """A suite model (ONNX file or weight-free skeleton) imported as an fp16 Relax module."""
    from ..frontend import from_onnx
    from ..models.skeleton import load_model

    return from_onnx(load_model(path), fp16=True)


def plan_model(plan: SuitePlan, name: str, mod: tvm.IRModule, database: str | None = None,
               on_new: Callable[[SuiteInstance], None] | None = None,
               on_glue: Callable[[tuple[str, str], str], None] | None = None) -> None:
    """Add one model's instances and glue to ``plan``; ``on_new`` / ``on_glue`` see each new one."""
    partitions: dict[str, list[relax.Function]] = {}
    for arch in plan.archs:
        options = codegen_options(cuda_target(arch), database)
        # the partition depends on the arch only through b2b fusion, which needs a database
        part_key = arch if options["database"] else ""
        if part_key not in partitions:
            partitions[part_key] = offloaded_functions(mod, arch, database)
        funcs = partitions[part_key]
        plan.offloads[(name, arch)] = len(funcs)
        if not funcs:
            continue
        offloads, kernels = planned_kernels(funcs, options)
        plan.calls[(name, arch)] = [ContractCall(off, kernel) for off, kernel in zip(offloads, kernels)]
        known = plan.instances.setdefault(arch, {})
        for off, kernel in zip(offloads, kernels):
            inst = known.get(kernel.entry)
            if inst is None:
                inst = known[kernel.entry] = SuiteInstance(arch, kernel.entry, kernel.key, kernel.source)
                if on_new is not None:
                    on_new(inst)
            inst.users.append(f"{name}/{off.symbol}")
        glue = plan.glue[(name, arch)] = emit_glue(offloads, [k.entry for k in kernels],
                                                   [k.config for k in kernels])
        if on_glue is not None:
            on_glue((name, arch), glue)


def check_suite_calls(plan: SuitePlan) -> None:
    """The contract verdict of every planned call (``plan.verdicts``): one contract program for
    the whole suite, each instance compiled once for the check (2.x ones shared by the archs)."""
    keys = list(plan.calls)
    flat = [call for key in keys for call in plan.calls[key]]
    results = iter(check_calls(flat))
    plan.verdicts = {key: [next(results) for _ in plan.calls[key]] for key in keys}


def plan_suite(paths: Iterable[str | os.PathLike[str]], archs: Sequence[str], database: str | None = None,
               on_new: Callable[[SuiteInstance], None] | None = None,
               on_glue: Callable[[tuple[str, str], str], None] | None = None,
               on_model: Callable[[str], None] | None = None) -> SuitePlan:
    """Import every model and collect the distinct instances (see the module docstring);
    ``on_model`` is called with each model's name before it is planned."""
    plan = SuitePlan(tuple(archs))
    start = time.perf_counter()
    for path in paths:
        name = Path(path).stem
        if on_model is not None:
            on_model(name)
        t0 = time.perf_counter()
        plan_model(plan, name, load_fp16_model(path), database, on_new, on_glue)
        _LOG.info("%s: %s offloads in %.1f s", name, {a: plan.offloads[(name, a)] for a in archs},
                  time.perf_counter() - t0)
    plan.seconds_planning = time.perf_counter() - start
    return plan


@dataclass(frozen=True)
class CompileResult:
    """Outcome of one instance compile (``seconds`` is wall time; 0 for a cache hit)."""

    arch: str
    entry: str
    key: str
    seconds: float
    cached: bool
    error: str = ""


@dataclass(frozen=True)
class _GlueJob:
    key: tuple[str, str]
    source: str


class InstanceCompiler:
    """Compile instances in background threads: ``jobs`` at a time, at most ``heavy_jobs`` 3.x.

    ``hold_heavy`` keeps 3.x compiles (3.6 GB each) back until :meth:`release_heavy` or
    :meth:`finish`, so that they do not run while a large model is held in memory for planning.

    ``submit`` / ``submit_glue`` may be called while the caller is still planning; ``finish``
    waits for all. Objects are cached on disk by :mod:`.nvcc` (a warm rerun compiles nothing).
    Kernel outcomes go to ``results``, glue (g++) failures to ``glue_errors``.
    """

    def __init__(self, jobs: int = 2, heavy_jobs: int = 1, hold_heavy: bool = False, progress: bool = False):
        self.jobs, self.heavy_jobs = max(1, jobs), max(1, heavy_jobs)
        #: Kernels compiled / submitted so far, with the model being planned and the elapsed time.
        self.bar = tqdm(total=0, desc="CUTLASS suite", unit="kernel", disable=not progress)
        self._heavy_released = not hold_heavy
        self._heavy: deque[SuiteInstance] = deque()
        self._light: deque[SuiteInstance | _GlueJob] = deque()
        self._cond = threading.Condition()
        self._running_heavy = 0
        self._closed = False
        self.results: list[CompileResult] = []
        self.glue_errors: dict[tuple[str, str], str] = {}
        self._usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._start = time.perf_counter()
        self.wall_seconds = 0.0
        self.cpu_seconds = 0.0
        self._threads = [threading.Thread(target=self._work, name=f"nvcc-{i}", daemon=True) for i in range(self.jobs)]
        for thread in self._threads:
            thread.start()

    def submit(self, inst: SuiteInstance) -> None:
        with self._cond:
            (self._heavy if inst.heavy else self._light).append(inst)
            self.bar.total += 1
            self.bar.refresh()
            self._cond.notify_all()

    def submit_glue(self, key: tuple[str, str], source: str) -> None:
        """Compile a model's TVM-FFI glue (``key`` = (model, arch)) with g++."""
        with self._cond:
            self._light.append(_GlueJob(key, source))
            self._cond.notify_all()

    def _next(self) -> SuiteInstance | _GlueJob | None:
        with self._cond:
            while True:
                if self._heavy and self._heavy_released and self._running_heavy < self.heavy_jobs:
                    self._running_heavy += 1
                    return self._heavy.popleft()
                if self._light:
                    return self._light.popleft()
                if self._closed and not self._heavy:
                    return None
                self._cond.wait()

    def _work(self) -> None:
        while (inst := self._next()) is not None:
            if isinstance(inst, _GlueJob):
                try:
                    compile_glue(inst.source)
                except KernelCompileError as err:
                    with self._cond:
                        self.glue_errors[inst.key] = str(err)
                continue
            cached = cached_object(inst.source, inst.arch) is not None
            t0 = time.perf_counter()
            error = ""
            try:
                compile_object(inst.source, inst.arch)
            except KernelCompileError as err:
                error = str(err)
            result = CompileResult(inst.arch, inst.entry, inst.key, 0.0 if cached else time.perf_counter() - t0,
                                   cached, error)
            _LOG.info("%s %s: %s", inst.arch, inst.key, "cached" if cached else
                      (f"{result.seconds:.0f} s" if not error else "FAILED"))
            with self._cond:
                self.results.append(result)
                self.bar.update(1)
                if inst.heavy:
                    self._running_heavy -= 1
                self._cond.notify_all()

    def release_heavy(self) -> None:
        """Start the held-back CUTLASS 3.x compiles (see ``hold_heavy``)."""
        with self._cond:
            self._heavy_released = True
            self._cond.notify_all()

    def finish(self) -> list[CompileResult]:
        """Wait for every submitted compile; sets ``wall_seconds`` and ``cpu_seconds`` (all children)."""
        with self._cond:
            self._closed = True
            self._heavy_released = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self.bar.close()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_seconds = (usage.ru_utime - self._usage0.ru_utime) + (usage.ru_stime - self._usage0.ru_stime)
        self.wall_seconds = time.perf_counter() - self._start
        return self.results


def compile_suite(paths: Iterable[str | os.PathLike[str]], archs: Sequence[str], *, jobs: int = 2,
                  heavy_jobs: int = 1, database: str | None = None,
                  keep: Callable[[SuiteInstance], bool] | None = None,
                  progress: bool = False) -> tuple[SuitePlan, InstanceCompiler]:
    """Plan the suite, compile its instances (those ``keep`` accepts) and glue, overlapping both,
    and check every call on the host (``plan.verdicts``).

    2.x instances and glue compile while models are imported; 3.x instances wait until the
    last model is planned (peak memory: one imported model and one 2.x nvcc, or one 3.x and
    one 2.x nvcc, never a large model and a 3.x nvcc together).
    """
    compiler = InstanceCompiler(jobs, heavy_jobs, hold_heavy=True, progress=progress)
    plan = plan_suite(paths, archs, database,
                      on_new=lambda inst: compiler.submit(inst) if keep is None or keep(inst) else None,
                      on_glue=compiler.submit_glue,
                      on_model=lambda name: compiler.bar.set_description(f"CUTLASS suite: planning {name}"))
    compiler.bar.set_description("CUTLASS suite: checking the calls on the host")
    check_suite_calls(plan)
    compiler.bar.set_description("CUTLASS suite: compiling")
    compiler.finish()
    return plan, compiler
