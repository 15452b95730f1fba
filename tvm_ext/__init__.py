"""tvm_ext: fast DNN inference on NVIDIA GPUs for Apache TVM 0.27.

Importing the package registers the ``tvm_ext/<device>`` target tags and the
``"tvm_ext"`` / ``"tvm_ext.<preset>"`` Relax pipelines, so both work with ``tvm.compile``::

    import tvm, tvm_ext
    ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext")
    ex = tvm_ext.compile("model.onnx", target="tvm_ext/h100", preset="baseline")

The public subpackages (:data:`SUBMODULES`: ``tvm_ext.frontend``, ``tvm_ext.inspect`` ...) are
attributes of the package, imported on first access.
"""
from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

# Defined before anything imports tvm: `import tvm_ext` imports tvm, whose backend autoload
# calls back into this (still initializing) module. Registration then happens below.
_INITIALIZING = True


def _autoload() -> None:
    """Entry point run by ``import tvm`` (``tvm.backends``): registers tags and pipelines."""
    if _INITIALIZING:
        return
    try:
        _register()
    except TvmExtError as err:  # a broken device yaml must not break `import tvm`
        _LOG.warning("tvm_ext autoload skipped: %s", err)


from . import errors
from .errors import RuntimeOnlyError, TvmExtError

__version__ = "0.1.0"
_LOG = logging.getLogger(__name__)

#: With a runtime-only TVM (``TVM_USE_RUNTIME_LIB=1``: no compiler library) only the runtime
#: side of the package works (e.g. ``python -m tvm_ext.bench.run``); the compiler APIs below
#: would fail to import, so they are not loaded.
RUNTIME_ONLY = os.environ.get("TVM_USE_RUNTIME_LIB", "0") not in ("", "0")

if not RUNTIME_ONLY:
    from .driver import (
        DEFAULT_PRESET,
        Preset,
        compile,
        get_preset,
        graph_passes,
        list_presets,
        preset_passes,
        preset_pipeline,
        register_builtin_presets,
        register_pipelines,
        use_preset,
    )
    from .hardware import (DEFAULT_TARGET, DeviceSpec, device_from_target, list_devices, load_device,
                           register_target_tags)
    from .toolchain import export_library


def _register_techniques() -> None:
    """Import the technique packages: each registers its generator (on first use of the registry)."""
    from . import cutlass, dlight, orchestrate, stitch, subprogram, tilegraph  # noqa: F401


def _register() -> None:
    if RUNTIME_ONLY:
        return
    from .tir import register_tir_pipeline
    from .toolchain.export import register_arch_marker

    from .select.generator import add_builtin_loader

    add_builtin_loader(_register_techniques)
    register_arch_marker()  # CUDA source records its arch: export_library compiles it for that GPU
    register_target_tags()
    register_builtin_presets()
    register_pipelines()
    register_tir_pipeline()  # "tvm_ext": s_tir + launch bounds + cooperative launch


_register()
_INITIALIZING = False

#: Public subpackages, imported on first attribute access (``tvm_ext.frontend``) so that
#: ``import tvm_ext`` stays as fast as the registration needs.
SUBMODULES = ("analysis", "bench", "cutlass", "deploy", "dlight", "driver", "fission", "frontend", "graph", "hardware",
              "inspect", "models", "orchestrate", "select", "stitch", "testing", "tir", "toolchain", "transform")
#: The subpackages a runtime-only TVM (:data:`RUNTIME_ONLY`) can import.
RUNTIME_SUBMODULES = ("bench", "deploy")


def __getattr__(name: str) -> ModuleType:
    """Import the public subpackage ``name`` on first access (``tvm_ext.frontend.from_onnx``)."""
    if name not in SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if RUNTIME_ONLY and name not in RUNTIME_SUBMODULES:
        raise RuntimeOnlyError(f"tvm_ext.{name} needs TVM's compiler library, which TVM_USE_RUNTIME_LIB=1 leaves "
                               f"out; only {', '.join('tvm_ext.' + m for m in RUNTIME_SUBMODULES)} works without it")
    return importlib.import_module(f".{name}", __name__)


def __dir__() -> list[str]:
    """The package's names, the not yet imported subpackages included."""
    return sorted(set(globals()) | set(SUBMODULES))


__all__ = [
    "errors", "TvmExtError", "DEFAULT_TARGET", "DeviceSpec", "device_from_target", "list_devices", "load_device",
    "DEFAULT_PRESET", "Preset", "compile", "get_preset", "graph_passes", "list_presets",
    "preset_passes", "preset_pipeline", "use_preset", "export_library", "__version__", *SUBMODULES,
]
