"""ONNX import: load and validate a model, then convert it to a static-shape Relax IRModule.

``from_onnx`` loads and validates the model, binds every free input dimension to a static
size, rejects unsupported operators up front (all of them in one error), converts with
TVM's Relax ONNX importer (weights become constants) and finishes the module with
:func:`tvm_ext.frontend.canonicalize.finalize_module` (canonical form, optional pure fp16).

The result is target independent: ``main`` holds high-level Relax ops (``relax.matmul``,
``relax.nn.softmax`` ...) in a dataflow block, nothing legalized to ``call_tir`` yet
(except the few ops the importer itself emits through ``emit_te``, such as Pad).
Parameters of ``main`` follow the order of the ONNX graph inputs (initializers excluded).
Every value name is made a C identifier before conversion (``input.1`` becomes ``input_1``,
``/layer0/MatMul:0`` becomes ``layer0_MatMul_0``; :mod:`tvm_ext.frontend.names`), and ``main``
records the ONNX name of each parameter (:func:`~tvm_ext.frontend.names.onnx_input_names`).
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import onnx
import tvm
from google.protobuf.message import DecodeError

from ..errors import TVM_ERRORS, ModelConversionError, ModelLoadError, TvmExtError, UnsupportedOpsError
from ..models.skeleton import fill_skeleton, is_skeleton
from .bind import bind_inputs, constant_operand_inputs
from .canonicalize import finalize_module
from .constant_nodes import normalize_constant_nodes
from .names import ONNX_NAMES_ATTR, identifier_renames, iter_graphs, rename_values
from .shape_folding import fold_shape_arithmetic
from .shapes import bind_input_shapes, user_inputs

logger = logging.getLogger(__name__)

ModelLike = str | os.PathLike | onnx.ModelProto

#: Domains the importer dispatches on besides the default one, with the contrib ops of each
#: that have a converter (the importer looks converters up by ``op_type`` only).
_CONTRIB_OPS = {
    "com.microsoft": frozenset({
        "Attention", "BiasGelu", "EmbedLayerNormalization", "FastGelu", "Gelu",
        "SkipLayerNormalization", "MatMulInteger16", "QuantizeLinear", "DequantizeLinear",
    }),
}
_DEFAULT_DOMAINS = ("", "ai.onnx")
#: Default-domain ops whose name TVM's converter table maps to a contrib op of another
#: domain with different semantics (ONNX opset-23 Attention vs com.microsoft.Attention).
_MISMATCHED_DEFAULT_OPS = frozenset({"Attention"})
#: Ops the importer handles outside its converter table.
_DIRECTLY_HANDLED = frozenset({"If"})


# --------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------
def load_onnx(model: ModelLike) -> onnx.ModelProto:
    """Load ``model`` (a path or a ``ModelProto``) and check that it is a complete ONNX graph.

    A skeleton (see :mod:`tvm_ext.models.skeleton`) is filled with its deterministic weights.

    Raises
    ------
    ModelLoadError
        Missing file, empty/truncated/corrupt file, a file that is not ONNX, a graph that
        refers to values nothing defines (truncation), or an unsupported argument type.
    """
    if isinstance(model, onnx.ModelProto):
        proto, label = model, f"<ModelProto {model.graph.name or 'unnamed'}>"
    elif isinstance(model, (str, os.PathLike)):
        proto, label = _read_onnx_file(Path(model)), str(model)
    else:
        raise ModelLoadError(
            f"expected a path or an onnx.ModelProto, got {type(model).__name__}"
        )
    _check_complete(proto, label)
    if is_skeleton(proto):  # weight-free corpus graph: refill its weights deterministically
        proto = fill_skeleton(proto)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    return proto


def _read_onnx_file(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelLoadError(f"cannot load ONNX model '{path}': file not found")
    if not path.is_file():
        raise ModelLoadError(f"cannot load ONNX model '{path}': not a regular file")
    data = path.read_bytes()
    if not data:
        raise ModelLoadError(f"cannot load ONNX model '{path}': file is empty")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as err:
        # Serialized ModelProtos start with field 1 (ir_version, a varint): tag byte 0x08.
        # A file that starts like one but does not parse was cut short or damaged.
        if data[:1] == b"\x08":
            raise ModelLoadError(
                f"cannot load ONNX model '{path}': file is truncated or corrupt ({err})"
            ) from None
        raise ModelLoadError(
            f"cannot load ONNX model '{path}': not an ONNX model (not a ModelProto protobuf)"
        ) from None
    if proto.graph.initializer and any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer
    ):
        try:
            onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
        except OSError as err:
            raise ModelLoadError(
                f"cannot load ONNX model '{path}': external weights unreadable ({err})"
            ) from None
    return proto


def _check_complete(proto: onnx.ModelProto, label: str) -> None:
    """Reject protos that parsed but are not (complete) ONNX models."""
    if proto.ir_version < 3 or not proto.HasField("graph"):
        raise ModelLoadError(
            f"cannot load ONNX model '{label}': not an ONNX model "
            f"(ir_version={proto.ir_version}, graph {'present' if proto.HasField('graph') else 'missing'})"
        )
    graph = proto.graph
    if not graph.output:
        raise ModelLoadError(f"cannot load ONNX model '{label}': graph has no outputs "
                             "(file truncated or corrupt?)")
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.name for t in graph.sparse_initializer}
    for node in graph.node:
        missing = [name for name in node.input if name and name not in defined]
        if missing:
            raise ModelLoadError(
                f"cannot load ONNX model '{label}': node '{node.name or node.op_type}' uses "
                f"undefined value(s) {', '.join(map(repr, missing))} (file truncated or corrupt?)"
            )
        defined.update(node.output)
    undefined_outputs = [o.name for o in graph.output if o.name not in defined]
    if undefined_outputs:
        raise ModelLoadError(
            f"cannot load ONNX model '{label}': output(s) {', '.join(map(repr, undefined_outputs))} "
            "are never computed (file truncated or corrupt?)"
        )


# --------------------------------------------------------------------------------------
# operator support
# --------------------------------------------------------------------------------------
def _convert_map() -> Mapping[str, object]:
    from tvm.relax.frontend.onnx import onnx_frontend  # the converter table lives here

    return onnx_frontend._get_convert_map()  # pylint: disable=protected-access


def unsupported_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Operators of ``model`` the Relax importer cannot convert, with their counts.

    Default-domain ops are named by ``op_type``; ops of other domains as
    ``"domain::op_type"``.
    """
    convert_map = _convert_map()
    found: dict[str, int] = {}
    for node in (n for g in iter_graphs(model.graph) for n in g.node):
        domain = node.domain or ""
        if domain in _DEFAULT_DOMAINS:
            ok = ((node.op_type in convert_map or node.op_type in _DIRECTLY_HANDLED)
                  and node.op_type not in _MISMATCHED_DEFAULT_OPS)
            key = node.op_type
        else:
            ok = node.op_type in _CONTRIB_OPS.get(domain, ()) and node.op_type in convert_map
            key = f"{domain}::{node.op_type}"
        if not ok:
            found[key] = found.get(key, 0) + 1
    return found


def _default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return int(entry.version)
    return 1


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
def from_onnx(
    model: ModelLike,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dtype: str = "float32",
    *,
    fp16: bool = False,
    canonicalize: bool = True,
    opset: int | None = None,
    bind: Mapping[str, object] | None = None,
) -> tvm.IRModule:
    """Import an ONNX model as a static-shape Relax module with weights as constants.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        The model or the path of a ``.onnx`` file.
    shapes : mapping of str to sequence of int, optional
        Static shapes of graph inputs. Required for every input with a symbolic or unset
        dimension; a named dimension (``dim_param``) bound through one input is bound
        for all inputs using the same name. Must agree with static dimensions.
    dtype : str
        Element type assumed for graph inputs that declare none. Declared input types win.
    fp16 : bool
        Convert the imported model to pure float16
        (:class:`~tvm_ext.frontend.fp16.ConvertToFloat16`).
    canonicalize : bool
        Run :func:`~tvm_ext.frontend.canonicalize.canonicalize_passes` (before, and after
        the fp16 conversion).
    opset : int, optional
        Override the default-domain opset read from the model.
    bind : mapping of str to array-like, optional
        Values for graph inputs, which become constants (:func:`~tvm_ext.frontend.bind.bind_inputs`);
        needed where an input feeds an operand the importer requires constant (Reshape's shape,
        Slice's starts, a Reduce's axes, TopK's k ...). Keys are ONNX input names.

    Returns
    -------
    tvm.IRModule
        ``main`` takes the graph inputs (initializers excluded) in graph order, named by C
        identifiers; its attribute ``"tvm_ext.onnx_names"`` maps them to the ONNX names.

    Raises
    ------
    ModelLoadError, UnboundDimensionError, ShapeOverrideError, InputBindingError,
    UnsupportedOpsError, ModelConversionError
    """
    proto = load_onnx(model)
    _check_dtype(dtype)
    proto = bind_inputs(proto, bind or {})  # a copy when anything is bound
    missing = unsupported_ops(proto)
    if missing:
        raise UnsupportedOpsError(missing)
    static_shapes = bind_input_shapes(proto.graph, shapes)
    logger.debug("importing '%s' with input shapes %s", proto.graph.name, static_shapes)
    onnx_names = [i.name for i in user_inputs(proto.graph)]
    renames = identifier_renames(proto)
    if proto is model:  # the caller's proto: rewrite a copy
        proto = _copy(proto)
    constants = normalize_constant_nodes(proto)
    if constants:
        logger.debug("rewrote %d Constant node(s) to tensor values", constants)
    if renames:
        rename_values(proto, renames)
        logger.info("renamed %d ONNX value(s) to C identifiers, e.g. %s", len(renames),
                    ", ".join(f"'{old}' -> '{new}'" for old, new in list(renames.items())[:3]))
    static_shapes = {renames.get(name, name): dims for name, dims in static_shapes.items()}
    folded = fold_shape_arithmetic(proto, static_shapes)
    if folded:
        logger.info("folded %d static shape computation(s) to constants", folded)

    dtype_dict = {}
    for inp in user_inputs(proto.graph):
        elem = inp.type.tensor_type.elem_type
        dtype_dict[inp.name] = (
            str(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else dtype
        )
    from tvm.relax.frontend.onnx import from_onnx as relax_from_onnx

    try:
        with _without_onnx_checker():
            mod = relax_from_onnx(
                proto,
                shape_dict={k: list(v) for k, v in static_shapes.items()},
                dtype_dict=dtype_dict,
                opset=opset if opset is not None else _default_opset(proto),
                keep_params_in_input=False,
            )
    except TVM_ERRORS + (AssertionError,) as err:  # AssertionError: the converters assert what they expect
        first_line = (str(err).strip().splitlines() or [""])[0]
        raise ModelConversionError(
            f"the Relax ONNX importer failed on graph '{proto.graph.name}': "
            f"{type(err).__name__}: {first_line}{_binding_hint(proto, renames)}"
        ) from err
    mod = finalize_module(mod, fp16=fp16, canonicalize=canonicalize)
    main = mod["main"]
    mod["main"] = main.with_attr(ONNX_NAMES_ATTR, {p.name: name for p, name in zip(main.params, onnx_names)})
    return mod


def _binding_hint(proto: onnx.ModelProto, renames: Mapping[str, str]) -> str:
    """What to bind when graph inputs feed operands the importer needs constant ('' if none)."""
    needs = constant_operand_inputs(proto.graph)
    if not needs:
        return ""
    original = {new: old for old, new in renames.items()}
    names = [original.get(name, name) for name in needs]
    uses = "; ".join(f"'{original.get(n, n)}' feeds {', '.join(ops[:2])}" for n, ops in needs.items())
    example = names[0]
    return (f" (graph input(s) {uses}: the importer needs them constant; bind their values, e.g. "
            f"from_onnx(..., bind={{'{example}': [...]}}) or --bind {example}=V1,V2,...)")


@contextlib.contextmanager
def _without_onnx_checker() -> Iterator[None]:
    """TVM's importer runs ``onnx.checker.check_model`` on the whole model and only turns what it
    finds into warnings; the check serializes the model with its weights first (1.5 s of BERT-base's
    10 s import, more for larger models). Within this block the importer skips it: a model the
    checker would flag still imports (with a warning) either way, an operator without a converter
    was refused before (:func:`unsupported_ops`), and each converter checks the nodes it converts."""
    checker = onnx.checker.check_model
    onnx.checker.check_model = lambda *args, **kwargs: None
    try:
        yield
    finally:
        onnx.checker.check_model = checker


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


def _check_dtype(dtype: str) -> None:
    try:
        tvm.runtime.DataType(dtype)
    except TVM_ERRORS:
        raise TvmExtError(f"dtype {dtype!r} is not a valid data type name") from None
