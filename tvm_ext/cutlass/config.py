"""A CUTLASS kernel configuration: the template parameters that template search tunes."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

API_2X = "2x"   # CUTLASS 2.x device API (Sm80 tensor-op multistage), runs on sm_80 and newer
API_3X = "3x"   # CUTLASS 3.x Sm90 collective builder (TMA + warp-group MMA), needs sm_90a

KERNEL_SCHEDULES_3X = ("cooperative", "pingpong")
#: 3.x tile schedulers: CUTLASS's default, or stream-K.
TILE_SCHEDULERS_3X = ("", "stream_k")


@dataclass(frozen=True)
class KernelConfig:
    """Template parameters of one GEMM or implicit-GEMM convolution instance.

    Parameters
    ----------
    api : str
        ``"2x"`` or ``"3x"``.
    threadblock : tuple of int
        Threadblock (CTA) tile ``(M, N, K)``.
    warp_count : tuple of int
        Warps along ``(M, N, K)`` (2.x); for 3.x the warp-group layout implied by the schedule.
    instruction : tuple of int
        MMA instruction shape (``(16, 8, 16)`` for Sm80 fp16/bf16, ``(16, 8, 8)`` TF32; ``(64, N, 16)`` /
        ``(64, N, 8)`` wgmma on Sm90).
    stages : int
        Software pipeline stages (0 = let the 3.x builder pick the most that fit).
    swizzle : int
        Threadblock rasterization swizzle ``GemmIdentityThreadblockSwizzle<swizzle>`` (2.x).
    split_k : int
        Serial split-K slices (2.x GEMM only; 1 = none).
    alignment : tuple of int
        Vector alignment in elements of A, B and C/D.
    cluster : tuple of int
        Thread-block cluster shape (3.x).
    schedule : str
        3.x kernel schedule: ``"cooperative"`` or ``"pingpong"``; empty for 2.x.
    tile_scheduler : str
        3.x tile scheduler: empty for CUTLASS's default (one CTA per output tile), ``"stream_k"``
        for its stream-K scheduler (cooperative only): the K iterations of all output tiles are
        shared out over as many CTAs as fill the SMs, so a GEMM of fewer tiles than SMs (small M at
        batch 1) still fills them; partial tiles are reduced through a workspace.
    threadblock1, warp_count1 : tuple of int, optional
        Second GEMM of a back-to-back (b2b) kernel; ``threadblock`` / ``warp_count`` are the first.
    residency : str
        b2b only: ``"rf"`` (GEMM0's accumulators stay in registers) or ``"smem"`` (staged in
        shared memory); empty otherwise.
    """

    api: str
    threadblock: tuple[int, int, int]
    warp_count: tuple[int, int, int]
    instruction: tuple[int, int, int]
    stages: int
    swizzle: int = 8
    split_k: int = 1
    alignment: tuple[int, int, int] = (8, 8, 8)
    cluster: tuple[int, int, int] = (1, 1, 1)
    schedule: str = ""
    tile_scheduler: str = ""
    threadblock1: tuple[int, int, int] | None = None
    warp_count1: tuple[int, int, int] | None = None
    residency: str = ""

    def __post_init__(self) -> None:
        if self.api not in (API_2X, API_3X):
            raise ValueError(f"api must be '2x' or '3x', got {self.api!r}")
        if self.api == API_3X and self.schedule not in KERNEL_SCHEDULES_3X:
            raise ValueError(f"3.x schedule must be one of {KERNEL_SCHEDULES_3X}, got {self.schedule!r}")
        if self.tile_scheduler not in TILE_SCHEDULERS_3X:
            raise ValueError(f"tile_scheduler must be one of {TILE_SCHEDULERS_3X}, got {self.tile_scheduler!r}")
        if self.tile_scheduler and (self.api != API_3X or self.schedule != "cooperative"):
            raise ValueError("the stream-K tile scheduler needs a 3.x cooperative kernel")
        for name in ("threadblock", "warp_count", "instruction", "alignment", "cluster"):
            value = getattr(self, name)
            if len(value) != 3 or any(int(v) <= 0 for v in value):
                raise ValueError(f"{name} must be three positive ints, got {value!r}")
            object.__setattr__(self, name, tuple(int(v) for v in value))
        if self.residency not in ("", "rf", "smem"):
            raise ValueError(f"residency must be 'rf' or 'smem', got {self.residency!r}")
        if (self.threadblock1 is None) != (self.residency == ""):
            raise ValueError("a b2b config needs threadblock1, warp_count1 and a residency")
        for name in ("threadblock1", "warp_count1"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))

    @property
    def warp_shape(self) -> tuple[int, int, int]:
        """Per-warp tile (threadblock / warp_count)."""
        return tuple(t // w for t, w in zip(self.threadblock, self.warp_count))  # type: ignore[return-value]

    @property
    def threads(self) -> int:
        """Threads per threadblock (2.x)."""
        return 32 * self.warp_count[0] * self.warp_count[1] * self.warp_count[2]

    def name(self) -> str:
        """Short unique name, e.g. ``2x_128x128x32_w2x2x1_i16x8x16_s3_sw8_k1_a8x8x8``."""
        fmt = "x".join
        text = (f"{self.api}_{fmt(map(str, self.threadblock))}_w{fmt(map(str, self.warp_count))}"
                f"_i{fmt(map(str, self.instruction))}_s{self.stages}_sw{self.swizzle}_k{self.split_k}"
                f"_a{fmt(map(str, self.alignment))}")
        if self.api == API_3X:
            text += f"_c{fmt(map(str, self.cluster))}_{self.schedule}"
            text += "_streamk" if self.tile_scheduler == "stream_k" else ""
        if self.residency:
            text += (f"_b2b{self.residency}_{fmt(map(str, self.threadblock1))}"
                     f"_w{fmt(map(str, self.warp_count1 or ()))}")
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (inverse of :meth:`from_dict`)."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelConfig":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("threadblock", "warp_count", "instruction", "alignment", "cluster", "threadblock1", "warp_count1"):
            if known.get(key) is not None:
                known[key] = tuple(known[key])
        return cls(**known)

    def with_alignment(self, alignment: tuple[int, int, int]) -> "KernelConfig":
        """Same parameters with another alignment."""
        data = self.to_dict()
        data["alignment"] = alignment
        return KernelConfig.from_dict(data)
