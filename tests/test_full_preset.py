"""The `full` preset on the bundled BERT layer: every technique's candidates, one cost-based
selection; the side-by-side comparison and the pictures of the notebook view."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import pytest

from tvm_ext.inspect import compare
from tvm_ext.inspect.pictures import COLOURS, graph_svg, kernel_chart_svg
from tvm_ext.models import BUNDLED_FILE
from tvm_ext.testing.oracle import check_model

PRESETS = ["baseline", "stitch", "cutlass", "full"]
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def comparison():
    return compare(str(BUNDLED_FILE), PRESETS, "tvm_ext/h100", fp16=True)


@pytest.fixture(scope="module")
def full(comparison):
    return comparison.reports[PRESETS.index("full")]


def test_full_uses_every_technique_and_is_never_worse(comparison, full):
    rows = {r["preset"]: r for r in comparison.rows()}
    # the combination: library GEMMs and stitched kernels in one build, chosen by cost
    assert {"cutlass", "stitch"} <= set(rows["full"]["generators"])
    others = [rows[p]["modelled_time_s"] for p in PRESETS if p != "full"]
    assert rows["full"]["modelled_time_s"] <= min(others)
    assert rows["full"]["launches"] <= rows["baseline"]["launches"]
    selection = full.selection["main"]
    # the solver's notes (not orchestrate's enumeration counts or the graph-rewrite choices of CheaperOf)
    solver = [n for n in selection["notes"]
              if not n.startswith(("orchestrate:", "horizontal ", "fission ", "tilegraph:"))]
    assert any(n.startswith("horizontal kept") for n in selection["notes"])   # Q/K/V: one GEMM, priced lower
    assert solver and all("solved to optimality" in n and "time limit" not in n for n in solver)
    assert selection["objective_s"] > 0 and sum(selection["chosen"].values()) == len(full.groups)
    # the modelled total is the sum of its priced launches, each with a source
    assert full.modelled_time_s == pytest.approx(sum(k.calls * k.modelled_s for k in full.launches))
    assert {k.cost_source for k in full.launches} == {"analytic"}


def test_compare_table_json_and_bar_chart(comparison):
    table = comparison.to_table()
    assert table.splitlines()[0].startswith("bert_layer.onnx on h100 (modelled, not measured)")
    assert [line.split()[0] for line in table.splitlines()[3:]] == PRESETS
    data = json.loads(json.dumps(comparison.to_json()))
    best = min(r["modelled_time_s"] for r in data["rows"])
    assert [r["vs_best"] for r in data["rows"]] == pytest.approx([r["modelled_time_s"] / best for r in data["rows"]])
    page = comparison._repr_html_()
    svg = ET.fromstring(page[page.index("<svg"):page.index("</svg>") + 6])
    assert len(svg.findall(f"{SVG}rect")) == len(PRESETS)


def test_kernel_chart_has_a_bar_per_kernel(full):
    svg = ET.fromstring(kernel_chart_svg(full))
    bars = [r for r in svg.findall(f"{SVG}rect") if r.get("fill") != "#dddddd"]
    assert len(bars) == len(full.launches)
    assert {b.get("fill") for b in bars} <= set(COLOURS.values())
    texts = " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    assert "(analytic)" in texts and "modelled time per inference" in texts


def test_graph_picture_clusters_operators_by_kernel(full):
    svg = ET.fromstring(graph_svg(full, use_graphviz=False))
    kernels = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "kernel"]
    # one box per kernel of the fused graph (several calls of one kernel are separate boxes)
    assert len(kernels) == len(full.groups)
    names = {g.find(f"{SVG}title").text for g in kernels}
    assert names == {g.func for g in full.groups}
    captions = {g.find(f"{SVG}title").text: g.findall(f"{SVG}text")[1].text for g in kernels}
    views = {g.func for g in full.groups if not g.kernels}   # e.g. the reshape after a library call
    generators = {"cutlass", "stitch", "dlight", "fuseops", "orchestrate", "subprogram", "tilegraph"}
    assert all(c.split(",")[0] in generators and c.endswith("s") for f, c in captions.items() if f not in views)
    assert all(captions[f] == "none, not priced" for f in views)


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' not installed")
def test_graph_picture_with_graphviz(full):
    svg = ET.fromstring(graph_svg(full))
    assert svg.tag == f"{SVG}svg"


def test_full_graph_numerics_match_onnxruntime():
    """The CPU build of full's graph stage (library generators need CUDA and are left out there)."""
    result = check_model(str(BUNDLED_FILE), "full")
    assert result.ok, result.message()


def test_epilogue_ops_a_library_kernel_leaves_join_a_stitched_kernel():
    """CUTLASS takes matmul + bias but not the per-channel layer scale (ConvNeXt's pattern); the
    stitch generator, seeing the CUTLASS candidates, offers the scale with the transpose and
    residual add that follow: two kernels, not a CUTLASS GEMM plus two small ones. (With
    tilegraph's candidates, its merge of the same three ops may price lower and be chosen.)"""
    import dataclasses

    from tvm.script import ir as I, relax as R

    from tvm_ext.driver import get_preset
    from tvm_ext.inspect import inspect

    @I.ir_module
    class LayerScale:
        @R.function
        def main(x: R.Tensor((256, 512), "float16"), w: R.Tensor((512, 512), "float16"),
                 b: R.Tensor((512,), "float16"), g: R.Tensor((512,), "float16"), r: R.Tensor((512, 256), "float16")):
            with R.dataflow():
                y = R.multiply(R.add(R.matmul(x, w), b), g)
                o = R.add(R.permute_dims(y), r)
                R.output(o)
            return o

    full = get_preset("full")
    without = dataclasses.replace(full, generators=tuple(g for g in full.generators if g != "tilegraph"))
    for preset, fused_by in ((without, {"stitch"}), (full, {"stitch", "tilegraph"})):
        report = inspect(LayerScale, "tvm_ext/h100", preset)
        kernels = {k.generator: k for k in report.launches}
        assert report.kernels == 2 and "cutlass" in kernels
        (epilogue,) = set(kernels) - {"cutlass"}
        assert epilogue in fused_by
        fused = next(g for g in report.groups if g.func == kernels[epilogue].func)
        assert fused.ops == ("multiply", "transpose", "add1")
