"""A ``tvm.s_tir.Schedule`` whose primitives skip the Python-side argument type check.

Every primitive of TVM's ``Schedule`` is wrapped by ``_type_checker.type_checked``, which binds
the call's arguments to the signature and walks their type hints in Python before calling into
C++. The tile graph builds a schedule for each tile it weighs (a dozen primitives per block,
thousands of schedules per model), and there that check is a fifth of the planning time: the
tile-graph graph stage of a Swin shifted-window block took 30.7 s with it and 24.6 s without
(this 2-core machine, 2026-11-28). The C++ side still checks every argument's type (a wrong one
raises from the FFI instead of with the wrapper's message); only the Python check is skipped.

Example
-------
>>> sch = UncheckedSchedule(func)
>>> loop, = sch.get_loops(sch.get_sblock("compute"))
>>> outer, inner = sch.split(loop, [None, 16])
"""
from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import _ffi_api


class UncheckedSchedule(s_tir.Schedule):
    """``tvm.s_tir.Schedule`` with its primitives unwrapped from the Python type check (see the
    module docstring); TVM's own functions return plain schedules."""

    def copy(self) -> UncheckedSchedule:
        """A copy of the schedule (state and symbol table, as ``Schedule.copy``), unchecked too:
        tens of microseconds, where building a schedule again and replaying its primitives takes
        milliseconds (the tile graph copies each function's inlined prefix per tile)."""
        new = UncheckedSchedule.__new__(UncheckedSchedule)
        new.__init_handle_by_constructor__(_ffi_api.ScheduleCopy, self)
        return new


def _unwrap() -> int:
    count = 0
    for name, attr in vars(s_tir.Schedule).items():
        wrapped = getattr(attr, "__wrapped__", None)
        if callable(attr) and wrapped is not None and name not in vars(UncheckedSchedule):
            setattr(UncheckedSchedule, name, wrapped)
            count += 1
    return count


#: How many primitives were unwrapped (0 would mean TVM changed how it checks).
UNWRAPPED = _unwrap()

__all__ = ["UNWRAPPED", "UncheckedSchedule"]
