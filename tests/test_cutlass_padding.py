"""Channel padding of CUTLASS convolutions (Bolt §3.2.3): structure, partition and CPU numerics."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from cutlass_graphs import offloaded as _offloaded_convs
from cutlass_graphs import run_llvm as _run
from tvm import relax

from tvm_ext.cutlass import (
    convert_conv_to_nhwc,
    offload_passes,
    partition_for_cutlass,
    workload_from_function,
)
from tvm_ext.cutlass.padding import (
    channel_padding,
    output_channel_padding,
    pad_conv_channels,
)

RNG = np.random.default_rng(0)


def _conv_model(channels: int, out_channels: int = 16, const_weight: bool = True, groups: int = 1,
                layout: str = "NCHW", dtype: str = "float16") -> tuple[tvm.IRModule, np.ndarray]:
    """conv3x3(+relu) whose input has ``channels`` channels; small integers keep fp16 sums exact."""
    w = RNG.integers(-1, 2, (out_channels, channels // groups, 3, 3)).astype(dtype)
    shape = (1, channels, 10, 10) if layout == "NCHW" else (1, 10, 10, channels)
    if layout == "NHWC":
        w = w.transpose(0, 2, 3, 1).copy()
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    params = [x] if const_weight else [x, relax.Var("w", relax.TensorType(w.shape, dtype))]
    kw = {} if layout == "NCHW" else {"data_layout": "NHWC", "kernel_layout": "OHWI"}
    with bb.function("main", params):
        with bb.dataflow():
            weight = relax.const(w) if const_weight else params[1]
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, weight, padding=1, groups=groups, **kw)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), w




def _convs(mod: tvm.IRModule) -> list[relax.Call]:
    found = []

    @relax.expr_functor.visitor
    class _Finder(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
                found.append(call)
            super().visit_call_(call)

    _Finder().visit_expr(mod["main"])
    return found


def _expected_padded_first_conv(w: np.ndarray) -> tvm.IRModule:
    """NCHW->NHWC transpose, pad C 3 -> 8, conv3x3 NHWC/OHWI with the zero-padded weight, relu, transpose back."""
    w_padded = np.concatenate([w.transpose(0, 2, 3, 1), np.zeros((16, 3, 3, 5), w.dtype)], axis=-1)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 10, 10), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
            p = bb.emit(relax.op.nn.pad(t, [0, 0, 0, 0, 0, 0, 0, 5]))
            c = bb.emit(relax.op.nn.conv2d(p, relax.const(w_padded), padding=1, data_layout="NHWC",
                                           kernel_layout="OHWI"))
            r = bb.emit(relax.op.nn.relu(c))
            out = bb.emit_output(relax.op.permute_dims(r, [0, 3, 1, 2]))
        bb.emit_func_output(out)
    return bb.get()


def test_first_conv_padded_to_8_channels_and_offloaded(llvm_target):
    mod, w = _conv_model(3)
    nhwc = convert_conv_to_nhwc(mod)
    padded = pad_conv_channels(nhwc)
    # activation: 5 zero channels appended to the channel axis, right after the entry transpose;
    # the constant weight (OHWI) padded the same way at compile time
    tvm.ir.assert_structural_equal(padded, _expected_padded_first_conv(w))
    # C=3 is odd: without padding CUTLASS cannot take the conv; padded, it runs with 128-bit loads
    assert not any(f.attrs and "Codegen" in f.attrs for _, f in partition_for_cutlass(nhwc).functions_items())
    part = partition_for_cutlass(padded)
    (func,) = [f for _, f in part.functions_items() if f.attrs and "Codegen" in f.attrs]
    wl = workload_from_function(func).workload
    assert (wl.c, wl.k, wl.max_alignment) == (8, 16, (8, 8, 8))
    x = RNG.integers(-2, 3, (1, 3, 10, 10)).astype("float16")
    ref = _run(mod, [x], llvm_target)
    np.testing.assert_array_equal(_run(padded, [x], llvm_target), ref)
    assert np.abs(ref).max() > 0


def test_pad_fuses_into_the_producer():
    """After legalization and fusion the pad and the NCHW->NHWC transpose are one kernel."""
    mod, _ = _conv_model(3)
    part = partition_for_cutlass(pad_conv_channels(convert_conv_to_nhwc(mod)))
    fused = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                      relax.transform.FuseOps(), relax.transform.FuseTIR()])(part)
    # main: entry transpose+pad (one kernel), the offloaded conv+relu, exit transpose
    calls = []
    for binding in fused["main"].body.blocks[0].bindings:
        call = binding.value
        if isinstance(call.op, tvm.ir.Op):  # R.call_tir(gv, args): the callee is the first argument
            calls.append((call.op.name, call.args[0].name_hint))
        else:
            calls.append(("call", call.op.name_hint))
    assert calls == [("relax.call_tir", "fused_transpose_pad"),
                     ("call", "fused_relax_nn_conv2d_relax_nn_relu_tvm_ext_cutlass"),
                     ("relax.call_tir", "transpose1")]


def test_non_constant_weight_padded_in_graph(llvm_target):
    mod, w = _conv_model(12, const_weight=False, layout="NHWC")
    padded = pad_conv_channels(mod)
    (conv,) = _convs(padded)
    assert [int(d) for d in conv.args[0].ty.shape] == [1, 10, 10, 16]
    assert [int(d) for d in conv.args[1].ty.shape] == [16, 3, 3, 16]
    assert padded["main"].script().count("R.nn.pad(") == 2
    x = RNG.integers(-2, 3, (1, 10, 10, 12)).astype("float16")
    np.testing.assert_array_equal(_run(padded, [x, w], llvm_target), _run(mod, [x, w], llvm_target))


@pytest.mark.parametrize("case", ["aligned", "depthwise", "nchw", "odd out channels", "float32", "asymmetric"])
def test_not_padded(case: str):
    if case == "asymmetric":  # CUTLASS rejects the conv for its padding: channel padding would be waste
        mod, _ = _conv_model(3, layout="NHWC")
        (conv,) = _convs(mod)
        assert channel_padding(conv) == 5  # the same conv with symmetric padding is padded
        call = relax.op.nn.conv2d(conv.args[0], conv.args[1], padding=(0, 0, 1, 1), data_layout="NHWC",
                                  kernel_layout="OHWI")
        assert channel_padding(relax.BlockBuilder().normalize(call)) == 0
        return
    if case == "aligned":
        mod, _ = _conv_model(16, layout="NHWC")
    elif case == "depthwise":
        mod, _ = _conv_model(6, out_channels=6, groups=6, layout="NHWC")
    elif case == "nchw":
        mod, _ = _conv_model(3)
    elif case == "odd out channels":
        mod, _ = _conv_model(3, out_channels=5, layout="NHWC")
    else:
        mod, _ = _conv_model(3, layout="NHWC", dtype="float32")
    assert all(channel_padding(c) == 0 for c in _convs(mod))
    tvm.ir.assert_structural_equal(pad_conv_channels(mod), mod)


def test_padding_amounts():
    for channels, extra in ((3, 5), (8, 0), (12, 4), (46, 2), (64, 0)):  # up to a multiple of 8 (128-bit loads)
        mod, _ = _conv_model(channels, layout="NHWC")
        (conv,) = _convs(mod)
        assert channel_padding(conv) == extra


def test_offload_passes_pad_before_partition():
    mod, _ = _conv_model(3)
    passes = offload_passes(tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))[:-1]  # all but RunCodegen
    part = tvm.transform.Sequential(passes)(mod)
    funcs = [f for _, f in part.functions_items() if f.attrs and "Codegen" in f.attrs]
    assert len(funcs) == 1 and workload_from_function(funcs[0]).workload.c == 8


def _head_model(bias_param: bool = False, bias_first: bool = False) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """YOLOv5's detection head in small: a 1x1 conv to 3 x 85 = 255 channels, its bias, then the
    layout change and sigmoid its readers do."""
    w = RNG.integers(-1, 2, (255, 1, 1, 16)).astype("float16")
    b = RNG.integers(-2, 3, (1, 1, 1, 255)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 16), "float16"))
    params = [x] + ([relax.Var("b", relax.TensorType(b.shape, "float16"))] if bias_param else [])
    with bb.function("main", params):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(w), data_layout="NHWC", kernel_layout="OHWI"))
            bias = params[1] if bias_param else relax.const(b)
            a = bb.emit(relax.op.add(bias, c) if bias_first else relax.op.add(c, bias))
            t = bb.emit(relax.op.permute_dims(a, [0, 3, 1, 2]))
            out = bb.emit_output(relax.op.sigmoid(t))
        bb.emit_func_output(out)
    args = {"x": RNG.integers(-2, 3, (1, 8, 8, 16)).astype("float16")} | ({"b": b} if bias_param else {})
    return bb.get(), args


def _expected_head(mod: tvm.IRModule) -> tvm.IRModule:
    """The head with 256 filters (one zero filter), the bias padded with one zero and added before
    the slice back to 255 channels."""
    conv = _convs(mod)[0]
    w = conv.args[1].value.numpy()
    add = next(b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)
               and b.value.op.name == "relax.add")
    b = add.args[1].value.numpy()
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 16), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(np.pad(w, [(0, 1), (0, 0), (0, 0), (0, 0)])),
                                           data_layout="NHWC", kernel_layout="OHWI"))
            a = bb.emit(relax.op.add(c, relax.const(np.pad(b, [(0, 0)] * 3 + [(0, 1)]))))
            s = bb.emit(relax.op.strided_slice(a, axes=[-1], begin=[0], end=[255]))
            t = bb.emit(relax.op.permute_dims(s, [0, 3, 1, 2]))
            out = bb.emit_output(relax.op.sigmoid(t))
        bb.emit_func_output(out)
    return bb.get()


def test_odd_output_channels_padded_and_the_bias_added_before_the_slice(llvm_target):
    """YOLOv5s's three heads (255 channels) ran on TVM's kernels: CUTLASS takes no odd K. One zero
    filter makes K = 256; the bias moves before the slice, so the library kernel takes it too."""
    mod, args = _head_model()
    assert not _offloaded_convs(mod)
    padded = pad_conv_channels(mod)
    tvm.ir.assert_structural_equal(padded, _expected_head(mod))
    (wl,) = _offloaded_convs(padded)
    assert (wl.c, wl.k, wl.max_alignment, wl.epilogue.source) == (16, 256, (8, 8, 8), "bias")
    ref = _run(mod, list(args.values()), llvm_target)
    np.testing.assert_array_equal(_run(padded, list(args.values()), llvm_target), ref)
    assert np.abs(ref).max() > 0


@pytest.mark.parametrize("bias_param, bias_first", [(True, False), (False, True)], ids=["bias_param", "bias_first"])
def test_a_bias_parameter_or_a_bias_added_first_moves_before_the_slice(bias_param, bias_first, llvm_target):
    mod, args = _head_model(bias_param, bias_first)
    padded = pad_conv_channels(mod)
    (wl,) = _offloaded_convs(padded)
    assert wl.k == 256 and wl.epilogue.source == "bias"
    assert padded["main"].script().count("R.strided_slice(") == 1
    np.testing.assert_array_equal(_run(padded, list(args.values()), llvm_target),
                                  _run(mod, list(args.values()), llvm_target))


def test_output_channels_padded_only_within_the_share():
    for out_channels, extra in ((255, 1), (251, 5), (250, 0), (5, 0), (9, 1), (16, 0)):   # 250: alignment 2
        mod, _ = _conv_model(8, out_channels=out_channels, layout="NHWC")
        (conv,) = _convs(mod)
        assert output_channel_padding(conv) == extra, out_channels



def test_the_rest_beside_a_library_call_is_fused_as_the_offloading_preset_fuses_it():
    """On the whole graph ``FuseOps`` puts the padded head's slice with the convolution CUTLASS
    takes, so a cost-based selection had only the slice alone beside the library call (one launch
    more than ``cutlass``, which offloads first and fuses the rest). The ``fuseops`` generator also
    proposes the rest's groups now: the slice joins the transpose and sigmoid after it."""
    from tvm_ext.driver import Preset, build
    from tvm_ext.inspect.report import report_from_stages

    mod, _ = _head_model()
    target = tvm.target.Target("tvm_ext/h100")
    selected = report_from_stages(build(mod, target, Preset("test_cutlass_fuseops", "test", selector="blp",
                                                            generators=("cutlass", "dlight", "fuseops"),
                                                            tir_pipeline="tvm_ext", cuda_graph=True)))
    offloading = report_from_stages(build(mod, target, "cutlass"))
    assert sorted(k.func for k in selected.launches) == sorted(k.func for k in offloading.launches)
    assert selected.modelled_time_s == pytest.approx(offloading.modelled_time_s)
