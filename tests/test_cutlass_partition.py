"""Partition tests for the CUTLASS offload: Before/Expected TVMScript per pattern and epilogue,
and what must stay in the graph (tvm.ir.assert_structural_equal)."""
from __future__ import annotations

import textwrap

import pytest
import tvm
from tvm.script import from_source

from tvm_ext.cutlass import partition_for_cutlass, cutlass_patterns
from tvm_ext.cutlass.epilogue import ACTIVATIONS, Epilogue
from tvm_ext.cutlass.patterns import CompositeName

# Operator cases: (params, op line producing `y`, relax ops in the line(s), param names used first-to-last)
OPS = {
    "matmul": dict(params={"x": ((64, 32), "{dt}"), "w": ((32, 48), "{dt}")},
                   lines=["y = R.matmul(x, w)"], ops=["matmul"], order=["x", "w"], out=(64, 48)),
    "batch_matmul": dict(params={"x": ((4, 64, 32), "{dt}"), "w": ((4, 32, 48), "{dt}")},
                         lines=["y = R.matmul(x, w)"], ops=["matmul"], order=["x", "w"], out=(4, 64, 48)),
    "dense": dict(params={"x": ((2, 64, 32), "{dt}"), "w": ((48, 32), "{dt}")},
                  lines=["wt = R.permute_dims(w)", "y = R.matmul(x, wt)"], ops=["permute_dims", "matmul"],
                  order=["w", "x"], out=(2, 64, 48)),
    "conv2d": dict(params={"x": ((1, 8, 8, 16), "{dt}"), "w": ((48, 3, 3, 16), "{dt}")},
                   lines=['y = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")'],
                   ops=["nn_conv2d"], order=["x", "w"], out=(1, 8, 8, 48)),
}

ACT_LINES = {
    "relu": (["a = R.nn.relu({v})"], ["nn_relu"]),
    "gelu": (["a = R.nn.gelu({v})"], ["nn_gelu"]),
    "gelu_tanh": (["a = R.nn.gelu_tanh({v})"], ["nn_gelu_tanh"]),
    "silu": (["a = R.nn.silu({v})"], ["nn_silu"]),
    "sigmoid": (["a = R.sigmoid({v})"], ["sigmoid"]),
    "hardswish": (['h0 = R.add({v}, R.const(3, "{dt}"))', "h1 = R.clip(h0, 0, 6)",
                   'h2 = R.divide(h1, R.const(6, "{dt}"))', "a = R.multiply({v}, h2)"],
                  ["add", "clip", "divide", "multiply"]),
}


def _case(op: str, ep: Epilogue, dt: str = "float16", final: str = "float32"):
    """Lines of the matched region, fused function name, params (in call order) and main params."""
    spec = OPS[op]
    params = {k: (s, d.format(dt=dt)) for k, (s, d) in spec["params"].items()}
    order = list(spec["order"])
    lines, ops, cur = list(spec["lines"]), list(spec["ops"]), "y"
    consts = 0
    if ep.source == "bias":
        params["b"] = ((spec["out"][-1],), dt)
        lines.append(f"s = R.add({cur}, b)"), ops.append("add"), order.append("b")
        cur = "s"
    elif ep.source == "residual":
        params["r"] = (spec["out"], dt)
        lines.append(f"s = R.add({cur}, r)"), ops.append("add"), order.append("r")
        cur = "s"
    elif ep.source == "bias_residual":
        params["b"], params["r"] = ((spec["out"][-1],), dt), (spec["out"], dt)
        lines += [f"s = R.add({cur}, b)", "t = R.add(s, r)"]
        ops += ["add", "add"]
        order += ["b", "r"]
        cur = "t"
    if ep.activation:
        act_lines, act_ops = ACT_LINES[ep.activation]
        lines += [t.format(v=cur, dt=dt) for t in act_lines]
        ops += act_ops
        consts = 2 if ep.activation == "hardswish" else 0
        cur = "a"
    if ep.cast:
        lines.append(f'c = R.astype({cur}, "{final}")'), ops.append("astype")
        cur = "c"
    assert lines[-1].startswith(cur + " = ")
    lines[-1] = "gv" + lines[-1][len(cur):]
    fname = "fused_" + "_".join("relax_" + o for o in ops) + "_tvm_ext_cutlass"
    return params, order, lines, fname, consts


def _sig(params: dict, names: list[str], suffix: str = "") -> str:
    return ", ".join(f'{n}{suffix}: R.Tensor({tuple(params[n][0])}, "{params[n][1]}")' for n in names)


def _indent(lines: list[str], depth: int) -> list[str]:
    return [" " * (4 * depth) + line for line in lines]


def _before(params, lines) -> str:
    out = ["@I.ir_module", "class Module:", "    @R.function", f"    def main({_sig(params, list(params))}):",
           "        with R.dataflow():"]
    out += _indent(lines + ["R.output(gv)"], 3) + ["        return gv"]
    return "\n".join(out) + "\n"


def _expected(params, order, lines, fname, composite, consts, dt, tail: tuple[str, ...] = (),
              result: str = "gv") -> str:
    """The partitioned module: ``lines`` (last one binding ``gv``) offloaded as ``fname``; in main its
    result is bound to ``result`` and the ``tail`` lines (last one binding ``gv``) stay in the graph."""
    inner_params = _sig(params, order) + "".join(f', c{i}: R.Tensor((), "{dt}")' for i in range(consts))
    inner_lines = list(lines)
    if consts:  # FuseOpsByPattern lifts the hardswish constants into parameters (bind_constants=False)
        inner_lines = [ln.replace(f'R.const(3, "{dt}")', "c0").replace(f'R.const(6, "{dt}")', "c1") for ln in lines]
    args = ", ".join(order)
    const_args = "".join(f', R.const({v}, "{dt}")' for v in (3, 6)[:consts])
    out = ["@I.ir_module", "class Module:", "    @R.function", f"    def {fname}({inner_params}):",
           '        R.func_attr({"Codegen": "tvm_ext_cutlass"})', "        @R.function",
           f"        def local_func({inner_params}):", f'            R.func_attr({{"Composite": "{composite}"}})',
           "            with R.dataflow():"]
    out += _indent(inner_lines + ["R.output(gv)"], 4)
    out += ["            return gv", f"        output = local_func({args}{''.join(f', c{i}' for i in range(consts))})",
            "        return output", "", "    @R.function", f"    def main({_sig(params, list(params))}):",
            "        cls = Module", "        with R.dataflow():", f"            {result} = cls.{fname}({args}{const_args})"]
    out += _indent(list(tail) + ["R.output(gv)"], 3) + ["        return gv"]
    return "\n".join(out) + "\n"


def _parse(text: str) -> tvm.IRModule:
    from tvm.script import ir as I
    from tvm.script import relax as R

    return from_source(textwrap.dedent(text), extra_vars={"I": I, "R": R})


EPILOGUES = ([Epilogue(), Epilogue("bias"), Epilogue("residual"), Epilogue("residual", "relu"),
              Epilogue("bias_residual"), Epilogue("bias_residual", "relu"), Epilogue("bias_residual", "gelu"),
              Epilogue(activation="gelu"), Epilogue(activation="relu", cast=True), Epilogue(cast=True)]
             + [Epilogue("bias", act) for act in ACTIVATIONS])


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("ep", EPILOGUES, ids=lambda e: e.suffix.strip("_") or "plain")
def test_offload_pattern(op: str, ep: Epilogue):
    dt = "float16"
    params, order, lines, fname, consts = _case(op, ep, dt)
    before = _parse(_before(params, lines))
    composite = CompositeName(op, ep).name
    expected = _parse(_expected(params, order, lines, fname, composite, consts, dt))
    after = partition_for_cutlass(before)
    tvm.ir.assert_structural_equal(after, expected)


def test_bf16_and_silu_as_mul_sigmoid():
    params = {"x": ((64, 32), "bfloat16"), "w": ((32, 48), "bfloat16")}
    lines = ["y = R.matmul(x, w)", "sg = R.sigmoid(y)", "gv = R.multiply(y, sg)"]
    fname = "fused_relax_matmul_relax_sigmoid_relax_multiply_tvm_ext_cutlass"
    expected = _parse(_expected(params, ["x", "w"], lines, fname, "tvm_ext_cutlass.matmul_silu", 0, "bfloat16"))
    tvm.ir.assert_structural_equal(partition_for_cutlass(_parse(_before(params, lines))), expected)


def test_leaking_intermediate_keeps_epilogue_outside():
    params = {"x": ((64, 32), "float16"), "w": ((32, 48), "float16"), "b": ((48,), "float16")}
    before = _parse(_before(params, ["y = R.matmul(x, w)", "s = R.add(y, b)", "a = R.nn.relu(s)",
                                     "e = R.exp(y)", "gv = R.add(a, e)"]))
    expected = _parse(textwrap.dedent("""
    @I.ir_module
    class Module:
        @R.function
        def fused_relax_matmul_tvm_ext_cutlass(x: R.Tensor((64, 32), "float16"), w: R.Tensor((32, 48), "float16")):
            R.func_attr({"Codegen": "tvm_ext_cutlass"})
            @R.function
            def local_func(x_1: R.Tensor((64, 32), "float16"), w_1: R.Tensor((32, 48), "float16")):
                R.func_attr({"Composite": "tvm_ext_cutlass.matmul"})
                with R.dataflow():
                    gv = R.matmul(x_1, w_1)
                    R.output(gv)
                return gv
            output = local_func(x, w)
            return output

        @R.function
        def main(x: R.Tensor((64, 32), "float16"), w: R.Tensor((32, 48), "float16"), b: R.Tensor((48,), "float16")):
            cls = Module
            with R.dataflow():
                y = cls.fused_relax_matmul_tvm_ext_cutlass(x, w)
                s = R.add(y, b)
                a = R.nn.relu(s)
                e = R.exp(y)
                gv = R.add(a, e)
                R.output(gv)
            return gv
    """))
    tvm.ir.assert_structural_equal(partition_for_cutlass(before), expected)


NOT_OFFLOADED = {
    "float32 inputs": ({"x": ((64, 32), "float32"), "w": ((32, 48), "float32")}, ["gv = R.matmul(x, w)"]),
    "odd K": ({"x": ((64, 33), "float16"), "w": ((33, 48), "float16")}, ["gv = R.matmul(x, w)"]),
    "broadcast batch": ({"x": ((4, 64, 32), "float16"), "w": ((1, 32, 48), "float16")}, ["gv = R.matmul(x, w)"]),
    "depthwise conv": ({"x": ((1, 8, 8, 16), "float16"), "w": ((16, 3, 3, 1), "float16")},
                       ['gv = R.nn.conv2d(x, w, padding=1, groups=16, data_layout="NHWC", kernel_layout="OHWI")']),
    "NCHW conv": ({"x": ((1, 16, 8, 8), "float16"), "w": ((48, 16, 3, 3), "float16")},
                  ["gv = R.nn.conv2d(x, w, padding=1)"]),
    "asymmetric padding": ({"x": ((1, 8, 8, 16), "float16"), "w": ((48, 3, 3, 16), "float16")},
                           ['gv = R.nn.conv2d(x, w, padding=(0, 0, 1, 1), data_layout="NHWC", kernel_layout="OHWI")']),
    "cast to int8": ({"x": ((64, 32), "float16"), "w": ((32, 48), "float16")},
                     ["y = R.matmul(x, w)", 'gv = R.astype(y, "int8")']),
}


@pytest.mark.parametrize("case", list(NOT_OFFLOADED))
def test_not_offloaded(case: str):
    params, lines = NOT_OFFLOADED[case]
    before = _parse(_before(params, lines))
    after = partition_for_cutlass(before)
    if case == "cast to int8":  # the matmul alone is still offloaded; the cast stays outside
        expected = _expected(params, ["x", "w"], ["gv = R.matmul(x, w)"], "fused_relax_matmul_tvm_ext_cutlass",
                             "tvm_ext_cutlass.matmul", 0, "float16", tail=(lines[-1],), result="y")
        tvm.ir.assert_structural_equal(after, _parse(expected))
        return
    tvm.ir.assert_structural_equal(after, before)


def test_dynamic_shape_not_offloaded():
    before = _parse("""
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor(("m", 32), "float16"), w: R.Tensor((32, 48), "float16")):
            with R.dataflow():
                gv = R.matmul(x, w)
                R.output(gv)
            return gv
    """)
    tvm.ir.assert_structural_equal(partition_for_cutlass(before), before)


def test_wrong_hardswish_constants_not_fused():
    params = {"x": ((64, 32), "float16"), "w": ((32, 48), "float16")}
    lines = ["y = R.matmul(x, w)", 'h0 = R.add(y, R.const(2, "float16"))', "h1 = R.clip(h0, 0, 6)",
             'h2 = R.divide(h1, R.const(6, "float16"))', "gv = R.multiply(y, h2)"]
    after = partition_for_cutlass(_parse(_before(params, lines)))
    # only the GEMM; the add of 2 (not 3), clip, divide and multiply stay in main
    expected = _expected(params, ["x", "w"], ["gv = R.matmul(x, w)"], "fused_relax_matmul_tvm_ext_cutlass",
                         "tvm_ext_cutlass.matmul", 0, "float16", tail=tuple(lines[1:]), result="y")
    tvm.ir.assert_structural_equal(after, _parse(expected))


def test_pattern_names_parse_back():
    names = [p.name for p in cutlass_patterns()]
    # 4 operators x (4 sources {none, bias, residual, bias+residual} x 7 activations {none, relu, gelu,
    # gelu_tanh, silu, sigmoid, hardswish} + 7 cast variants + 5 residuals after an activation other
    # than hardswish): casts fuse only without bias/residual; a residual after the activation is
    # matched in both operand orders (two patterns, one name)
    assert len(ACTIVATIONS) == 6
    assert len(set(names)) == 4 * (4 * 7 + 7 + 5) and len(names) == len(set(names)) + 4 * 5
    for name in names:
        assert CompositeName.parse(name).name == name


def test_cast_after_bias_stays_outside():
    params = {"x": ((64, 32), "float16"), "w": ((32, 48), "float16"), "b": ((48,), "float16")}
    lines = ["y = R.matmul(x, w)", "s = R.add(y, b)", "a = R.nn.relu(s)", 'gv = R.astype(a, "float32")']
    after = partition_for_cutlass(_parse(_before(params, lines)))
    expected = _expected(params, ["x", "w", "b"], ["y = R.matmul(x, w)", "s = R.add(y, b)", "gv = R.nn.relu(s)"],
                         "fused_relax_matmul_relax_add_relax_nn_relu_tvm_ext_cutlass",
                         "tvm_ext_cutlass.matmul_bias_relu", 0, "float16", tail=(lines[-1],), result="a")
    tvm.ir.assert_structural_equal(after, _parse(expected))


# ResNet's conv+bias+add+relu and BERT's dense+bias+residual as importers write them: the adds
# may take the operator result second, and the residual may come before the bias.
BIAS_RESIDUAL_ORDERS = {
    "bias first": ["y = R.add(b, m)", "s = R.add(r, y)"],
    "residual inner": ["y = R.add(m, r)", "s = R.add(y, b)"],
}


@pytest.mark.parametrize("order", list(BIAS_RESIDUAL_ORDERS))
def test_bias_residual_any_order(order: str):
    params = {"x": ((1, 8, 8, 16), "float16"), "w": ((32, 3, 3, 16), "float16"), "b": ((1, 1, 1, 32), "float16"),
              "r": ((1, 8, 8, 32), "float16")}
    lines = ['m = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")',
             *BIAS_RESIDUAL_ORDERS[order], "gv = R.nn.relu(s)"]
    names = ["x", "w", "b", "r"] if order == "bias first" else ["x", "w", "r", "b"]
    fname = "fused_relax_nn_conv2d_relax_add_relax_add_relax_nn_relu_tvm_ext_cutlass"
    expected = _parse(_expected(params, names, lines, fname, "tvm_ext_cutlass.conv2d_bias_residual_relu", 0,
                                "float16"))
    after = partition_for_cutlass(_parse(_before(params, lines)))
    tvm.ir.assert_structural_equal(after, expected)
    from tvm_ext.cutlass import workload_from_function

    off = workload_from_function(after[fname])
    roles = dict(zip(names, off.roles))
    assert roles == {"x": "a", "w": "b", "b": "bias", "r": "residual"}


def test_bias_residual_needs_a_vector_and_a_full_tensor():
    """Two bias vectors: the inner add is a bias epilogue, the outer add stays in the graph."""
    params = {"x": ((64, 32), "float16"), "w": ((32, 48), "float16"), "b": ((48,), "float16"),
              "c": ((1, 48), "float16")}
    lines = ["y = R.matmul(x, w)", "s = R.add(y, b)", "gv = R.add(s, c)"]
    after = partition_for_cutlass(_parse(_before(params, lines)))
    expected = _expected(params, ["x", "w", "b"], ["y = R.matmul(x, w)", "gv = R.add(y, b)"],
                         "fused_relax_matmul_relax_add_tvm_ext_cutlass", "tvm_ext_cutlass.matmul_bias", 0,
                         "float16", tail=(lines[-1],), result="s")
    tvm.ir.assert_structural_equal(after, _parse(expected))


@pytest.mark.parametrize("order", ["act first", "residual first"])
def test_residual_after_activation_in_either_order(order: str):
    """act(conv + bias) + residual is one composite whichever operand of the last add is the
    residual; the workload reader finds bias and residual through the activation."""
    params = {"x": ((1, 8, 8, 16), "float16"), "w": ((32, 3, 3, 16), "float16"), "b": ((1, 1, 1, 32), "float16"),
              "r": ((1, 8, 8, 32), "float16")}
    last = "gv = R.add(a, r)" if order == "act first" else "gv = R.add(r, a)"
    lines = ['m = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")', "y = R.add(m, b)",
             "a = R.nn.silu(y)", last]
    fname = "fused_relax_nn_conv2d_relax_add_relax_nn_silu_relax_add_tvm_ext_cutlass"
    expected = _parse(_expected(params, ["x", "w", "b", "r"], lines, fname,
                                "tvm_ext_cutlass.conv2d_bias_silu_residual", 0, "float16"))
    after = partition_for_cutlass(_parse(_before(params, lines)))
    tvm.ir.assert_structural_equal(after, expected)
    from tvm_ext.cutlass import workload_from_function

    off = workload_from_function(after[fname])
    assert dict(zip(["x", "w", "b", "r"], off.roles)) == {"x": "a", "w": "b", "b": "bias", "r": "residual"}
    assert off.workload.epilogue == Epilogue("bias_residual", "silu", residual_after_act=True)


def test_shortcut_whose_residual_is_another_convs_activation():
    """YOLO's bottleneck, y + silu(conv3x3(silu(conv1x1(y))) + b3) with y = silu(conv1x1(x) + b1):
    matching the add with y as the activated operand would pull y's conv in while y is still read
    elsewhere (rejected); the swapped pattern takes the 3x3 conv with y as its residual."""
    params = {"x": ((1, 8, 8, 16), "float16"), "w1": ((16, 1, 1, 16), "float16"), "b1": ((1, 1, 1, 16), "float16"),
              "w2": ((16, 1, 1, 16), "float16"), "b2": ((1, 1, 1, 16), "float16"),
              "w3": ((16, 3, 3, 16), "float16"), "b3": ((1, 1, 1, 16), "float16")}
    lines = ['m1 = R.nn.conv2d(x, w1, data_layout="NHWC", kernel_layout="OHWI")', "y = R.nn.silu(R.add(m1, b1))",
             'm2 = R.nn.conv2d(y, w2, data_layout="NHWC", kernel_layout="OHWI")', "h = R.nn.silu(R.add(m2, b2))",
             'm3 = R.nn.conv2d(h, w3, padding=1, data_layout="NHWC", kernel_layout="OHWI")',
             "a = R.nn.silu(R.add(m3, b3))", "gv = R.add(y, a)"]
    from tvm_ext.cutlass import workload_from_function

    after = partition_for_cutlass(_parse(_before(params, lines)))
    offloads = [workload_from_function(f) for _, f in after.functions_items()
                if f.attrs is not None and "Codegen" in f.attrs]
    # the two 1x1 convolutions have one shape: one function, called twice
    assert sorted(o.composite for o in offloads) == ["tvm_ext_cutlass.conv2d_bias_silu",
                                                     "tvm_ext_cutlass.conv2d_bias_silu_residual"]
    (shortcut,) = [o for o in offloads if o.composite.endswith("_residual")]
    assert shortcut.workload.r == 3                     # the second (3x3) conv carries the shortcut


def test_residual_after_activation_keeps_the_operand_roles_of_its_adds():
    """silu(conv + r) + b with a full tensor inside and a bias vector outside is not the
    residual-after-activation form (its inner add is a residual, its outer add a bias): the
    operands are not swapped to fit it, so the activation's add stays outside a bias-first kernel."""
    params = {"x": ((1, 8, 8, 16), "float16"), "w": ((32, 3, 3, 16), "float16"), "b": ((1, 1, 1, 32), "float16"),
              "r": ((1, 8, 8, 32), "float16")}
    lines = ['m = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")', "y = R.add(m, r)",
             "a = R.nn.silu(y)", "gv = R.add(a, b)"]
    from tvm_ext.cutlass import workload_from_function

    after = partition_for_cutlass(_parse(_before(params, lines)))
    offloads = [workload_from_function(f) for _, f in after.functions_items()
                if f.attrs is not None and "Codegen" in f.attrs]
    assert [o.workload.epilogue.residual_after_act for o in offloads] == [False]


def _ffn_out(bias: bool):
    """x[128, 256] @ W^T (+ b) + residual, then a layer norm: BERT's FFN down-projection."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((128, 256), "float16"))
    r = relax.Var("r", relax.TensorType((128, 64), "float16"))
    w = relax.const(tvm.runtime.tensor(__import__("numpy").ones((64, 256), "float16")))
    gamma = relax.const(tvm.runtime.tensor(__import__("numpy").ones((64,), "float16")))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w, [1, 0]))))
            if bias:
                y = bb.emit(relax.op.add(y, gamma))
            y = bb.emit(relax.op.add(y, r))
            out = bb.emit_output(bb.emit(relax.op.nn.layer_norm(y, gamma, gamma, axes=[-1])))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.slow
@pytest.mark.parametrize("bias, proposed", [(True, 2), (False, 1)], ids=["bias_residual", "residual"])
def test_bias_residual_gemm_is_also_offered_without_the_residual(bias, proposed):
    """bias + residual may not split K: the bias-only GEMM (split-K allowed, the residual add left to
    the layer norm) is a second candidate; a residual-only epilogue splits K as it is, no variant."""
    from tvm_ext.inspect import inspect

    report = inspect(_ffn_out(bias), "tvm_ext/h100", "cutlass")
    assert report.to_json()["selection"]["main"]["proposed"]["cutlass"] == proposed
