"""The face every technique shows the selector: the :class:`Generator` protocol and its registry.

A technique is one package with a generator: it proposes :class:`~tvm_ext.select.Candidate`
kernels over an OpGraph and builds the plans of the chosen ones. Two kinds exist:

* ``kernel_kind == "tir"``: a chosen candidate becomes one fused PrimFunc (``FuseTIR``) that
  carries its plan; the schedule stage calls :meth:`TirGenerator.schedule` with it;
* ``kernel_kind == "library"``: a chosen candidate becomes a call of an external function that
  the generator emits itself (:meth:`LibraryGenerator.library_call`, e.g. a CUTLASS kernel
  compiled by a BYOC codegen that reads the plan from the function it is handed).

Registering a generator is one line, ``register_generator(MyGenerator())``; a preset then names
it. Example (a generator that proposes every node alone, scheduled by dlight)::

    class Singletons:
        name, kernel_kind = "singletons", "tir"
        def prepare_passes(self, target): return []
        def candidates(self, ctx):
            return [DlightGenerator().candidate(ctx, (n,), "single", "node alone") for n in ctx.call_nodes()]
        ...
    register_generator(Singletons())
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import tvm
from tvm import tirx

from ..errors import TvmExtError
from .candidate import Candidate
from .plan import Plan

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..hardware import DeviceSpec
    from .context import SelectionContext


class GeneratorError(TvmExtError):
    """Unknown generator name, or a second registration under a taken name."""


class ScheduleRefused(TvmExtError):
    """A generator cannot build the plan it was handed for a function (the kernel falls back to
    dlight and the report says why)."""


@dataclass(frozen=True)
class ScheduledKernel:
    """What a TIR generator's schedule builder returns.

    Attributes
    ----------
    func : tirx.PrimFunc
        The scheduled function (``tirx.is_scheduled`` set).
    workspaces : list
        Global buffers the kernel needs besides its parameters (a kernel cannot allocate global
        memory): they become trailing parameters, allocated by the Relax VM at the call sites.
    rule : str
        What scheduled it, for reports (``"stitched"``, ``"stitched+grid_sync"``, dlight's ``"Matmul"``).
    """

    func: tirx.PrimFunc
    workspaces: list = field(default_factory=list)
    rule: str = ""


@runtime_checkable
class Generator(Protocol):
    """What every generator provides."""

    #: Registry key, also the ``generator`` of its plans and of its kernels in reports.
    name: str
    #: ``"tir"`` or ``"library"`` (see the module docstring).
    kernel_kind: str

    def prepare_passes(self, target: tvm.target.Target) -> list:
        """Relax passes to run before legalization (layout or graph rewrites it relies on)."""

    def candidates(self, ctx: "SelectionContext") -> list[Candidate]:
        """Candidate kernels over ``ctx.graph`` for ``ctx.device``."""

    def plan_from_json(self, data: dict[str, Any]) -> Plan:
        """Rebuild one of its plans from ``Plan.to_json()``."""


@runtime_checkable
class TirGenerator(Generator, Protocol):
    """A generator whose kernels are fused PrimFuncs it schedules itself."""

    #: Whether the schedule stage lowers each of its kernels alone as a check (a kernel TVM's
    #: lowering rejects then runs as dlight kernels, reported).
    verify_lowering: bool

    def schedule(self, func: tirx.PrimFunc, plan: Plan, device: "DeviceSpec") -> ScheduledKernel:
        """Build exactly ``plan`` on ``func``; raise :class:`ScheduleRefused` if it cannot."""


@runtime_checkable
class LibraryGenerator(Generator, Protocol):
    """A generator whose kernels are external library calls."""

    def library_call(self, candidate: Candidate, ctx: "SelectionContext") -> tuple[Any, list]:
        """The Relax function (carrying the plan) to call for ``candidate`` and its arguments."""

    def codegen_passes(self, target: tvm.target.Target) -> list:
        """Passes that turn the emitted library functions into runtime modules (``RunCodegen``)."""


_REGISTRY: dict[str, Generator] = {}


def register_generator(generator: Generator, override: bool = False) -> Generator:
    """Add ``generator`` to the registry under ``generator.name``.

    Raises
    ------
    GeneratorError
        The name is taken (and ``override`` is false) or the kind is unknown.
    """
    if generator.kernel_kind not in ("tir", "library"):
        raise GeneratorError(f"generator '{generator.name}': kernel_kind must be 'tir' or 'library', "
                             f"got {generator.kernel_kind!r}")
    if generator.name in _REGISTRY and not override:
        raise GeneratorError(f"a generator named '{generator.name}' is already registered")
    _REGISTRY[generator.name] = generator
    return generator


def unregister_generator(name: str) -> None:
    """Remove a generator (tests register temporary ones)."""
    _REGISTRY.pop(name, None)


def get_generator(name: str) -> Generator:
    """The registered generator called ``name``.

    Raises
    ------
    GeneratorError
        No such generator; the message lists the registered ones.
    """
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise GeneratorError(f"no generator named '{name}'; registered: {', '.join(sorted(_REGISTRY))}") from None


def list_generators() -> list[str]:
    """Names of the registered generators."""
    _load_builtin()
    return sorted(_REGISTRY)


_BUILTIN_LOADERS: list = []


def add_builtin_loader(load) -> None:
    """``load()`` registers generators on first use of the registry (the package's assembly gives
    the built-in techniques this way: the spine never imports a generator, and importing the
    package does not import CUTLASS's Python library)."""
    _BUILTIN_LOADERS.append(load)


def _load_builtin() -> None:
    while _BUILTIN_LOADERS:
        _BUILTIN_LOADERS.pop(0)()


__all__ = ["Generator", "GeneratorError", "LibraryGenerator", "ScheduleRefused", "ScheduledKernel",
           "TirGenerator", "add_builtin_loader", "get_generator", "list_generators", "register_generator",
           "unregister_generator"]
