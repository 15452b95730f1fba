"""Benchmark harness: compile models x presets, check numerics, time them on a GPU.

Build here, run there::

    tvm-ext bench --suite seed --fp16 --build-only --out DIR      # build host (no GPU needed)
    DIR/run.sh                                                    # GPU machine, TVM runtime only

or both at once on a GPU machine with ``tvm-ext bench --suite seed --fp16``. The method
(events, warm-up, medians, rotating inputs, poisoned outputs, repeated timings) is in
``bench/README.md``.

The runtime side (:mod:`.run`, :mod:`.tvm_runner`, :mod:`.torch_runner`, :mod:`.timing`,
:mod:`.numerics`, :mod:`.inputs`, :mod:`.weights`, :mod:`.manifest`, :mod:`.model_data`,
:mod:`.results`, and :mod:`tvm_ext.deploy.runtime`) imports numpy and the TVM runtime only, and is
copied into every bundle. This ``__init__`` imports nothing, so it works there too.
"""
from __future__ import annotations
