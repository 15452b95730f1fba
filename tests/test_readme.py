"""The README's Python examples run as written, on the bundled BERT layer, without a GPU; the
package exposes the subpackages they use (``tvm_ext.frontend``, ``tvm_ext.inspect``).

Every ```python block of README.md and of the markdown files it links to runs in a fresh
namespace, in an empty temporary directory: a block that reads a model file writes it first
(the README's copies the bundled model to ``model.onnx``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)#\s]+\.md)\)")


def _markdown_files() -> list[Path]:
    """README.md and the repository markdown files it links to."""
    linked = [(REPO / m).resolve() for m in _LINK.findall(README.read_text())]
    return [README] + sorted({p for p in linked if p.is_file() and REPO in p.parents})


def _python_blocks() -> list[tuple[str, str]]:
    """(``file:line``, code) of every python block."""
    blocks = []
    for path in _markdown_files():
        text = path.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            blocks.append((f"{path.relative_to(REPO)}:{line}", match.group(1)))
    return blocks


BLOCKS = _python_blocks()


def test_the_readme_has_python_examples():
    assert BLOCKS, "README.md has no ```python block"


@pytest.mark.parametrize("code", [code for _, code in BLOCKS], ids=[where for where, _ in BLOCKS])
def test_python_block_runs_as_written(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<README block>", "exec"), {"__name__": "__readme__"})  # noqa: S102 - the README's own code


def test_public_subpackages_are_attributes_imported_on_first_access():
    """``tvm_ext.frontend`` works after ``import tvm_ext`` alone; the import itself stays lazy."""
    code = ("import sys, tvm_ext\n"
            "assert 'tvm_ext.inspect' not in sys.modules and 'tvm_ext.frontend' not in sys.modules\n"
            "assert {'frontend', 'inspect'} <= set(dir(tvm_ext)) and 'frontend' in tvm_ext.__all__\n"
            "assert callable(tvm_ext.frontend.from_onnx) and callable(tvm_ext.inspect.compare)\n"
            "assert not hasattr(tvm_ext, 'no_such_module')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_runtime_only_mode_names_what_needs_the_compiler():
    code = ("import tvm_ext\n"
            "assert tvm_ext.RUNTIME_ONLY and tvm_ext.bench.__name__ == 'tvm_ext.bench'\n"
            "try:\n    tvm_ext.frontend\n"
            "except tvm_ext.errors.RuntimeOnlyError as err:\n    print(err)\n")
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "TVM_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tvm_ext.frontend needs TVM's compiler library" in proc.stdout
