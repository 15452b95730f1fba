"""Run the ONNX backend node test cases through presets and summarize the outcome.

Every case (see :mod:`tvm_ext.testing.node_cases`) is imported once with our frontend,
built for ``llvm`` with each preset and run on each of its data sets; outputs are compared
with the stored expectations the way onnx's runner does (equal shapes and dtypes,
``|a - b| <= atol + rtol * |b|`` with the case's tolerances, 1e-3 / 1e-7 for node cases).

Statuses (one per case and preset):

==============  ===========================================================================
``pass``        every output of every data set within tolerance
``mismatch``    wrong values, shape, dtype or number of outputs
``import-fail`` :func:`tvm_ext.frontend.from_onnx` raised (unsupported op, importer error)
``build-fail``  the preset's pipeline or ``tvm.compile`` raised
``run-fail``    the VM raised while executing
``timeout``     the case took longer than ``timeout_per_case`` (worker killed)
``crash``       the worker process died (segfault, abort, or an exception type outside
                the lists below; the message is the worker's last stderr line)
``skipped``     out of scope: sequence/optional/map graph inputs or outputs, string tensors
==============  ===========================================================================
"""
from __future__ import annotations

import json
import logging
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tvm

from ..driver import get_preset
from ..errors import TVM_ERRORS, TvmExtError
from .compare import compare_outputs, mismatch_message
from .isolated_pool import IsolatedPool
from .node_cases import NodeCase, list_cases, load_case
from .onnx_backend import TvmExtBackendRep

logger = logging.getLogger(__name__)

STATUSES = ("pass", "mismatch", "import-fail", "build-fail", "run-fail", "timeout", "crash", "skipped")
FAILURES = ("mismatch", "import-fail", "build-fail", "run-fail", "timeout", "crash")
BASELINE = "baseline"

#: TVM's errors plus AssertionError: the ONNX converters and dlight's rules are Python code that
#: asserts what it expects of a node.
_TVM_PYTHON_ERRORS = TVM_ERRORS + (AssertionError,)
#: What the importer raises: our errors, TVM's, and the converters' Python errors.
IMPORT_ERRORS = (TvmExtError, NotImplementedError, ZeroDivisionError, OverflowError,
                 onnx.checker.ValidationError, onnx.shape_inference.InferenceError) + _TVM_PYTHON_ERRORS
#: What a preset's pipeline / ``tvm.compile`` raises.
BUILD_ERRORS = (TvmExtError, NotImplementedError) + _TVM_PYTHON_ERRORS
#: What running the VM raises (bad arguments are TvmExtError from run_cpu).
RUN_ERRORS = (TvmExtError, MemoryError) + _TVM_PYTHON_ERRORS


@dataclass
class CaseResult:
    """Outcome of one case under one preset."""

    case: str
    op_type: str
    preset: str
    status: str
    error_type: str = ""
    message: str = ""
    max_abs_err: float | None = None
    seconds: float = 0.0


def _first_line(err: BaseException, limit: int = 300) -> str:
    text = str(err).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line[:limit]


def _skip_reason(model: onnx.ModelProto, case: NodeCase) -> str | None:
    for vi in list(model.graph.input) + list(model.graph.output):
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"'{vi.name}' is a {kind.replace('_type', '')}, not a tensor"
        if vi.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            return f"'{vi.name}' is a string tensor"
    if not case.data_sets:
        return "no test data set"
    return None


def run_case(case_dir: str | Path, presets: Sequence[str]) -> list[CaseResult]:
    """Run one case directory through each preset (in this process).

    Graph inputs that feed operands the importer needs constant (a Reshape's shape, a
    Reduce's axes ...: :func:`~tvm_ext.frontend.bind.constant_operand_inputs`) are bound to
    the data set's values, as a user would with ``bind=``; data sets that bind different
    values are imported and built apart.
    """
    start = time.perf_counter()
    case = load_case(case_dir)

    def result(preset: str, status: str, err: BaseException | None = None, **kw: Any) -> CaseResult:
        return CaseResult(case.name, case.op_type, preset, status,
                          error_type=type(err).__name__ if err is not None else kw.pop("error_type", ""),
                          message=_first_line(err) if err is not None else kw.pop("message", ""),
                          seconds=time.perf_counter() - start, **kw)

    reason = _skip_reason(case.model, case)
    if reason is not None:
        return [result(p, "skipped", message=reason) for p in presets]
    outcomes: dict[str, list[CaseResult]] = {p: [] for p in presets}
    for bound, data_sets in _binding_groups(case):
        for preset, outcome in zip(presets, _run_group(case, bound, data_sets, presets, result)):
            outcomes[preset].append(outcome)
    return [_worst(outcomes[p]) for p in presets]


def _binding_groups(case: NodeCase) -> list[tuple[dict[str, Any], list[tuple[list[Any], list[Any]]]]]:
    """(values to bind, data sets with those values and the bound inputs removed), in data set order."""
    from ..frontend.bind import constant_operand_inputs

    names = [i.name for i in case.model.graph.input]
    bind = [names.index(n) for n in constant_operand_inputs(case.model.graph)]
    if not bind:
        return [({}, case.data_sets)]
    groups: dict[bytes, tuple[dict[str, Any], list]] = {}
    for inputs, expected in case.data_sets:
        values = {names[i]: np.asarray(inputs[i]) for i in bind}
        key = b"".join(v.tobytes() + str(v.shape).encode() for v in values.values())
        rest = [v for i, v in enumerate(inputs) if i not in bind]
        groups.setdefault(key, (values, []))[1].append((rest, expected))
    return list(groups.values())


def _run_group(case: NodeCase, bound: dict[str, Any], data_sets: list, presets: Sequence[str],
               result: Any) -> list[CaseResult]:
    from ..frontend import from_onnx
    from ..frontend.bind import bind_inputs

    try:
        model = bind_inputs(case.model, bound)
        mod = from_onnx(model)
    except IMPORT_ERRORS as err:
        return [result(p, "import-fail", err) for p in presets]
    return [_run_preset(case, model, mod, data_sets, preset, result) for preset in presets]


def _worst(outcomes: list[CaseResult]) -> CaseResult:
    """The first failing outcome (in data set order), else the passing one with the largest error."""
    failing = [r for r in outcomes if r.status != "pass"]
    if failing:
        return failing[0]
    return max(outcomes, key=lambda r: r.max_abs_err or 0.0)


def _run_preset(case: NodeCase, model: onnx.ModelProto, mod: tvm.IRModule, data_sets: list, preset: str,
                result: Any) -> CaseResult:
    try:
        rep = TvmExtBackendRep.build(mod, model, preset)
    except BUILD_ERRORS as err:
        return result(preset, "build-fail", err)
    worst = 0.0
    names = [o.name for o in case.model.graph.output]
    for inputs, expected in data_sets:
        try:
            outputs = list(rep.run(inputs))
        except RUN_ERRORS as err:
            return result(preset, "run-fail", err)
        errors = compare_outputs(outputs, expected, rtol=case.rtol, atol=case.atol, names=names,
                                 check_dtype=True)
        worst = max([worst] + [e.max_abs_err for e in errors])
        if not all(e.ok for e in errors):
            text = mismatch_message(errors, case.rtol, case.atol).replace("\n", ";")
            return result(preset, "mismatch", error_type="NumericsMismatch", message=text[:300],
                          max_abs_err=worst)
    return result(preset, "pass", max_abs_err=worst)


def _run_case_task(task: tuple[str, tuple[str, ...]]) -> list[CaseResult]:
    """Worker entry point (module level so that ``spawn`` can pickle it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the importer warns for every renamed input
        return run_case(task[0], task[1])


# --------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------
@dataclass
class NodeSuiteResult:
    """All case results of a suite run, with summaries."""

    data_dir: str
    presets: list[str]
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    def for_preset(self, preset: str) -> list[CaseResult]:
        """Results of one preset, sorted by case name."""
        return sorted((r for r in self.results if r.preset == preset), key=lambda r: r.case)

    def counts(self, preset: str = BASELINE) -> dict[str, int]:
        """Status -> number of cases (every status present, zeros included)."""
        c = Counter(r.status for r in self.for_preset(preset))
        return {s: c.get(s, 0) for s in STATUSES}

    def by_op(self, preset: str = BASELINE) -> dict[str, dict[str, int]]:
        """Op type -> status counts."""
        table: dict[str, Counter] = {}
        for r in self.for_preset(preset):
            table.setdefault(r.op_type, Counter())[r.status] += 1
        return {op: {s: c.get(s, 0) for s in STATUSES} for op, c in sorted(table.items())}

    def top_failing_ops(self, preset: str = BASELINE, top: int = 15) -> list[tuple[str, int, int]]:
        """(op, failing cases, cases) for the ops with the most failures (skips not counted)."""
        rows = [(op, sum(c[s] for s in FAILURES), sum(c.values())) for op, c in self.by_op(preset).items()]
        return sorted((r for r in rows if r[1]), key=lambda r: (-r[1], r[0]))[:top]

    def top_reasons(self, preset: str = BASELINE, top: int = 10) -> list[tuple[str, int]]:
        """Most frequent ``status: error type`` pairs among failures."""
        c = Counter(f"{r.status}: {r.error_type or '-'}" for r in self.for_preset(preset) if r.status in FAILURES)
        return c.most_common(top)

    def new_failures(self, preset: str, baseline: str = BASELINE) -> list[CaseResult]:
        """Cases that pass under ``baseline`` but not under ``preset``."""
        passed = {r.case for r in self.for_preset(baseline) if r.status == "pass"}
        return [r for r in self.for_preset(preset) if r.case in passed and r.status != "pass"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: summaries per preset and every case result."""
        summary = {}
        for p in self.presets:
            entry: dict[str, Any] = {"counts": self.counts(p), "total": len(self.for_preset(p)),
                                     "by_op": self.by_op(p), "top_failing_ops": self.top_failing_ops(p),
                                     "top_reasons": self.top_reasons(p)}
            if p != BASELINE and BASELINE in self.presets:
                entry["new_failures_vs_baseline"] = [r.case for r in self.new_failures(p)]
            summary[p] = entry
        return {"data_dir": self.data_dir, "presets": self.presets, "seconds": round(self.seconds, 1),
                "onnx_version": onnx.__version__, "tvm_version": tvm.__version__,
                "summary": summary, "results": [asdict(r) for r in self.results]}

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    def format_report(self, top: int = 15, all_ops: bool = False) -> str:
        """Readable tables: per preset, per op (ops with failures unless ``all_ops``), reasons."""
        short = {"import-fail": "import", "build-fail": "build", "run-fail": "run"}
        cols = [short.get(s, s) for s in STATUSES]
        lines = [f"{'preset':<14}{'total':>7}" + "".join(f"{c:>10}" for c in cols)]
        for p in self.presets:
            c = self.counts(p)
            lines.append(f"{p:<14}{sum(c.values()):>7}" + "".join(f"{c[s]:>10}" for s in STATUSES))
        for p in self.presets:
            lines += ["", f"[{p}] per op" + ("" if all_ops else " (ops with failures)"),
                      f"  {'op':<32}{'cases':>6}" + "".join(f"{c:>9}" for c in cols)]
            for op, c in self.by_op(p).items():
                if all_ops or any(c[s] for s in FAILURES):
                    lines.append(f"  {op[:32]:<32}{sum(c.values()):>6}" + "".join(f"{c[s]:>9}" for s in STATUSES))
            lines += ["", f"[{p}] top failing ops: "
                      + ", ".join(f"{op} {n}/{total}" for op, n, total in self.top_failing_ops(p, top))]
            lines += [f"[{p}] top reasons: " + ", ".join(f"{k} x{n}" for k, n in self.top_reasons(p))]
            if p != BASELINE and BASELINE in self.presets:
                new = self.new_failures(p)
                lines.append(f"[{p}] new failures vs {BASELINE}: {len(new)}")
                lines += [f"  {r.case}: {r.status} {r.error_type} {r.message[:120]}" for r in new]
        return "\n".join(lines)


def run_node_suite(data_dir: str | Path, presets: Sequence[str] = (BASELINE,),
                   pattern: str | Sequence[str] | None = None, jobs: int = 1,
                   timeout_per_case: float | None = 300.0, progress: bool = True) -> NodeSuiteResult:
    """Run every case under ``data_dir`` through each preset.

    Parameters
    ----------
    data_dir : str or Path
        Directory of case directories (:func:`tvm_ext.testing.node_cases.generate_node_tests`).
    presets : sequence of str
        Presets to run; ``baseline`` is added when another preset is given, so that
        :meth:`NodeSuiteResult.new_failures` has something to compare with.
    pattern : str or sequence of str, optional
        ``fnmatch`` patterns on case names.
    jobs : int
        Worker processes (each case runs isolated, with ``timeout_per_case``); ``0`` runs
        in this process without isolation or time limit.
    timeout_per_case : float, optional
        Seconds per case (all presets together) before its worker is killed.
    progress : bool
        Show a tqdm progress bar on stderr.

    Raises
    ------
    PresetError
        A preset is unknown or not implemented (checked before any case runs).
    TvmExtError
        No case matches.
    """
    presets = list(dict.fromkeys(presets))
    for p in presets:
        get_preset(p)
    if any(p != BASELINE for p in presets) and BASELINE not in presets:
        presets.insert(0, BASELINE)
    case_dirs = list_cases(data_dir, pattern)
    if not case_dirs:
        raise TvmExtError(f"no node test case under '{data_dir}'" + (f" matches {pattern!r}" if pattern else ""))
    from tqdm import tqdm

    start = time.perf_counter()
    suite = NodeSuiteResult(data_dir=str(data_dir), presets=presets)
    bar = tqdm(total=len(case_dirs), desc="node tests", unit="case", disable=not progress)
    tasks = [(str(d), tuple(presets)) for d in case_dirs]
    if jobs == 0:
        for task in tasks:
            suite.results.extend(_run_case_task(task))
            bar.update(1)
    else:
        with IsolatedPool(_run_case_task, jobs=jobs, timeout=timeout_per_case) as pool:
            for outcome in pool.map(tasks):
                if outcome.failure is None:
                    suite.results.extend(outcome.value)
                else:
                    case = load_case(outcome.task[0])
                    suite.results.extend(
                        CaseResult(case.name, case.op_type, p, outcome.failure, error_type=outcome.failure,
                                   message=outcome.message[:300], seconds=outcome.seconds)
                        for p in presets)
                bar.update(1)
    bar.close()
    suite.seconds = time.perf_counter() - start
    for p in presets:
        logger.info("node suite [%s]: %s in %.0f s", p, suite.counts(p), suite.seconds)
    return suite
