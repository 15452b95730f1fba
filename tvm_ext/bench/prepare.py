"""Turn a model into the Relax module a bundle compiles, with its weights kept out.

Steps (:func:`prepare`):

1. Make a skeleton of the model (committed skeletons already are one): its large float
   initializers lose their data and keep a refill recipe (:mod:`tvm_ext.models.skeleton`).
2. Move those initializers to graph *inputs*, after the real inputs, and import with
   :func:`tvm_ext.frontend.from_onnx` (fp16 when asked): ``main`` takes inputs then weights.
3. Mark ``main`` with ``num_input`` and lift what depends on weights alone (transposes,
   reshapes, casts) to ``main_transform_params``, which the measuring machine runs once
   before timing (:func:`tvm_ext.deploy.weights.lift_weight_work`, as ``tvm-ext compile
   --weights-outside`` does).

So the exported library holds code and small constants only, and the weights are
regenerated from the recipe on the GPU machine. Not folded at build time, because the
weights are unknown then: an inference BatchNormalization that follows a convolution stays a
per-channel multiply-add fused into the convolution's kernel (the corpus exports already
folded theirs into the convolution weights).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np
import onnx
import tvm
from tvm import relax

from ..deploy.signature import TRANSFORM_PARAMS
from ..deploy.weights import lift_weight_work
from ..errors import BenchError
from ..frontend.names import sanitize_value_names
from ..models.skeleton import METADATA_KEY, is_skeleton, make_skeleton
from .inputs import InputSpec, spec_for
from .numerics import sample_for
from .manifest import OutputSpec
from .suite import ModelSource, corpus_record
from .weights import WeightTensor

log = logging.getLogger(__name__)



@dataclass
class PreparedModel:
    """A model ready to compile and to compute references for.

    Attributes
    ----------
    mod : IRModule
        ``main(inputs..., params...)`` (+ ``main_transform_params`` when anything was lifted).
    onnx_inputs : ModelProto
        The fp32 graph with weights as inputs (the onnxruntime reference runs it).
    weights : list of WeightTensor
        The weights, in the order ``main_transform_params`` (or ``main``) takes them.
    """

    source: ModelSource
    dtype: str
    mod: tvm.IRModule
    onnx_inputs: onnx.ModelProto
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    weights: list[WeightTensor]
    transform_params: bool
    corpus: dict | None = None
    notes: list[str] = field(default_factory=list)


def _recipe(skeleton: onnx.ModelProto) -> dict[str, dict]:
    props = {p.key: p.value for p in skeleton.metadata_props}
    try:
        return dict(json.loads(props[METADATA_KEY])["tensors"])
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise BenchError(f"skeleton has no readable refill record: {err}") from None


def weights_as_inputs(skeleton: onnx.ModelProto, param_dtype: str) -> tuple[onnx.ModelProto, list[WeightTensor]]:
    """A copy of ``skeleton`` whose dropped initializers are graph inputs (after the real ones).

    Value names are made C identifiers first (:func:`tvm_ext.frontend.sanitize_value_names`); each
    :class:`WeightTensor` keeps its recipe name (the seed of its values) and its input name.
    """
    recipe = _recipe(skeleton)
    model = onnx.ModelProto()
    model.CopyFrom(skeleton)
    props = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    original = {t.name for t in model.graph.initializer}
    renames = sanitize_value_names(model)
    graph = model.graph
    back = {renames.get(n, n): n for n in original}
    kept = [t for t in graph.initializer if back[t.name] not in recipe]
    moved = [t for t in graph.initializer if back[t.name] in recipe]
    weights = []
    for t in moved:
        stats = recipe[back[t.name]]
        graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        weights.append(WeightTensor(back[t.name], tuple(int(d) for d in t.dims), str(stats["dtype"]), param_dtype,
                                    float(stats["mean"]), float(stats["std"]), param=t.name))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model, weights


def _static(ty: relax.TensorType, what: str) -> tuple[tuple[int, ...], str]:
    if ty.shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
        raise BenchError(f"{what} has no static shape ({ty})")
    return tuple(int(d) for d in ty.shape.values), str(ty.dtype)


def _input_specs(graph: onnx.GraphProto, main: relax.Function, n_inputs: int, corpus: dict | None) -> list[InputSpec]:
    from ..frontend import index_bounds  # noqa: PLC0415 - the rule random_inputs uses

    ranges = (corpus or {}).get("int_inputs", {})
    bounds = None
    specs = []
    for info, param in zip(list(graph.input)[:n_inputs], main.params[:n_inputs]):
        shape, dtype = _static(param.ty, f"input '{info.name}'")
        rng = ranges.get(info.name)
        if rng is None and np.dtype(dtype).kind in "iu":
            bounds = index_bounds(main) if bounds is None else bounds
            rng = (0, bounds.get(param.name, 100))
        specs.append(spec_for(info.name, shape, dtype, tuple(rng) if rng is not None else None))
    return specs


def _output_specs(graph: onnx.GraphProto, main: relax.Function) -> list[OutputSpec]:
    ret = main.ret_ty if hasattr(main, "ret_ty") else main.body.ty
    types = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    names = [o.name for o in graph.output]
    if len(types) != len(names):
        raise BenchError(f"main returns {len(types)} tensors, the ONNX graph has {len(names)} outputs")
    out = []
    for name, ty in zip(names, types):
        if not isinstance(ty, relax.TensorType):
            raise BenchError(f"output '{name}' is not a tensor ({ty})")
        shape, dtype = _static(ty, f"output '{name}'")
        out.append(OutputSpec(name, shape, dtype, sample_for(int(np.prod(shape, dtype=np.int64)))))
    return out


def prepare(source: ModelSource, *, fp16: bool = False) -> PreparedModel:
    """Load, skeletonize, import and lift ``source`` (see the module docstring).

    Raises
    ------
    BenchError, TvmExtError
        The model cannot be loaded or imported.
    """
    from ..frontend import from_onnx  # noqa: PLC0415

    model = source.load()
    skeleton = model if is_skeleton(model) else make_skeleton(model)
    corpus = corpus_record(skeleton)
    param_dtype = "float16" if fp16 else "float32"
    with_inputs, weights = weights_as_inputs(skeleton, param_dtype)
    n_inputs = len(with_inputs.graph.input) - len(weights)
    mod = from_onnx(with_inputs, fp16=fp16)
    main = mod["main"]
    if len(main.params) != n_inputs + len(weights):
        raise BenchError(f"{source.name}: main takes {len(main.params)} parameters, expected "
                         f"{n_inputs} inputs + {len(weights)} weights")
    for w, p in zip(weights, main.params[n_inputs:]):
        shape, dtype = _static(p.ty, f"weight '{w.name}'")
        if shape != w.shape or dtype != param_dtype:
            raise BenchError(f"{source.name}: weight '{w.name}' imported as {shape} {dtype}, "
                             f"expected {w.shape} {param_dtype}")
    inputs = _input_specs(with_inputs.graph, main, n_inputs, corpus)
    outputs = _output_specs(with_inputs.graph, main)
    lifted = lift_weight_work(mod, n_inputs)
    lifted_names = {gv.name_hint for gv in lifted.get_global_vars()}
    return PreparedModel(source=source, dtype=param_dtype, mod=lifted, onnx_inputs=with_inputs, inputs=inputs,
                         outputs=outputs, weights=weights, transform_params=TRANSFORM_PARAMS in lifted_names,
                         corpus=corpus)


__all__ = ["TRANSFORM_PARAMS", "PreparedModel", "weights_as_inputs", "prepare"]
