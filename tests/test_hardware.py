"""Tests of tvm_ext.hardware: device files, occupancy calculator, TVM target tags."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tvm_ext.errors import DeviceConfigError, TvmExtError, UnknownDeviceError
from tvm_ext.hardware import (
    CONFIG_DIR_ENV,
    PACKAGED_DEVICES_DIR,
    DeviceSpec,
    devices_dir,
    device_from_target,
    is_tvm_ext_target,
    list_devices,
    load_device,
    make_target,
    max_registers_for_blocks,
    occupancy,
    register_target_tags,
)
from tvm_ext.hardware.device_schema import FLOAT_FIELDS, INT_FIELDS, SOURCED_STR_FIELDS
from tvm_ext.toolchain import find_cuda_root

REPO = Path(__file__).resolve().parent.parent
REPO_DEVICES = REPO / "tvm_ext" / "hardware" / "devices"
EXPECTED_ARCH = {"h100": "sm_90", "h200": "sm_90", "a100": "sm_80", "v100": "sm_70", "t4": "sm_75", "rtx3090": "sm_86"}


@pytest.fixture(autouse=True)
def _default_config_dir(monkeypatch):
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)


# ---------------------------------------------------------------------------------------------
# device files
# ---------------------------------------------------------------------------------------------


def test_devices_default_to_the_packaged_ones():
    assert devices_dir() == PACKAGED_DEVICES_DIR == REPO_DEVICES
    assert set(EXPECTED_ARCH) <= set(list_devices())


def test_config_dir_without_devices_keeps_the_packaged_ones(tmp_path, monkeypatch):
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))  # e.g. only cutlass/database.jsonl in it
    assert devices_dir() == PACKAGED_DEVICES_DIR
    assert load_device("h100").name == "h100"


@pytest.mark.parametrize("name", sorted(EXPECTED_ARCH))
def test_every_device_loads_and_is_consistent(name):
    spec = load_device(name)
    assert isinstance(spec, DeviceSpec)
    assert spec.name == name and spec.arch == EXPECTED_ARCH[name]
    assert spec.compute_capability == (int(spec.arch[3:-1]), int(spec.arch[-1]))
    assert spec.max_warps_per_sm * spec.warp_size == spec.max_threads_per_sm
    assert spec.max_shared_memory_per_block == 48 * 1024
    assert spec.max_shared_memory_per_block_optin + spec.reserved_shared_memory_per_block == spec.shared_memory_per_sm
    assert spec.reserved_shared_memory_per_block == (1024 if spec.compute_capability >= (8, 0) else 0)
    assert [level.name for level in spec.memory_levels] == ["register", "shared", "l2", "dram"]
    bandwidths = [level.bandwidth_bytes_per_s for level in spec.memory_levels]
    assert bandwidths == sorted(bandwidths, reverse=True), "each level must be slower than the one above"
    # derived values follow the formulas their sources state
    assert spec.level("shared").bandwidth_bytes_per_s == pytest.approx(spec.sm_count * 128 * spec.clock_hz, rel=1e-9)
    assert spec.level("register").bandwidth_bytes_per_s == pytest.approx(spec.peak_flops["float32"] / 2 * 12, rel=1e-9)
    assert spec.level("dram").bandwidth_bytes_per_s == spec.dram_bandwidth_bytes_per_s
    assert spec.level("l2").transaction_bytes == 32 and spec.level("l2").line_bytes == 128
    assert spec.level("shared").per_sm and not spec.level("dram").per_sm
    assert spec.peak_flops_for("float16") > spec.peak_flops_for("float32")


def test_key_numbers():
    h100, h200, a100 = load_device("h100"), load_device("h200"), load_device("a100")
    assert (h100.sm_count, h100.shared_memory_per_sm, h100.max_shared_memory_per_block_optin) == (132, 233472, 232448)
    assert h100.l2_cache_bytes == 50 * 2**20 and h100.dram_bandwidth_bytes_per_s == 3.35e12
    assert h100.peak_flops_for("float16") == 989.4e12 and h100.peak_flops_for("int8") == 1978.9e12
    assert h100.ridge_point("float16") == pytest.approx(989.4e12 / 3.35e12)
    # H200 = H100 compute with more and faster HBM
    assert h200.peak_flops == h100.peak_flops and h200.sm_count == h100.sm_count
    assert h200.dram_bandwidth_bytes_per_s == 4.8e12 and h200.dram_bytes > h100.dram_bytes
    assert (a100.sm_count, a100.shared_memory_per_sm, a100.max_shared_memory_per_block_optin) == (108, 167936, 166912)
    assert a100.peak_flops_for("bf16") == 312e12 and a100.dram_bandwidth_bytes_per_s == 2.039e12
    assert load_device("rtx3090").max_threads_per_sm == 1536 and load_device("t4").max_blocks_per_sm == 16
    assert load_device("v100").shared_memory_allocation_unit == 256


@pytest.mark.parametrize("path", sorted(REPO_DEVICES.glob("*.yaml")), ids=lambda p: p.stem)
def test_sources_cover_every_numeric_field(path):
    raw = yaml.safe_load(path.read_text())
    sources = raw["sources"]
    numeric = [key for key, value in raw.items() if isinstance(value, (int, float)) and not isinstance(value, bool)]
    numeric += [f"peak_flops.{dtype}" for dtype in raw["peak_flops"]]
    for level in raw["memory_levels"]:
        numeric += [f"memory_levels.{level['name']}.{k}" for k, v in level.items() if isinstance(v, (int, float))]
    assert set(INT_FIELDS + FLOAT_FIELDS) <= set(numeric)
    for key in numeric + list(SOURCED_STR_FIELDS):
        assert isinstance(sources.get(key), str) and len(sources[key]) > 10, f"{path.name}: no source for {key}"
    spec = load_device(path)
    assert dict(spec.sources) == sources
    for level in ("register", "shared", "l2"):  # on-chip bandwidths are computed and must say how
        text = sources[f"memory_levels.{level}.bandwidth_bytes_per_s"]
        assert text.startswith(("derived", "estimate")), f"{path.name}: {level} bandwidth must say how it is derived"


def test_load_is_case_insensitive_cached_and_accepts_paths():
    spec = load_device("H100")
    assert load_device("h100") is spec
    assert load_device(REPO_DEVICES / "h100.yaml") is spec
    assert load_device(str(REPO_DEVICES / "h100.yaml")) is spec
    assert load_device(spec) is spec
    assert hash(spec) == hash(load_device("h100"))


def test_peak_flops_and_level_errors():
    v100 = load_device("v100")
    assert v100.peak_flops_for("fp16") == v100.peak_flops_for("float16") == 125e12
    with pytest.raises(DeviceConfigError, match=r"no peak_flops entry for dtype 'int8' \(known: float16, float32"):
        v100.peak_flops_for("int8")
    with pytest.raises(DeviceConfigError, match="no memory level 'l3'.*register, shared, l2, dram"):
        v100.level("l3")


def test_unknown_device_lists_known_names():
    with pytest.raises(UnknownDeviceError) as info:
        load_device("b200")
    message = str(info.value)
    assert "b200" in message
    for name in EXPECTED_ARCH:
        assert name in message
    assert isinstance(info.value, TvmExtError)


# ---------------------------------------------------------------------------------------------
# malformed device files (through TVM_EXT_CONFIG_DIR)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def tmp_config(tmp_path, monkeypatch):
    (tmp_path / "devices").mkdir()
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    return tmp_path / "devices"


def _write_variant(devices: Path, name: str, edit) -> Path:
    raw = yaml.safe_load((REPO_DEVICES / "a100.yaml").read_text())
    raw["name"] = name
    edit(raw)
    path = devices / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_config_dir_env_var(tmp_config):
    _write_variant(tmp_config, "mygpu", lambda raw: None)
    assert list_devices() == ["mygpu"]
    assert load_device("MyGPU").sm_count == 108
    with pytest.raises(UnknownDeviceError, match=r"known devices in .*: mygpu"):
        load_device("a100")


def _drop(key):
    return lambda raw: raw.pop(key)


def _set(key, value):
    return lambda raw: raw.__setitem__(key, value)


def _set_level(level, key, value):
    def edit(raw):
        next(entry for entry in raw["memory_levels"] if entry["name"] == level)[key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (_drop("sm_count"), r"field 'sm_count': missing"),
        (_set("sm_count", "many"), r"field 'sm_count': expected an integer, got str 'many'"),
        (
            _set("dram_bandwidth_bytes_per_s", "2.039e12"),
            r"'dram_bandwidth_bytes_per_s': expected a number, got str '2.039e12' .*write e.g. 3.35e\+12",
        ),
        (_set("clock_hz", -1.0), r"field 'clock_hz': must be positive"),
        (_set("bogus_field", 3), r"unknown field\(s\) bogus_field"),
        (_set("arch", "sm_86"), r"field 'arch': 'sm_86' does not match compute_capability 8.0"),
        (_set("max_warps_per_sm", 48), r"max_warps_per_sm \* warp_size must equal max_threads_per_sm"),
        (_set("peak_flops", {"float32": 19.5e12}), r"missing required dtype\(s\) float16"),
        (lambda raw: raw["sources"].pop("l2_cache_bytes"), r"no source cited for l2_cache_bytes"),
        (lambda raw: raw["sources"].__setitem__("peak_flops.int4", "x" * 20), r"unknown field\(s\) peak_flops.int4"),
        (_set_level("shared", "capacity_bytes", 1024), r"memory_levels.shared.capacity_bytes.*shared_memory_per_sm"),
        (_set_level("l2", "scope", "shared"), r"memory_levels.l2.scope': expected 'global'"),
        (_set_level("dram", "latency_ns", 400), r"memory_levels\[3\]': unknown key\(s\) latency_ns"),
        (lambda raw: raw["memory_levels"].pop(), r"levels must be \['register', 'shared', 'l2', 'dram'\]"),
    ],
)
def test_malformed_device_file_names_file_and_field(tmp_config, edit, pattern):
    path = _write_variant(tmp_config, "broken", edit)
    with pytest.raises(DeviceConfigError, match=pattern) as info:
        load_device("broken")
    assert str(path) in str(info.value)


def test_name_must_match_file_stem_and_yaml_must_parse(tmp_config):
    path = _write_variant(tmp_config, "gpu1", _set("name", "gpu2"))
    with pytest.raises(DeviceConfigError, match="must equal the file stem 'gpu1'"):
        load_device(path)
    (tmp_config / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(DeviceConfigError, match="bad.yaml: not valid YAML"):
        load_device("bad")


def test_edited_file_is_reloaded(tmp_config):
    path = _write_variant(tmp_config, "mygpu", lambda raw: None)
    assert load_device("mygpu").sm_count == 108
    raw = yaml.safe_load(path.read_text())
    raw["sm_count"] = 54
    path.write_text(yaml.safe_dump(raw, sort_keys=False) + "\n# edited\n")
    assert load_device("mygpu").sm_count == 54


# ---------------------------------------------------------------------------------------------
# occupancy
# ---------------------------------------------------------------------------------------------

# Expected values were produced by cudaOccMaxActiveBlocksPerMultiprocessor from the CUDA 13.0
# toolkit's cuda_occupancy.h with each device's properties (see test_matches_cuda_occupancy_header).
OCCUPANCY_CASES = [
    # device, threads, regs, smem, blocks/SM, limiter, allocated smem per block
    ("a100", 256, 32, 0, 8, "warps", 1024),  # 2048 threads/SM; registers tie at 8 too
    ("a100", 256, 64, 0, 4, "registers", 1024),
    ("a100", 128, 32, 48 * 1024, 3, "shared_memory", 50176),  # 164 KiB / (48 KiB + 1 KiB reserve)
    ("h100", 128, 32, 48 * 1024, 4, "shared_memory", 50176),  # 228 KiB / 49 KiB
    ("v100", 128, 32, 48 * 1024, 2, "shared_memory", 49152),  # no reserve before CC 8.0
    ("rtx3090", 1024, 32, 0, 1, "warps", 1024),  # 1536 threads/SM
    ("t4", 1024, 32, 0, 1, "warps", 0),
    ("a100", 32, 16, 0, 32, "blocks", 1024),
    ("a100", 256, 255, 0, 1, "registers", 1024),  # 255*32 -> 8192 registers per warp
    ("a100", 256, 40, 0, 6, "registers", 1024),
    ("a100", 256, 33, 0, 6, "registers", 1024),  # 1056 rounds up to 1280 like 40
    ("a100", 96, 168, 0, 4, "registers", 1024),
    ("a100", 96, 170, 0, 2, "registers", 1024),  # 3 warps/partition -> 2 warps/partition
    ("a100", 128, 32, 166912, 1, "shared_memory", 167936),  # the opt-in maximum
    ("h100", 128, 32, 232448, 1, "shared_memory", 233472),
    ("v100", 256, 32, 65536, 1, "shared_memory", 65536),
    ("t4", 128, 32, 32768, 2, "shared_memory", 32768),
    ("rtx3090", 256, 48, 20000, 4, "shared_memory", 21120),
    ("h100", 384, 80, 70000, 2, "registers", 71040),
    ("a100", 1, 0, 1, 32, "blocks", 1152),
    ("a100", 992, 64, 0, 1, "registers", 1024),
]


@pytest.mark.parametrize(("device", "threads", "regs", "smem", "blocks", "limiter", "smem_alloc"), OCCUPANCY_CASES)
def test_occupancy_known_values(device, threads, regs, smem, blocks, limiter, smem_alloc):
    spec = load_device(device)
    occ = occupancy(spec, threads, regs, smem)
    assert occ.blocks_per_sm == blocks
    assert occ.limiter == limiter
    assert occ.shared_bytes_allocated_per_block == smem_alloc
    warps = -(-threads // 32) * blocks
    assert occ.warps_per_sm == warps
    assert occ.occupancy == pytest.approx(warps / spec.max_warps_per_sm)
    assert occ.blocks_per_wave == blocks * spec.sm_count


def test_occupancy_details():
    a100 = load_device("a100")
    occ = occupancy(a100, 256, 32)
    assert occ.limiters == ("warps", "registers") and occ.occupancy == 1.0
    assert dict(occ.block_limits) == {"warps": 8, "blocks": 32, "registers": 8, "shared_memory": 164}
    assert occ.registers_per_block == 8192 and occ.blocks_per_wave == 864
    assert occ.waves(864) == 1 and occ.waves(865) == 2 and occ.waves(0) == 0
    assert occupancy(a100, 64, 0).limiters == ("warps", "blocks")
    assert occupancy(load_device("rtx3090"), 1024).occupancy == pytest.approx(32 / 48)
    assert not occupancy(a100, 128, 32, 48 * 1024).needs_optin
    assert occupancy(a100, 128, 32, 60000).needs_optin
    assert occupancy(a100, 128, 32, 60000).blocks_per_sm == 2


@pytest.mark.parametrize(
    ("device", "threads", "regs", "smem", "pattern"),
    [
        ("a100", 1025, 32, 0, "1025 threads per block exceeds the 1024"),
        ("a100", 0, 32, 0, "threads_per_block must be >= 1"),
        ("a100", 128, 256, 0, "256 registers per thread exceeds the 255"),
        ("a100", 128, -1, 0, "registers_per_thread must be >= 0"),
        ("a100", 1024, 128, 0, "needs 131072 registers per block"),
        ("a100", 1000, 65, 0, "needs 73728 registers per block"),
        # 25 warps x 2560 = 64000 fits, but the hardware check rounds to 28 warps = 71680
        ("a100", 800, 80, 0, "needs 71680 registers per block"),
        ("a100", 128, 32, 200 * 1024, "exceeds the opt-in maximum of 166912 bytes"),
        ("t4", 128, 32, 65537, "exceeds the opt-in maximum of 65536 bytes"),
        ("a100", 128.0, 32, 0, "threads_per_block must be an int"),
    ],
)
def test_occupancy_rejects_invalid_launches(device, threads, regs, smem, pattern):
    with pytest.raises(ValueError, match=pattern):
        occupancy(load_device(device), threads, regs, smem)


def test_max_registers_for_blocks():
    a100 = load_device("a100")
    assert max_registers_for_blocks(a100, 256, 2) == 128
    assert max_registers_for_blocks(a100, 256, 4) == 64
    assert max_registers_for_blocks(a100, 256, 8) == 32
    assert max_registers_for_blocks(a100, 256, 1) == 255
    assert max_registers_for_blocks(a100, 1024, 2) == 32
    with pytest.raises(ValueError, match="cannot reside"):
        max_registers_for_blocks(a100, 1024, 3)


def _find_occupancy_header() -> Path | None:
    root = find_cuda_root()
    header = None if root is None else root / "include" / "cuda_occupancy.h"
    return header if header is not None and header.is_file() else None


_HARNESS = r"""
#include <cstdio>
#include "cuda_occupancy.h"
int main() {
  int major, minor, tps, rps, rpb, warp, nsm, threads, regs; long smem_sm, smem_block, optin, reserved, smem;
  while (scanf("%d %d %d %d %d %d %d %ld %ld %ld %ld %d %d %ld", &major, &minor, &tps, &rps, &rpb, &warp, &nsm,
               &smem_sm, &smem_block, &optin, &reserved, &threads, &regs, &smem) == 14) {
    cudaOccDeviceProp p;
    p.computeMajor = major; p.computeMinor = minor; p.maxThreadsPerBlock = 1024;
    p.maxThreadsPerMultiprocessor = tps; p.regsPerMultiprocessor = rps; p.regsPerBlock = rpb; p.warpSize = warp;
    p.numSms = nsm; p.sharedMemPerMultiprocessor = smem_sm; p.sharedMemPerBlock = smem_block;
    p.sharedMemPerBlockOptin = optin; p.reservedSharedMemPerBlock = reserved;
    cudaOccFuncAttributes a;
    a.maxThreadsPerBlock = 1024; a.numRegs = regs; a.sharedSizeBytes = 0; a.partitionedGCConfig = PARTITIONED_GC_OFF;
    a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; a.maxDynamicSharedSizeBytes = optin; a.numBlockBarriers = 1;
    a.virtualResourceCount = 0;
    cudaOccDeviceState s; cudaOccResult r;
    int err = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, threads, smem);
    printf("%d %d\n", err, r.activeBlocksPerMultiprocessor);
  }
  return 0;
}
"""


def test_matches_cuda_occupancy_header(tmp_path):
    """Differential test against NVIDIA's own occupancy calculator over a grid of launches."""
    header, compiler = _find_occupancy_header(), shutil.which("g++")
    if header is None or compiler is None:
        pytest.skip("needs cuda_occupancy.h (CUDA toolkit) and g++")
    (tmp_path / "occ.cpp").write_text(_HARNESS)
    exe = tmp_path / "occ"
    subprocess.run([compiler, "-O1", f"-I{header.parent}", str(tmp_path / "occ.cpp"), "-o", str(exe)], check=True)
    cases, lines = [], []
    for name in sorted(EXPECTED_ARCH):
        spec = load_device(name)
        for threads in (1, 32, 96, 128, 160, 256, 384, 512, 640, 800, 1000, 1024):
            for regs in (0, 16, 32, 33, 40, 64, 72, 80, 96, 128, 168, 200, 255):
                for smem in (0, 1, 4096, 20000, 49152, 60000, 100000, 101376, 166912, 232448):
                    cases.append((spec, threads, regs, smem))
                    lines.append(
                        f"{spec.compute_capability[0]} {spec.compute_capability[1]} {spec.max_threads_per_sm} "
                        f"{spec.registers_per_sm} {spec.max_registers_per_block} {spec.warp_size} {spec.sm_count} "
                        f"{spec.shared_memory_per_sm} {spec.max_shared_memory_per_block} "
                        f"{spec.max_shared_memory_per_block_optin} {spec.reserved_shared_memory_per_block} "
                        f"{threads} {regs} {smem}"
                    )
    result = subprocess.run([str(exe)], input="\n".join(lines), capture_output=True, text=True, check=True)
    outputs = result.stdout.split("\n")
    assert len(outputs) >= len(cases)
    checked_valid = 0
    for (spec, threads, regs, smem), out in zip(cases, outputs):
        err, blocks = map(int, out.split())
        assert err == 0
        try:
            ours = occupancy(spec, threads, regs, smem).blocks_per_sm
        except ValueError:
            ours = 0
        assert ours == blocks, f"{spec.name}: {threads} threads, {regs} regs, {smem} B smem"
        checked_valid += blocks > 0
    assert checked_valid > 1000


# ---------------------------------------------------------------------------------------------
# TVM targets
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered_tags():
    return register_target_tags()


def test_register_target_tags_is_idempotent(registered_tags):
    import tvm

    assert registered_tags == [f"tvm_ext/{name}" for name in list_devices()]
    assert register_target_tags() == registered_tags  # a second registration does not fail
    assert set(registered_tags) <= set(tvm.target.tag.list_tags())


def test_tag_round_trip(registered_tags):
    from tvm.target import Target

    target = Target("tvm_ext/h100")
    assert target.tag == "" and str(target.attrs["model"]) == "h100"
    assert list(target.keys) == ["cuda", "gpu", "tvm_ext"]
    spec = device_from_target(target)
    assert spec.name == "h100"
    attrs = target.attrs
    assert int(attrs["max_shared_memory_per_block"]) == spec.max_shared_memory_per_block == 49152
    assert int(attrs["l2_cache_size_bytes"]) == spec.l2_cache_bytes
    assert int(attrs["registers_per_block"]) == 65536 and int(attrs["thread_warp_size"]) == 32
    assert str(attrs["arch"]) == "sm_90"
    for name in list_devices():
        assert device_from_target(Target(f"tvm_ext/{name}")).name == name
        assert device_from_target(f"tvm_ext/{name}").name == name


def test_device_from_plain_targets():
    from tvm.target import Target

    assert device_from_target({"kind": "cuda", "arch": "sm_80"}).name == "a100"
    assert device_from_target(Target({"kind": "cuda", "arch": "sm_86"})).name == "rtx3090"
    assert device_from_target(Target("nvidia/nvidia-t4")).name == "t4"
    assert device_from_target("V100").name == "v100"
    # sm_90a: h100 and h200 share the arch and every planning number, so the first is planned for
    assert device_from_target(Target("nvidia/nvidia-h100")).name == "h100"
    with pytest.raises(UnknownDeviceError, match="no device has arch sm_89"):
        device_from_target({"kind": "cuda", "arch": "sm_89"})
    with pytest.raises(UnknownDeviceError, match="kind 'llvm', not a CUDA target"):
        device_from_target("llvm")
    with pytest.raises(UnknownDeviceError, match="model 'gb200' is not a known device"):
        device_from_target({"kind": "cuda", "arch": "sm_90", "keys": ["cuda", "gpu", "tvm_ext"], "model": "gb200"})
    with pytest.raises(UnknownDeviceError, match="unknown device 'gb200'"):
        device_from_target("tvm_ext/gb200")
    with pytest.raises(UnknownDeviceError, match="cannot interpret"):
        device_from_target("not a target")


def test_is_tvm_ext_target_and_make_target():
    from tvm.target import Target

    assert is_tvm_ext_target("tvm_ext/a100") and is_tvm_ext_target(make_target("t4"))
    assert not is_tvm_ext_target(Target("nvidia/nvidia-a100"))
    assert not is_tvm_ext_target("llvm") and not is_tvm_ext_target("tvm_ext/unknown")
    hopper = make_target("h100", arch="sm_90a")
    assert str(hopper.attrs["arch"]) == "sm_90a" and device_from_target(hopper).name == "h100"
    assert str(make_target("a100", arch="sm_75").attrs["arch"]) == "sm_75"  # older arch runs on newer GPU
    with pytest.raises(ValueError, match="newer than a100"):
        make_target("a100", arch="sm_90")
    with pytest.raises(ValueError, match="only runs on compute capability 8.0, not on h200"):
        make_target("h200", arch="sm_80a")
    with pytest.raises(ValueError, match="arch must look like"):
        make_target("a100", arch="compute_80")
    with pytest.raises(UnknownDeviceError):
        make_target("mi300")


def test_tag_compiles_a_relax_module(registered_tags):
    """tvm.compile picks the GPU pipeline for our tags and emits CUDA source."""
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((64, 64), "float32"), y: R.Tensor((64, 64), "float32")):
            with R.dataflow():
                z = R.nn.relu(R.add(x, y))
                R.output(z)
            return z

    executable = tvm.compile(Module, target=tvm.target.Target("tvm_ext/a100"))
    source = executable.mod.imports[0].imports[0].inspect_source()
    assert "__global__" in source and "threadIdx.x" in source


def test_shared_arch_with_different_planning_numbers_is_ambiguous(tmp_path, monkeypatch):
    """Two devices of one arch that plan differently cannot be told apart by the arch alone."""
    import yaml

    from tvm_ext.hardware import devices_dir

    (tmp_path / "devices").mkdir()
    for name in ("h100", "h200"):
        data = yaml.safe_load((devices_dir() / f"{name}.yaml").read_text())
        if name == "h200":
            data["sm_count"] = 144
        (tmp_path / "devices" / f"{name}.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    with pytest.raises(UnknownDeviceError, match="ambiguous between devices h100, h200"):
        device_from_target({"kind": "cuda", "arch": "sm_90"})
    assert device_from_target({"kind": "cuda", "arch": "sm_90", "model": "h200"}).sm_count == 144
