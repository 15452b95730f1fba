"""Modelled speed of every GEMM-like kernel of a build against the tensor-core peak and its memory bound.

For each model, builds it with a preset (``tvm_ext.inspect``, as ``tvm-ext inspect`` does; or reads
the JSON ``tvm-ext inspect --json`` wrote) and lists each kernel that computes at least
``--min-flops`` per call (GEMMs and convolutions; elementwise kernels never get there): its
generator, flops, modelled seconds per call, the share of the device's float16 tensor-core peak
that is (also with the per-kernel launch cost the preset is priced with taken out: 1 us assumed per
CUDA-graph node under every preset but ``baseline``, 2.4 us fitted per stream launch there), and
its memory-bound time (global traffic over the DRAM bandwidth). A kernel passes the issue's bar ("Library-speed
GEMMs") when it runs at ``--peak-share`` (25%) of the peak or within ``--memory-slack`` (1.25x)
of its memory-bound time, launch cost included. All figures are the cost model's: modelled, not
measured.

Usage::

    python3 scripts/gemm_efficiency.py bert_base_s128_b1_fp32 vit_b16_b1_fp32 --fp16
    python3 scripts/gemm_efficiency.py --from-json bert.json vit.json --markdown
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tvm_ext.hardware import DeviceSpec, load_device


@dataclass(frozen=True)
class GemmKernel:
    """One GEMM-like kernel of a build, as the report prices it."""

    model: str
    func: str
    generator: str
    calls: int
    flops: int
    traffic_bytes: int
    modelled_s: float
    launch_s: float

    def peak_share(self, device: DeviceSpec, past_launch: bool = False) -> float:
        """Flops per modelled second over the float16 tensor-core peak (``past_launch``: over the
        seconds after the launch cost)."""
        seconds = self.modelled_s - (self.launch_s if past_launch else 0.0)
        return self.flops / seconds / device.peak_flops["float16"] if seconds > 0 else float("inf")

    def memory_bound_s(self, device: DeviceSpec) -> float:
        """Global traffic over the DRAM bandwidth."""
        return self.traffic_bytes / device.dram_bandwidth_bytes_per_s

    def passes(self, device: DeviceSpec, peak_share: float, memory_slack: float) -> bool:
        return (self.peak_share(device) >= peak_share
                or self.modelled_s <= memory_slack * self.memory_bound_s(device))


def gemm_kernels(report: dict, min_flops: float, device: DeviceSpec) -> list[GemmKernel]:
    """The GEMM-like kernels of one ``tvm-ext inspect --json`` report, one row per function."""
    from tvm_ext.driver import get_preset

    graph = get_preset(report["preset"]).cuda_graph
    launch_s = device.cost.launch_overhead_graph_s if graph else device.cost.launch_overhead_s
    groups = {g["func"]: g for g in report["group_details"]}
    rows = []
    for launch in report["launches"]:
        group = groups.get(launch["func"])
        if group is None or group["flops"] < min_flops:
            continue
        model = f"{Path(str(report['model'])).stem} {_arch(report)}"
        rows.append(GemmKernel(model, launch["func"], launch["generator"],
                               launch["calls"], group["flops"], group["traffic_bytes"], launch["modelled_s"],
                               launch_s * launch.get("kernels_per_call", 1)))
    return rows


def _arch(report: dict) -> str:
    """The target's arch (``sm_90``, ``sm_90a``), as the report names it."""
    target = report.get("target", "")
    found = re.search(r"sm_\d+a?", json.dumps(target))
    if found:
        return found.group(0)
    from tvm_ext.hardware import resolve_target  # a tag: its arch

    return str(resolve_target(target).attrs.get("arch", "?"))


def _reports(args: argparse.Namespace) -> list[dict]:
    if args.from_json:
        return [json.loads(Path(p).read_text()) for p in args.from_json]
    from tvm_ext.inspect import inspect
    from tvm_ext.models.skeleton import resolve_models

    return [inspect(str(path), args.target, args.preset, fp16=args.fp16).to_json()
            for path in resolve_models(args.models)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="ONNX files or skeleton names")
    p.add_argument("--from-json", nargs="*", default=[], help="tvm-ext inspect --json outputs instead of building")
    p.add_argument("--preset", default="full")
    p.add_argument("--target", default="tvm_ext/h100")
    p.add_argument("--device", default="h100", help="device whose peak and bandwidth the shares are of")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--min-flops", type=float, default=1e8, help="flops per call that make a kernel GEMM-like")
    p.add_argument("--peak-share", type=float, default=0.25)
    p.add_argument("--memory-slack", type=float, default=1.25)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = p.parse_args(argv)
    if not args.models and not args.from_json:
        p.error("give models or --from-json files")
    device = load_device(args.device)
    rows = [r for report in _reports(args) for r in gemm_kernels(report, args.min_flops, device)]
    sep = " | " if args.markdown else "  "
    head = ["model", "kernel", "generator", "calls", "GFLOP", "modelled us", "% of peak", "% past launch",
            "memory-bound us", "passes"]
    if args.markdown:
        print("| " + sep.join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(sep.join(head))
    for r in rows:
        cells = [r.model, r.func[:48], r.generator, str(r.calls), f"{r.flops / 1e9:.3f}", f"{r.modelled_s * 1e6:.2f}",
                 f"{100 * r.peak_share(device):.1f}", f"{100 * r.peak_share(device, past_launch=True):.1f}",
                 f"{r.memory_bound_s(device) * 1e6:.2f}",
                 "yes" if r.passes(device, args.peak_share, args.memory_slack) else "NO"]
        print(("| " + sep.join(cells) + " |") if args.markdown else sep.join(cells))
    failing = sum(not r.passes(device, args.peak_share, args.memory_slack) for r in rows)
    print(f"{len(rows)} GEMM-like kernels, {failing} below the bar", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
