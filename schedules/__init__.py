"""Schedules for fused PrimFuncs: LLVM-CPU rules here (``cpu``), CUDA in ``cuda``.

Per target kind, ``backends`` says which rules schedule a kernel (first that applies wins),
the pass that applies them right after ``FuseTIR``, when every kernel is final, and what
each kernel goes through after them; ``tvm_costfuse.pipelines.default_schedule`` picks one
per target kind. Each rule's kernel kinds have their cards beside it (``card.py``), listed in
``catalog.py``.
"""

from __future__ import annotations

from ._common import is_spatial, root_blocks
from ._loops import int32_partition_loops
from .backends import Backend, backend, finish_pass, first_rule, schedule_pass
from .cpu import Attention, ChannelChain, Contraction, Fallback, RowReduction, rules

__all__ = [
    "Attention",
    "Backend",
    "ChannelChain",
    "Contraction",
    "Fallback",
    "RowReduction",
    "backend",
    "finish_pass",
    "first_rule",
    "int32_partition_loops",
    "is_spatial",
    "root_blocks",
    "rules",
    "schedule_pass",
]
