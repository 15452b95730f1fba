"""Build the models of a bundle: prepare, reference, compile every system, export.

Runs in-process (CPU targets) or as ``python -m tvm_ext.bench.worker JOB.json`` in a worker
process (CUDA targets: a build that crashes TVM ends the worker, not the command; the export
compiles the device code, see :mod:`tvm_ext.toolchain.export`). Each finished model is appended to the job's entries
file as one JSON line (a :class:`~tvm_ext.bench.manifest.ModelEntry`), and a one-line
progress message goes to stdout, so the parent can report as the build goes.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import TVM_ERRORS, TvmExtError
from .compile import build_system
from .manifest import ModelEntry
from .suite import ModelSource

log = logging.getLogger(__name__)


@dataclass
class BuildJob:
    """Everything a worker needs (JSON-serialisable)."""

    bundle: str
    target: str
    presets: list[str]
    entries_file: str
    fp16: bool = False
    cuda_graph: bool = False
    seed: int = 0
    models: list[dict] = field(default_factory=list)

    def sources(self) -> list[ModelSource]:
        """The models as :class:`ModelSource` objects."""
        return [ModelSource(m["name"], Path(m["path"]) if m.get("path") else None, m.get("builder"))
                for m in self.models]

    @classmethod
    def for_sources(cls, sources: list[ModelSource], **kwargs) -> "BuildJob":
        """A job over ``sources``."""
        models = [{"name": s.name, "path": str(s.path) if s.path else None, "builder": s.builder} for s in sources]
        return cls(models=models, **kwargs)

    def write(self, path: Path) -> Path:
        """Write the job as JSON."""
        path.write_text(json.dumps(asdict(self), indent=1))
        return path


def _failed(source: ModelSource, dtype: str, err: BaseException) -> ModelEntry:
    return ModelEntry(name=source.name, source=str(source.path or source.builder), dtype=dtype, status="failed",
                      error=f"{type(err).__name__}: {' '.join(str(err).split())[:1000]}")


def build_model(source: ModelSource, job: BuildJob, target) -> ModelEntry:
    """Prepare, reference and compile one model; failures end up in the entry."""
    from .prepare import prepare  # noqa: PLC0415
    from .reference import SOURCE, compute_reference  # noqa: PLC0415

    dtype = "float16" if job.fp16 else "float32"
    bundle = Path(job.bundle)
    try:
        prepared = prepare(source, fp16=job.fp16)
    except TVM_ERRORS + (AssertionError, TvmExtError) as err:  # AssertionError: the ONNX converters assert
        log.warning("%s: cannot prepare: %s", source.name, err)
        return _failed(source, dtype, err)
    entry = ModelEntry(name=source.name, source=str(source.path or source.builder), dtype=dtype,
                       corpus=prepared.corpus, inputs=prepared.inputs, outputs=prepared.outputs,
                       weights=prepared.weights, weights_seed=job.seed, input_seed=job.seed,
                       transform_params=prepared.transform_params)
    try:
        ref = compute_reference(prepared, bundle / "ref" / f"{source.name}.npz", weights_seed=job.seed,
                                input_seed=job.seed)
        entry.reference = f"ref/{source.name}.npz"
        entry.reference_source = SOURCE
        entry.check_sets, entry.check_digests = ref.check_sets, ref.check_digests
        entry.weights_digest, entry.ref_nonfinite = ref.weights_digest, ref.ref_nonfinite
    except TvmExtError as err:
        log.warning("%s: no reference outputs: %s", source.name, err)
        entry.error = f"no reference: {err}"
        from .inputs import CHECK_SETS  # noqa: PLC0415

        entry.check_sets = list(CHECK_SETS)
    for preset in job.presets:
        for graph in ([False, True] if job.cuda_graph else [False]):
            build, cost = build_system(prepared, preset, target, bundle, cuda_graph=graph)
            entry.builds.append(build)
            if cost is not None and entry.flops is None:
                entry.flops, entry.min_traffic_bytes, entry.compute_dtype = (
                    cost.flops, cost.min_traffic_bytes, cost.compute_dtype)
    if not any(b.status == "ok" for b in entry.builds):
        entry.status = "failed"
        entry.error = entry.error or "every build failed"
    return entry


#: Prefixes of the progress lines before and after each model (a progress bar reads them).
BUILDING, BUILT = "building ", "built "


def run_jobs(job: BuildJob, progress: Callable[[str], None] | None = None) -> list[ModelEntry]:
    """Build every model of ``job``, appending each entry to ``job.entries_file``; ``progress``
    gets a :data:`BUILDING` line before each model and a :data:`BUILT` summary line after it."""
    from ..hardware import resolve_target  # noqa: PLC0415

    target = resolve_target(job.target)
    entries = []
    out = Path(job.entries_file)
    for source in job.sources():
        start = time.perf_counter()
        if progress is not None:
            progress(f"{BUILDING}{source.name}")
        entry = build_model(source, job, target)
        with out.open("a") as f:
            f.write(json.dumps(entry.to_json()) + "\n")
        entries.append(entry)
        if progress is not None:
            kernels = ", ".join(f"{b.system}: {b.kernels if b.status == 'ok' else 'failed'}" for b in entry.builds)
            progress(f"{BUILT}{entry.name}: {entry.status} in {time.perf_counter() - start:.1f} s; "
                     f"kernels {kernels or '-'}")
    return entries


def main(argv: list[str] | None = None) -> int:
    """``python -m tvm_ext.bench.worker JOB.json``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m tvm_ext.bench.worker JOB.json\n")
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    job = BuildJob(**json.loads(Path(argv[0]).read_text()))

    def report(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    run_jobs(job, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
