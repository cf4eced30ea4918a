"""Schedule classes: the names of the kernel kinds, as one type.

Each final class is one card's (``card.py``, beside its rule; ``catalog.py`` lists them): the
card that claims a group names its class (``GroupFeatures.schedule_on``), the learned model
reads the class as a one-hot input (:data:`FINAL`'s order), and the analytical model the
card's numbers. A new kernel kind adds its class here (at the end of :data:`FINAL`: stored
models read the one-hot by position) and its card beside its rule.
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
    #: a 1x1 conv feeding a depthwise conv, tiled together over channel blocks (CPU)
    CONTRACTION_CHAIN = "contraction+chain"
    #: elementwise / injective chains, inlined into one vectorized nest
    ELEMENTWISE = "elementwise"
    #: everything else: spatial intermediates inlined, contractions as naive loop nests
    FALLBACK = "fallback"


#: Final classes with no one-hot column of their own: a column changes every stored learned
#: model's inputs (``tuning_logs/``), and a host's model is retrained on that host's rows only.
#: Their one-hot is all zeros, so no row of another class lies within the coverage radius of
#: such a group: the learned model answers it analytically (``cost/learned.py``) unless rows of
#: the class lie near (znver4's rows hold the zoo's chains). The class moves to the end of
#: :data:`FINAL` when every stored model is retrained with rows of it.
UNLEARNED = (ScheduleClass.CONTRACTION_CHAIN,)

#: The classes a kernel finally gets (``schedule_on``), in the learned model's one-hot order.
FINAL = (ScheduleClass.CONTRACTION, ScheduleClass.CONTRACTION_STREAM, ScheduleClass.REDUCTION,
         ScheduleClass.ELEMENTWISE, ScheduleClass.FALLBACK, ScheduleClass.ATTENTION)
