"""Template search: standalone profiler programs per candidate, compiled in parallel, run on a GPU.

A profiler program is a tiny ``main`` (this module) linked with the candidate's kernel object,
the same object the codegen uses, so a profiled instance costs no second compile when the model
is built; split-K candidates of one tile configuration share that object (split-K is set here). The program takes the problem on its command line (``gemm B M N K`` or ``conv2d N H W C
K R S P Q pad_h pad_w stride_h stride_w dil_h dil_w``), times 100 launches with CUDA events after
10 warm-up launches, and prints one JSON line ``{"latency_us": ...}``. A candidate that fails to
compile, to launch or to be implemented counts as +inf; the fastest goes into the shared
:class:`~tvm_ext.select.database.Database` (as seconds). :func:`tune` handles every workload kind,
back-to-back pairs included: measure a pair and its two parts, and the cost model compares them.
"""
from __future__ import annotations

import json
import logging
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Sequence

from tqdm import tqdm

from ..errors import KernelCompileError
from ..graph import element_bytes
from ..hardware import DeviceSpec
from ..select.database import Database, Record
from ..toolchain.cuda import gpu_available
from .candidates import candidates
from .instance import FUSED_KINDS, kernel_for
from .config import KernelConfig
from .emit_b2b import b2b_candidates
from .emit_gemm import ARGS_HEADER
from .errors import CutlassSetupError
from .nvcc import compile_object
from .records import cutlass_record
from .workload import Offload, Workload

_LOG = logging.getLogger(__name__)

PROFILER_MAIN = ARGS_HEADER + r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
extern "C" int ENTRY(const ARGS_T*, char*, int);

__global__ void tvm_ext_fill(unsigned short* p, size_t n, unsigned seed) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) { unsigned x = (unsigned(i) * 2654435761u) ^ seed; p[i] = (unsigned short)(0x3000 | (x & 0x07ff)); }
}
static void* alloc_fill(size_t elems, size_t bytes_per, unsigned seed) {
  void* p = nullptr;
  if (cudaMalloc(&p, elems * bytes_per + 16) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); exit(2); }
  size_t halves = elems * bytes_per / 2;
  tvm_ext_fill<<<unsigned((halves + 255) / 256), 256>>>((unsigned short*)p, halves, seed);
  return p;
}
int main(int argc, char** argv) {
  ARGS_T args{};
  char err[512] = {0};
  int64_t v[16] = {0};
  for (int i = 2; i < argc && i - 2 < 16; ++i) v[i - 2] = atoll(argv[i]);
  SETUP
  cudaStream_t stream; cudaStreamCreate(&stream); args.stream = stream;
  for (int i = 0; i < 10; ++i) if (ENTRY(&args, err, sizeof(err))) { fprintf(stderr, "%s\n", err); return 1; }
  cudaEvent_t start, stop; cudaEventCreate(&start); cudaEventCreate(&stop);
  const int iters = 100;
  cudaEventRecord(start, stream);
  for (int i = 0; i < iters; ++i) ENTRY(&args, err, sizeof(err));
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) { fprintf(stderr, "%s\n", cudaGetErrorString(e)); return 1; }
  float ms = 0; cudaEventElapsedTime(&ms, start, stop);
  printf("{\"latency_us\": %.4f}\n", ms * 1000.0f / iters);
  return 0;
}
"""

_GEMM_SETUP = r"""
  args.batch = v[0]; args.m = v[1]; args.n = v[2]; args.k = v[3];
  const size_t ib = IN_BYTES, ob = OUT_BYTES;
  args.a = alloc_fill(args.batch * args.m * args.k, ib, 1);
  args.b = alloc_fill(args.batch * args.k * args.n, ib, 2);
  args.d = alloc_fill(args.batch * args.m * args.n, ob, 3);
  args.lda = args.k; args.ldb = LDB; args.ldd = args.n;
  args.batch_stride_a = args.m * args.k; args.batch_stride_b = args.k * args.n; args.batch_stride_d = args.m * args.n;
  SOURCE
"""
_B2B_SETUP = r"""
  args.m = v[0]; args.n0 = v[1]; args.k0 = v[2]; args.n1 = v[3];
  args.a0 = alloc_fill(args.m * args.k0, 2, 1); args.b0 = alloc_fill(args.n0 * args.k0, 2, 2);
  args.bias0 = alloc_fill(args.n0, 2, 3); args.b1 = alloc_fill(args.n1 * args.n0, 2, 4);
  args.bias1 = alloc_fill(args.n1, 2, 5); args.d = alloc_fill(args.m * args.n1, 2, 6);
"""
_B2B_CONV_SETUP = r"""
  args.n = v[0]; args.h = v[1]; args.w = v[2]; args.c = v[3]; args.k0 = v[4]; args.r = v[5]; args.s = v[6];
  args.p = v[7]; args.q = v[8]; args.pad_h = v[9]; args.pad_w = v[10]; args.stride_h = v[11]; args.stride_w = v[12];
  args.k1 = v[13];
  args.x = alloc_fill(args.n * args.h * args.w * args.c, 2, 1);
  args.w0 = alloc_fill(args.k0 * args.r * args.s * args.c, 2, 2); args.bias0 = alloc_fill(args.k0, 2, 3);
  args.w1 = alloc_fill(args.k1 * args.k0, 2, 4); args.bias1 = alloc_fill(args.k1, 2, 5);
  args.y = alloc_fill(args.n * args.p * args.q * args.k1, 2, 6);
"""
_CONV_SETUP = r"""
  args.n = v[0]; args.h = v[1]; args.w = v[2]; args.c = v[3]; args.k = v[4]; args.r = v[5]; args.s = v[6];
  args.p = v[7]; args.q = v[8]; args.pad_h = v[9]; args.pad_w = v[10]; args.stride_h = v[11]; args.stride_w = v[12];
  args.dilation_h = v[13]; args.dilation_w = v[14];
  const size_t ib = IN_BYTES, ob = OUT_BYTES;
  args.x = alloc_fill(args.n * args.h * args.w * args.c, ib, 1);
  args.w_ptr = alloc_fill(args.k * args.r * args.s * args.c, ib, 2);
  args.y = alloc_fill(args.n * args.p * args.q * args.k, ob, 3);
  SOURCE
"""


def emit_profiler_main(wl: Workload, entry: str, split_k: int = 1) -> str:
    """The ``main`` translation unit of a profiler program for instance ``entry``."""
    ep = wl.epilogue
    if wl.kind == "b2b_gemm":
        return PROFILER_MAIN.replace("ENTRY", entry).replace("ARGS_T", "TvmExtB2bGemmArgs").replace("SETUP", _B2B_SETUP)
    if wl.kind == "b2b_conv2d":
        return (PROFILER_MAIN.replace("ENTRY", entry).replace("ARGS_T", "TvmExtB2bConv2dArgs")
                .replace("SETUP", _B2B_CONV_SETUP))
    if wl.kind == "conv2d":
        setup = _CONV_SETUP
        residual = "args.source = alloc_fill(args.n * args.p * args.q * args.k, ob, 4);"
        source = {"bias": "args.source = alloc_fill(args.k, ob, 4); args.source_is_vector = 1;",
                  "residual": residual,
                  "bias_residual": residual + " args.bias = alloc_fill(args.k, ob, 5);"}.get(ep.source, "")
        args_t = "TvmExtConv2dArgs"
    else:
        setup = _GEMM_SETUP.replace("LDB", "args.n" if wl.layout_b == "row" else "args.k")
        setup += f"  args.split_k = {int(split_k)};\n"
        residual = ("args.source = alloc_fill(args.batch * args.m * args.n, ob, 4); args.ldc = args.n;"
                    " args.batch_stride_c = args.m * args.n;")
        source = {"bias": "args.source = alloc_fill(args.n, ob, 4); args.ldc = 0; args.batch_stride_c = 0;",
                  "residual": residual,
                  "bias_residual": residual + " args.bias = alloc_fill(args.n, ob, 5);"}.get(ep.source, "")
        args_t = "TvmExtGemmArgs"
    setup = setup.replace("SOURCE", source).replace("IN_BYTES", str(element_bytes(wl.dtype)))
    setup = setup.replace("OUT_BYTES", str(element_bytes(wl.final_dtype)))
    return PROFILER_MAIN.replace("ENTRY", entry).replace("ARGS_T", args_t).replace("SETUP", setup)


#: kind -> the problem's numbers on a profiler program's command line (after the kind).
_ARGV = {
    "gemm": lambda wl: [wl.batch, wl.m, wl.n, wl.k],
    "conv2d": lambda wl: [wl.n, wl.h, wl.w, wl.c, wl.k, wl.r, wl.s, wl.p, wl.q, *wl.pad, *wl.stride, *wl.dilation],
    "b2b_gemm": lambda wl: [wl.m, wl.n0, wl.k0, wl.n1],
    "b2b_conv2d": lambda wl: [wl.n, wl.h, wl.w, wl.c, wl.k0, wl.r, wl.s, wl.p, wl.q, *wl.pad, *wl.stride, wl.k1],
}


def problem_argv(wl: Workload) -> list[str]:
    """Command-line problem description for a profiler program."""
    return [wl.kind, *map(str, _ARGV[wl.kind](wl))]


def _offload(wl) -> Offload:
    return Offload(symbol="profile", composite="", workload=wl, roles=(), param_shapes=(), out_shape=())


def build_profiler(wl: Workload, cfg: KernelConfig, arch: str) -> Path:
    """Compile (cached) the kernel object and link the profiler executable for one candidate."""
    kernel = kernel_for(_offload(wl), cfg, arch)
    obj = compile_object(kernel.source, arch)
    return compile_object(emit_profiler_main(wl, kernel.entry, cfg.split_k), arch, extra_flags=[str(obj)], link=True)


def run_program(program: Path, argv: Sequence[str], timeout: float = 60.0) -> float:
    """Run a profiler program; its latency in microseconds (+inf when it fails)."""
    try:
        proc = subprocess.run([str(program), *argv], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        _LOG.warning("profiler %s failed: %s", program.name, err)
        return math.inf
    if proc.returncode != 0:
        _LOG.info("candidate %s rejected: %s", program.name, proc.stderr.strip()[-300:])
        return math.inf
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["latency_us"])


def tune(wl: Workload, arch: str, device: DeviceSpec, database: Database, *,
         jobs: int | None = None, runner: Callable[[Path, Sequence[str]], float] = run_program,
         progress: bool = True) -> Record:
    """Profile every candidate of ``wl`` (a back-to-back pair: its b2b variants) and record the
    fastest in ``database``.

    Raises
    ------
    CutlassSetupError
        No GPU to run on (when the default runner is used), or no candidate ran.
    """
    if runner is run_program and not gpu_available():
        raise CutlassSetupError("template search needs an NVIDIA GPU to run the profiler programs")
    cands = b2b_candidates(wl) if wl.kind in FUSED_KINDS else candidates(wl, arch, device)
    programs: dict[int, Path] = {}
    with ThreadPoolExecutor(max_workers=jobs or 2) as pool:
        futures = {pool.submit(build_profiler, wl, cfg, arch): i for i, cfg in enumerate(cands)}
        for fut in tqdm(as_completed(futures), total=len(futures), desc=f"compile {wl.key()}", disable=not progress):
            try:
                programs[futures[fut]] = fut.result()
            except KernelCompileError as err:
                _LOG.info("candidate %s does not compile: %s", cands[futures[fut]].name(), str(err)[-300:])
    argv = problem_argv(wl)
    timings = [(runner(programs[i], argv), i) for i in tqdm(sorted(programs), desc="profile", disable=not progress)]
    finite = [(t, i) for t, i in timings if math.isfinite(t)]
    if not finite:
        raise CutlassSetupError(f"no candidate of {wl.key()} ran on {arch}")
    latency_us, best = min(finite)
    record = cutlass_record(wl, cands[best], device.name, latency_us * 1e-6)
    database.add(record)
    return record
