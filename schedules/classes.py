"""Schedule classes: which kind of schedule a fused group's kernel gets, as one type.

The CPU rules (``schedules/cpu.py``) and dlight's GPU rules each produce one of these; the
features say which one a group lands in (``GroupFeatures.schedule_on``), and both cost models
price a group by its class (``cost/analytical.py`` efficiency and register tables, the learned
model's one-hot inputs). A new schedule rule adds its class here, then to those tables.
"""

from __future__ import annotations

import enum


class ScheduleClass(enum.StrEnum):
    """A string enum: members compare equal to their names in stored feature rows."""

    #: one contraction, spatial producers inlined and an elementwise epilogue on registers
    CONTRACTION = "contraction"
    #: a contraction whose producers stay one streamed packing pass through memory (CPU)
    CONTRACTION_STREAM = "contraction+stream"
    #: a contraction with producers, before the target decides (``schedule_on``)
    CONTRACTION_PROLOGUE = "contraction+prologue"
    #: a contraction with a reshaping epilogue, before the target decides
    CONTRACTION_RESHAPE = "contraction+reshape"
    #: row reductions (softmax, norms, mean) with their epilogues, parallel over rows
    REDUCTION = "reduction"
    #: scores -> scale/mask -> softmax -> P V (or softmax -> P V) per block of query rows (CPU)
    ATTENTION = "attention"
    #: elementwise / injective chains, inlined into one vectorized nest
    ELEMENTWISE = "elementwise"
    #: everything else: spatial intermediates inlined, contractions as naive loop nests
    FALLBACK = "fallback"


#: The classes a kernel finally gets (``schedule_on``): what the cost models are tabled by.
FINAL = (ScheduleClass.CONTRACTION, ScheduleClass.CONTRACTION_STREAM, ScheduleClass.REDUCTION,
         ScheduleClass.ELEMENTWISE, ScheduleClass.FALLBACK, ScheduleClass.ATTENTION)
