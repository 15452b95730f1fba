"""The ``tvm-ext`` command line (in-process through ``main``; one subprocess for the entry point)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tvm_ext.cli import main, parse_shape_arg
from tvm_ext.hardware import load_device
from tvm_ext.models import get_model

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def mlp_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "mlp.onnx"
    onnx.save(get_model("mlp", batch=4, sizes=(32, 64, 16)), str(path))
    return path


@pytest.fixture(scope="session")
def free_dim_file(tmp_path_factory) -> Path:
    """An MLP whose batch dimension is symbolic (needs --shapes)."""
    model = get_model("mlp", batch=4, sizes=(32, 16))
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path_factory.mktemp("models") / "mlp_free.onnx"
    onnx.save(model, str(path))
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in err


def test_parse_shape_arg():
    assert parse_shape_arg("input_ids=1x128") == ("input_ids", (1, 128))
    assert parse_shape_arg("a=b=2,3") == ("a=b", (2, 3))


def test_presets(capsys):
    code, out, _ = _run(capsys, "presets")
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines()}
    assert "implemented" in lines["baseline"]
    assert "implemented" in lines["full"] and "implemented" in lines["tilegraph"]
    assert {"baseline", "stitch", "tilegraph", "orchestrate", "subprogram", "cutlass", "full"} <= set(lines)


def test_devices(capsys):
    code, out, _ = _run(capsys, "devices")
    assert code == 0
    rows = {ln.split()[0]: ln for ln in out.splitlines()}
    row = rows["h100"]
    assert "sm_90" in row and " 132 " in row and "3.35" in row and "tvm_ext/h100" in row
    # per device: the kernels the shipped measurements price, and the cost-model constants fitted to them
    from tvm_ext.select.database import shipped_database

    measured = sum(r.device == "h200" for r in shipped_database())
    assert "measured kernels" in out.splitlines()[0] and measured > 0
    assert rows["h200"].split()[-5:] == [str(measured), "8", "fitted", "on", "h200"]
    assert row.split()[-8:] == [str(measured), "on", "h200,", "scaled", "8", "fitted", "on", "h200"]
    assert rows["a100"].split()[-2:] == ["-", "-"]


def test_inspect_json(capsys, mlp_file):
    code, out, _ = _run(capsys, "inspect", str(mlp_file), "--target", "tvm_ext/h100", "--preset", "baseline", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["model"] == "mlp.onnx" and data["preset"] == "baseline"
    # MLP 32 -> 64 -> 16: Gemm + Relu, Gemm; each Gemm's bias (and relu) fuses into its matmul
    assert data["groups"] == [["matmul", "add", "relu"], ["matmul1", "add1"]]
    assert isinstance(data["kernels"], int) and data["kernels"] == 2
    assert data["kernels"] == sum(g["kernels"] for g in data["group_details"])


def test_inspect_table_with_shapes_and_cuda_file(capsys, free_dim_file, tmp_path):
    cuda = tmp_path / "k.cu"
    code, out, _ = _run(capsys, "inspect", str(free_dim_file), "--shapes", "x=2x32", "--cuda", str(cuda))
    assert code == 0
    assert "kernel launches / inference" in out and "fused groups:" in out
    assert "__global__" in cuda.read_text()
    assert out.splitlines()[1].split() == ["preset", "full"]                 # the default preset


def test_compile_exports_library(capsys, mlp_file, tmp_path):
    out_so = tmp_path / "mlp.so"
    code, out, _ = _run(capsys, "compile", str(mlp_file), "--target", "tvm_ext/h100", "--preset", "baseline",
                        "-o", str(out_so), "--embed-source")  # no nvcc needed
    assert code == 0 and out_so.is_file()
    assert f"wrote {out_so}" in out and "2 kernel launches (2 distinct kernels)" in out
    assert "CUDA source embedded" in out
    if shutil.which("nm"):  # the library holds a host launcher per fused group
        nm = subprocess.run(["nm", "-D", "--defined-only", str(out_so)], capture_output=True, text=True,
                            check=True).stdout.split()
        assert {"__tvm_ffi_fused_matmul_add_relu", "__tvm_ffi_fused_matmul1_add1"} <= set(nm)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_compile_builds_device_code_with_nvcc(capsys, mlp_file, tmp_path):
    code, out, _ = _run(capsys, "compile", str(mlp_file), "-o", str(tmp_path / "m.so"))
    assert code == 0
    assert "compiled CUDA device code (sm_90 SASS + compute_90 PTX), nvcc" in out


def test_check_passes_and_reports_error(capsys, mlp_file):
    code, out, _ = _run(capsys, "check", str(mlp_file), "--preset", "baseline")
    assert code == 0
    assert "max rel err" in out and out.rstrip().endswith("ok")


@pytest.fixture(scope="session")
def shape_input_file(tmp_path_factory) -> Path:
    """y = reshape(x, shape) with the shape a graph input (needs --bind)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 12]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("models") / "reshape.onnx"
    onnx.save(model, str(path))
    return path


def test_check_with_bound_input(capsys, shape_input_file):
    code, out, _ = _run(capsys, "check", str(shape_input_file), "--preset", "baseline", "--bind", "shape=2,3,4")
    assert code == 0 and out.rstrip().endswith("ok")


def test_unbound_shape_input_error_says_what_to_bind(capsys, shape_input_file):
    code, _, err = _run(capsys, "check", str(shape_input_file), "--preset", "baseline")
    _assert_one_line_error(code, err, "--bind shape=V1,V2,...")


@pytest.mark.parametrize("value, needle", [("shape", "--bind expects NAME=V1,V2"), ("nope=1", "'nope': not a graph input")])
def test_bad_bind_is_one_line(capsys, shape_input_file, value, needle):
    code, _, err = _run(capsys, "check", str(shape_input_file), "--bind", value)
    _assert_one_line_error(code, err, needle)


def test_check_mismatch_exits_1(capsys, mlp_file):
    # fp16 against the fp32 onnxruntime reference cannot meet a zero tolerance
    code, out, _ = _run(capsys, "check", str(mlp_file), "--fp16", "--rtol", "0", "--atol", "0")
    assert code == 1
    assert "MISMATCH" in out


def test_demo_on_bundled_bert_layer(capsys):
    code, out, _ = _run(capsys, "demo", "--target", "tvm_ext/h100", "--preset", "baseline", "--json")
    assert code == 0
    data = json.loads(out)
    (run,) = data["runs"]                                     # baseline alone: one run
    report = run["report"]
    assert report["model"] == "bert_layer.onnx" and run["preset"] == "baseline"
    # baseline fusion of one BERT layer (see test_pipeline's itemization): 11 distinct kernels, 15
    # launches because the Q/K/V projections run one kernel 3 times, the Q/V head split one kernel
    # twice and the layer norm kernel twice
    assert report["distinct_kernels"] == 11 and report["kernels"] == 11 + 2 + 1 + 1
    assert report["kernels"] == sum(g["kernels"] for g in report["group_details"])
    assert run["check"]["ok"] is True and data["ok"] is True
    h100 = load_device("h100")  # fp32 roofline: max(compute time, time to move the minimum traffic)
    assert run["roofline_bound_s"] == report["roofline_bound_s"] == pytest.approx(
        max(report["flops"] / h100.peak_flops_for("float32"), report["min_traffic_bytes"] / h100.dram_bandwidth_bytes_per_s))
    # the cost model prices every launch: the modelled time is their sum, above the roofline bound
    assert run["modelled_time_s"] == report["modelled_time_s"] == pytest.approx(
        sum(k["calls"] * k["modelled_s"] for k in report["launches"]))
    assert report["modelled_time_s"] > report["roofline_bound_s"]
    if shutil.which("nvcc"):
        assert run["nvcc"]["arch"] == "sm_90" and run["nvcc_note"].startswith("ok")
    assert (run["gpu_latency_s_measured"] is None) != (run["cpu_latency_s_measured"] is None)


def test_demo_shows_baseline_beside_the_preset(capsys):
    code, out, _ = _run(capsys, "demo", "--preset", "stitch")
    assert code == 0
    table = out[out.index("bert_layer.onnx on h100 (modelled, not measured)"):]
    assert [line.split()[0] for line in table.splitlines()[3:5]] == ["baseline", "stitch"]
    for preset in ("baseline", "stitch"):
        assert f"[{preset}] CPU check vs onnxruntime: " in out
    assert out.rstrip().endswith("demo: PASS")


@pytest.mark.parametrize("argv, needle", [
    (["inspect", "missing.onnx"], "missing.onnx"),
    (["check", "missing.onnx"], "missing.onnx"),
    (["compile", "missing.onnx", "-o", "x.so"], "missing.onnx"),
    (["inspect", "MLP", "--shapes", "x=1xa"], "--shapes"),
    (["inspect", "MLP", "--shapes", "x1x2"], "--shapes"),
    (["inspect", "MLP", "--preset", "nope"], "unknown preset 'nope'"),
    (["inspect", "MLP", "--target", "tvm_ext/nope"], "nope"),
    (["compile", "MLP", "-o", "/no/such/dir/m.so"], "/no/such/dir"),
    (["frobnicate"], "invalid choice"),
    ([], "command is required"),
])
def test_bad_input_gives_one_line_error(capsys, mlp_file, argv, needle):
    argv = [str(mlp_file) if a == "MLP" else a for a in argv]
    code, _, err = _run(capsys, *argv)
    _assert_one_line_error(code, err, needle)


def test_unbound_dimension_is_a_one_line_error(capsys, free_dim_file):
    code, _, err = _run(capsys, "inspect", str(free_dim_file))
    _assert_one_line_error(code, err, "batch")


def test_python_dash_m_entry_point():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "tvm_ext", "presets"], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "baseline" in proc.stdout and "implemented" in proc.stdout


# ---------------------------------------------------------------- user-facing examples
def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_run_demo_script_is_the_demo_command():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "run_demo.py"), "--help"], capture_output=True,
                          text=True, cwd=REPO, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: tvm-ext demo" in proc.stdout and "--preset" in proc.stdout


def test_compile_onnx_example_runs(tmp_path, mlp_file):
    proc = subprocess.run([sys.executable, str(REPO / "python" / "compile_onnx_example.py"), str(mlp_file),
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "same set of kernels in all three: True" in proc.stdout
    assert sorted(p.name for p in tmp_path.glob("*.so")) == [f"mlp_way{i}.so" for i in (1, 2, 3)]


def test_notebook_cells_run_in_order(capsys):
    notebook = json.loads((REPO / "python" / "inspect_bert_layer.ipynb").read_text())
    assert notebook["nbformat"] == 4 and notebook["metadata"]["kernelspec"]["language"] == "python"
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and "source" in c for c in cells)
    namespace: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"<notebook cell {i}>", "exec"), namespace)
    capsys.readouterr()
    report = namespace["report"]
    assert report.model == "IRModule" and report.kernels == namespace["summary"]["kernels"]
    assert report._repr_html_().startswith("<div")
    assert namespace["kernel"].lstrip().startswith('extern "C" __global__')
    assert namespace["group"].flops == max(g.flops for g in report.groups)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_verify_lists_every_kernel_with_its_checks(capsys, mlp_file):
    code, out, _ = _run(capsys, "verify", str(mlp_file), "--preset", "stitch")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:4] == ["kernel", "generator", "checks", "verdict"]
    assert "allreduce lint, write-once lint, emulated" in out and "ptxas" in out
    (summary,) = [line for line in lines if "kernels (stitch, h100)" in line]
    assert "0 with findings, 0 unchecked" in summary


def test_verify_json_counts(capsys, mlp_file):
    code, out, _ = _run(capsys, "verify", str(mlp_file), "--preset", "baseline", "--json")
    report = json.loads(out)
    assert code == 0 and report["counts"]["kernels"] == len(report["kernels"]) > 0
    assert report["counts"]["findings"] == 0


def test_verify_takes_an_emulation_time_limit(capsys, mlp_file):
    """A time limit too short for any launch lists every emulated kernel unchecked, saying so."""
    code, out, _ = _run(capsys, "verify", str(mlp_file), "--preset", "baseline", "--json",
                        "--emulation-seconds", "1e-9")
    report = json.loads(out)
    assert report["counts"]["unchecked"] == report["counts"]["kernels"] > 0
    assert "ran past its 1e-09 s" in out
    code, _, err = _run(capsys, "verify", str(mlp_file), "--emulation-seconds", "0")
    assert code == 2 and "positive number of seconds" in err
