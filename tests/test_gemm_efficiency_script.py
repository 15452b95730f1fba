"""scripts/gemm_efficiency.py on a hand-made inspect report: GEMM-like rows, shares of the peak, the bar."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gemm_efficiency.py"


def _report(tmp_path: Path) -> Path:
    """Two GEMMs and a layer norm, as `tvm-ext inspect --json` writes them (`full`: CUDA-graph launches)."""
    groups = [{"func": "big_gemm", "flops": 9.894e9, "traffic_bytes": 26_950_000},     # 10 us at peak
              {"func": "small_gemm", "flops": 4.53e8, "traffic_bytes": 4_321_000},
              {"func": "layer_norm", "flops": 2e6, "traffic_bytes": 400_000}]
    launches = [{"func": "big_gemm", "generator": "cutlass", "calls": 1, "kernels_per_call": 1, "modelled_s": 21e-6},
                {"func": "small_gemm", "generator": "cutlass", "calls": 12, "kernels_per_call": 1,
                 "modelled_s": 2.87e-6},
                {"func": "layer_norm", "generator": "stitch", "calls": 24, "kernels_per_call": 1,
                 "modelled_s": 1.9e-6}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"model": "m.onnx", "preset": "full", "target": "tvm_ext/h100",
                                "group_details": groups, "launches": launches}))
    return path


def test_rows_shares_and_the_bar(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--from-json", str(_report(tmp_path))],
                         capture_output=True, text=True, check=True)
    rows = [line.split("  ") for line in out.stdout.splitlines()[1:]]
    assert [r[1] for r in rows] == ["big_gemm", "small_gemm"]          # the layer norm is no GEMM
    big, small = rows
    assert big[0] == "m sm_90" and big[6] == "47.6" and big[7] == "50.0" and big[9] == "yes"
    # 0.453 GFLOP in 2.87 us is 16% of the 989.4 TFLOP/s peak; 24.5% past the 1 us graph launch
    assert small[6] == "16.0" and small[7] == "24.5" and small[9] == "NO"
    assert "2 GEMM-like kernels, 1 below the bar" in out.stderr
