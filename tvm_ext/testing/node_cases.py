"""ONNX backend *node* test cases: regenerate them offline and load them from disk.

The ``onnx`` wheel does not ship ``onnx/backend/test/data/node``; it ships the Python case
definitions (``onnx.backend.test.case.node``), whose ``export*`` methods compute the
expected outputs with NumPy and register one :class:`onnx.backend.test.case.test_case.TestCase`
per case (plus the ``*_expanded`` variants: the op's function body). This module writes
them in the layout of the onnx repository, which onnx's own runner also reads::

    <out>/<case name>/model.onnx
    <out>/<case name>/test_data_set_0/input_<i>.pb     (TensorProto, SequenceProto, ...)
    <out>/<case name>/test_data_set_0/output_<i>.pb
    <out>/<case name>/meta.json                         (op_type, rtol, atol, onnx version)

``meta.json`` is ours; :func:`load_case` also reads directories without it (the onnx
repository's data), inferring the op type from the model.
"""
from __future__ import annotations

import fnmatch
import importlib
import json
import logging
import re
import shutil
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .tolerance import ONNX_NODE_TEST_TOLERANCE

logger = logging.getLogger(__name__)

#: Tolerances of onnx's backend runner for node cases (``TestCase.rtol/atol``), see
#: :mod:`tvm_ext.testing.tolerance` for why node cases do not use ours.
DEFAULT_RTOL, DEFAULT_ATOL = ONNX_NODE_TEST_TOLERANCE

_EXPANDED = re.compile(r"^(?P<base>.*)_expanded(?:_ver\d+)?$")
_CASE_CACHE: list[Any] | None = None


@dataclass
class NodeCase:
    """One node test case as read from disk.

    Attributes
    ----------
    name : str
        Directory name, e.g. ``"test_add_bcast"``.
    op_type : str
        The operator under test (for ``*_expanded`` cases: the op whose function body the
        graph holds).
    model : onnx.ModelProto
    data_sets : list of (inputs, expected outputs)
        One entry per ``test_data_set_<n>``; values are arrays, lists (sequences) or
        ``None`` (empty optionals), in graph input / output order.
    rtol, atol : float
        Tolerances the case is checked with.
    """

    name: str
    op_type: str
    model: onnx.ModelProto
    data_sets: list[tuple[list[Any], list[Any]]] = field(default_factory=list)
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def expanded(self) -> bool:
        """Whether the graph is the op's function expansion rather than the op itself."""
        return _EXPANDED.match(self.name) is not None


# --------------------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------------------
def collect_node_testcases(modules: Sequence[str] | None = None) -> list[Any]:
    """Node test cases defined by the installed onnx package.

    Parameters
    ----------
    modules : sequence of str, optional
        Only import these case modules of ``onnx.backend.test.case.node`` (``"add"``,
        ``"softmax"`` ...; much faster than all of them). Default: every module, cached per
        process.

    Importing a case module runs its ``export*`` methods once (onnx's ``collect_testcases``
    does the same for all modules), appending to onnx's process-wide case list. With
    ``modules`` the result is that list: the requested modules' cases plus those of modules
    imported before (filter by name afterwards).
    """
    global _CASE_CACHE  # noqa: PLW0603 - process-wide cache of an expensive import
    from onnx.backend.test.case import node as node_pkg

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the case code casts out-of-range values on purpose
        if modules is None:
            if _CASE_CACHE is None:
                _CASE_CACHE = list(node_pkg.collect_testcases())
            return _CASE_CACHE
        for name in modules:
            importlib.import_module(f"{node_pkg.__name__}.{name}")
    return list(node_pkg._NodeTestCases)  # noqa: SLF001 - the list collect_testcases returns


def _matches(name: str, patterns: Sequence[str] | None) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _op_types_by_case(cases: Iterable[Any]) -> dict[str, str]:
    """Case name -> op under test. Single-node graphs name it; expansions use their base."""
    single = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    result = {}
    for case in cases:
        m = _EXPANDED.match(case.name)
        if m and m.group("base") in single:
            result[case.name] = single[m.group("base")]
        elif case.name in single:
            result[case.name] = single[case.name]
        else:
            result[case.name] = _guess_op_type(case.model)
    return result


def _guess_op_type(model: onnx.ModelProto) -> str:
    """The op of a one-op graph; ``"A+B"`` for a graph of several op types."""
    return "+".join(sorted({n.op_type for n in model.graph.node})) or "<empty>"


def _serialize_value(value: Any, type_proto: onnx.TypeProto, name: str) -> bytes:
    """Serialize one input/output value as the proto its graph type calls for."""
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.from_list(value, name).SerializeToString()
    if kind == "optional_type":
        return numpy_helper.from_optional(value, name).SerializeToString()
    if kind == "map_type":
        return numpy_helper.from_dict(value, name).SerializeToString()
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(np.asarray(value), name).SerializeToString()


def write_case(case: Any, out_dir: Path, op_type: str) -> Path:
    """Write one onnx ``TestCase`` (kind ``node``) under ``out_dir/<case.name>``."""
    case_dir = out_dir / case.name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    model = case.model
    (case_dir / "model.onnx").write_bytes(model.SerializeToString())
    for n, (inputs, outputs) in enumerate(case.data_sets):
        data_dir = case_dir / f"test_data_set_{n}"
        data_dir.mkdir()
        for kind, values, infos in (("input", inputs, model.graph.input),
                                    ("output", outputs, model.graph.output)):
            for i, value in enumerate(values):
                blob = _serialize_value(value, infos[i].type, infos[i].name)
                (data_dir / f"{kind}_{i}.pb").write_bytes(blob)
    meta = {"name": case.name, "op_type": op_type, "rtol": case.rtol, "atol": case.atol,
            "onnx_version": onnx.__version__}
    (case_dir / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return case_dir


def generate_node_tests(out_dir: str | Path, patterns: Sequence[str] | str | None = None,
                        modules: Sequence[str] | None = None) -> list[str]:
    """Regenerate node test cases from the installed onnx package.

    Parameters
    ----------
    out_dir : str or Path
        Destination; one sub-directory per case (an existing case directory is replaced).
    patterns : str or sequence of str, optional
        ``fnmatch`` patterns on case names (``"test_add*"``); all cases when omitted.
    modules : sequence of str, optional
        Speed-up: only run these onnx case modules (see :func:`collect_node_testcases`).

    Returns
    -------
    list of str
        Names of the cases written, in onnx's definition order.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cases = collect_node_testcases(modules)
    op_types = _op_types_by_case(cases)
    written = []
    for case in cases:
        if _matches(case.name, patterns):
            write_case(case, out, op_types[case.name])
            written.append(case.name)
    logger.info("wrote %d node test cases to %s", len(written), out)
    return written


# --------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------
def _parse_value(blob: bytes, type_proto: onnx.TypeProto) -> Any:
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        seq = onnx.SequenceProto()
        seq.ParseFromString(blob)
        return numpy_helper.to_list(seq)
    if kind == "optional_type":
        opt = onnx.OptionalProto()
        opt.ParseFromString(blob)
        return numpy_helper.to_optional(opt)
    if kind == "map_type":
        mp = onnx.MapProto()
        mp.ParseFromString(blob)
        return numpy_helper.to_dict(mp)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(blob)
    return numpy_helper.to_array(tensor)


def _read_values(data_dir: Path, kind: str, infos: Sequence[onnx.ValueInfoProto]) -> list[Any]:
    files = sorted(data_dir.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [_parse_value(f.read_bytes(), infos[i].type) for i, f in enumerate(files)]


def load_case(case_dir: str | Path) -> NodeCase:
    """Read one case directory (ours, or the onnx repository's layout)."""
    case_dir = Path(case_dir)
    model = onnx.load(str(case_dir / "model.onnx"))
    meta_path = case_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    op_type = meta.get("op_type")
    if op_type is None:
        base = _EXPANDED.match(case_dir.name)
        base_model = case_dir.parent / base.group("base") / "model.onnx" if base else None
        if base_model is not None and base_model.exists():
            op_type = _guess_op_type(onnx.load(str(base_model)))
        else:
            op_type = _guess_op_type(model)
    data_sets = []
    for data_dir in sorted(case_dir.glob("test_data_set_*"), key=lambda p: int(p.name.rsplit("_", 1)[1])):
        inputs = _read_values(data_dir, "input", model.graph.input)
        outputs = _read_values(data_dir, "output", model.graph.output)
        data_sets.append((inputs, outputs))
    return NodeCase(name=case_dir.name, op_type=op_type, model=model, data_sets=data_sets,
                    rtol=float(meta.get("rtol", DEFAULT_RTOL)), atol=float(meta.get("atol", DEFAULT_ATOL)))


def list_cases(data_dir: str | Path, pattern: str | Sequence[str] | None = None) -> list[Path]:
    """Case directories (those holding a ``model.onnx``) under ``data_dir``, sorted by name."""
    patterns = [pattern] if isinstance(pattern, str) else pattern
    root = Path(data_dir)
    return sorted(p.parent for p in root.glob("*/model.onnx") if _matches(p.parent.name, patterns))
