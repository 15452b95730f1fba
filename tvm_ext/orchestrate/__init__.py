"""Korch's kernel orchestration: convex candidate sets from execution states, selected by the BLP.

:mod:`~tvm_ext.orchestrate.enumeration` finds the sets, :mod:`~tvm_ext.orchestrate.generator`
proposes them as candidates built by stitch or dlight; fission (:mod:`tvm_ext.fission`) splits
operators into primitives first in the ``orchestrate`` preset.
"""
from .enumeration import Enumeration, EnumerationLimits, cut_windows, enumerate_candidates, execution_states
from .generator import OrchestrateGenerator, OrchestratePlan

__all__ = ["Enumeration", "EnumerationLimits", "OrchestrateGenerator", "OrchestratePlan", "cut_windows",
           "enumerate_candidates", "execution_states"]
