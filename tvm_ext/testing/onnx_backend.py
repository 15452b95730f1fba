"""An ``onnx.backend.base.Backend`` that runs ONNX models through a tvm_ext preset on the CPU.

It lets onnx's own backend test runner exercise our importer and a preset's graph stage::

    import onnx.backend.test
    backend = backend_for("baseline")
    tests = onnx.backend.test.BackendTest(backend, __name__)

``prepare`` imports with :func:`tvm_ext.frontend.from_onnx` (static shapes, weights as
constants) and builds for ``llvm`` with :func:`tvm_ext.testing.oracle.build_cpu`.
``run_node`` keeps the base-class behaviour (it only checks the node and returns
``None``, which onnx's runner treats as "not implemented"); node tests go through
``prepare`` with a one-node model.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from ..errors import TvmExtError
from ..driver import DEFAULT_PRESET, get_preset
from .oracle import CpuVM, build_cpu, onnx_user_inputs, run_cpu


class TvmExtBackendRep(BackendRep):
    """A model imported and built for the CPU; :meth:`run` executes it.

    Parameters
    ----------
    vm : CpuVM
        The built module.
    input_names : sequence of str
        ONNX names of the graph inputs that are not initializers, in graph order.
    output_names : sequence of str
        ONNX graph output names, in order.
    """

    def __init__(self, vm: CpuVM, input_names: Sequence[str], output_names: Sequence[str]):
        self.vm = vm
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    @classmethod
    def build(cls, mod: Any, model: onnx.ModelProto, preset: str = DEFAULT_PRESET) -> TvmExtBackendRep:
        """Build an imported module ``mod`` of ``model`` with ``preset``."""
        vm = build_cpu(mod, preset)
        return cls(vm, [i.name for i in onnx_user_inputs(model)], [o.name for o in model.graph.output])

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise TvmExtError(f"missing inputs: {', '.join(missing)}")
            return {n: np.asarray(inputs[n]) for n in self.input_names}
        values = list(inputs)
        if len(values) != len(self.input_names):
            raise TvmExtError(f"the model takes {len(self.input_names)} inputs "
                              f"({', '.join(self.input_names)}), got {len(values)}")
        return {n: np.asarray(v) for n, v in zip(self.input_names, values)}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Execute with ``inputs`` (a list in graph input order, a dict by name, or one array).

        Returns a tuple in graph output order, also indexable by output name.
        """
        outputs = run_cpu(self.vm, self._feeds(inputs), num_outputs=len(self.output_names))
        return namedtupledict("Outputs", self.output_names)(*outputs)


class TvmExtBackend(Backend):
    """Backend for the preset named by the class attribute ``preset`` (see :func:`backend_for`)."""

    preset: ClassVar[str] = DEFAULT_PRESET

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TvmExtBackendRep:
        """Import ``model`` with our frontend and build it for the CPU with the preset.

        Raises
        ------
        TvmExtError
            Import errors (unsupported ops, bad shapes ...) and a non-CPU ``device``.
        """
        if not cls.supports_device(device):
            raise TvmExtError(f"the tvm_ext test backend runs on CPU only, not '{device}'")
        from ..frontend import from_onnx

        mod = from_onnx(model)
        return TvmExtBackendRep.build(mod, model, cls.preset)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only ``"CPU"`` (the oracle builds for ``llvm``)."""
        try:
            return Device(device).type == DeviceType.CPU
        except AttributeError:  # an unknown device type name, e.g. "TPU"
            return False


_BACKENDS: dict[str, type[TvmExtBackend]] = {}


def backend_for(preset: str = DEFAULT_PRESET) -> type[TvmExtBackend]:
    """The backend class for ``preset`` (one class per preset, cached).

    Raises
    ------
    PresetError
        Unknown or not implemented preset.
    """
    get_preset(preset)
    if preset not in _BACKENDS:
        name = "TvmExtBackend_" + "".join(ch if ch.isalnum() else "_" for ch in preset)
        _BACKENDS[preset] = type(name, (TvmExtBackend,), {"preset": preset})
    return _BACKENDS[preset]
