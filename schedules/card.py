"""Kernel-kind cards: what the cost model knows of each kind of kernel a rule builds.

A schedule rule decides on TIR whether it takes a fused kernel (``cpu.py``'s rules, dlight's on
CUDA); the planner must know the answer before any kernel exists, from a group's features. So
each kind of kernel has a card beside its rule: :attr:`Card.claims` says, from the features,
whether that rule takes the group on a target kind, and the card holds the numbers the
analytical model prices the kernel with (the share of peak its loops reach, how it runs the
contractions in it, its registers, its parallel loop nests). ``catalog.py`` lists the cards in
the rules' order; the first card that claims a group is its kind, as the first rule that
applies is in dlight's ``ApplyDefaultSchedule``. ``tests/test_rule_fidelity.py`` builds the
zoo's and the corpus decode steps' kernels and checks that the rule which took each one is its card's.

The cards read features by name only (``cost/features.GroupFeatures``; ``schedules/`` sits
below ``cost/`` and imports nothing from it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .classes import ScheduleClass

__all__ = ["Card", "no_items", "no_rereads", "no_share", "one_nest", "untiled_contraction"]


def untiled_contraction(features: Any) -> bool:
    """Whether the group's one contraction has no tiled path in the contraction rule: no
    einsum, convolution or depthwise form, and no output axis to vectorize (a 1x1 conv on a
    1x1 image, as squeeze-excite blocks have: ``normalize_prim_func`` drops the unit axes,
    ``efficiency.describe`` reads ``tiled`` 1). The rule declines such a block; the
    row-reduction rule takes it, one dot product per output."""
    geometries = [w.geometry for w in features.op_work if w.contraction]
    if len(geometries) != 1 or geometries[0] is None:
        return False
    g = geometries[0]
    return g.gemm is None and g.conv is None and g.depthwise is None and g.tiled <= 1


def one_nest(features: Any) -> int:
    """One parallel loop nest per kernel (one thread-pool wake-up)."""
    return 1


def no_items(features: Any) -> None:
    """The kernel parallelizes over its output elements."""


def no_share(work: Any, lanes: int, registers: int) -> None:
    """Every contraction is priced as its standalone rule's tile."""


def no_rereads(features: Any) -> tuple[int, int]:
    """The kernel reads each input once."""
    return 0, 0


@dataclass(frozen=True)
class Card:
    """One kernel kind. Target kinds are ``"cpu"`` and ``"cuda"``; a kind is possible on a
    target only where :attr:`efficiency` has an entry for it (a card never claims elsewhere).
    """

    #: the schedule class the kind is priced as (the learned model's one-hot input)
    cls: ScheduleClass
    #: the CPU rule that schedules it (a class name of ``cpu.rules()``)
    rule: str
    #: ``claims(features, target kind)``: whether the rule takes such a group there
    claims: Callable[[Any, str], bool]
    #: share of peak FP32 of the kernel's loops outside its contractions, per target kind
    efficiency: Mapping[str, float]
    #: share of peak its contractions reach (absent: the loops' :attr:`efficiency`)
    contraction_efficiency: Mapping[str, float] = field(default_factory=dict)
    #: contraction FLOP/s measured where they run as plain loop nests (beats the share)
    contraction_flops: Mapping[str, float] = field(default_factory=dict)
    #: share of peak of the members feeding a contraction (absent: :attr:`efficiency`)
    prologue_efficiency: Mapping[str, float] = field(default_factory=dict)
    #: CPU: a contraction is priced at the share its rule's own tile reaches (``efficiency.py``)
    tiles_by_geometry: bool = False
    #: CPU: a register-blocked tile takes most of the vector register file
    register_tile: bool = False
    #: registers a CUDA thread needs before counting live values (ptxas)
    cuda_registers: int | None = None
    #: intermediates reach memory (written once, read once), not kept on chip
    materializes: bool = False
    #: producers inlined per use are evaluated again per use (``recompute_flops`` priced)
    recomputes: bool = True
    #: parallel loop nests on CPU, each a thread-pool wake-up and join
    nests: Callable[[Any], int] = one_nest
    #: target kinds on which a planner merge may step through reshape views into this kind
    through_views: frozenset[str] = frozenset()
    #: CPU: iterations of the kernel's one parallel loop, where its tiling sets them (None: the
    #: output elements decide, as for every kind that parallelizes over its outputs)
    parallel_items: Callable[[Any], int | None] = no_items
    #: CPU: an operand the kernel reads again per tile, as (its bytes, extra reads)
    rereads: Callable[[Any], tuple[int, int]] = no_rereads
    #: CPU: ``share(op work, lanes, registers)``, the share of peak a contraction reaches in
    #: this kind's own tile (None: the standalone rule's, by its geometry)
    share: Callable[[Any, int, int], float | None] = no_share

    def __post_init__(self) -> None:
        if "cuda" in self.efficiency and self.cuda_registers is None:
            raise ValueError(f"the {self.cls} card prices CUDA kernels: it needs cuda_registers")

    def contraction_rate(self, kind: str, peak: float) -> float:
        """FLOP/s of a contraction inside this kind of kernel on a ``kind`` target."""
        if kind in self.contraction_flops:
            return self.contraction_flops[kind]
        return peak * self.contraction_efficiency.get(kind, self.efficiency[kind])

    def prologue_share(self, kind: str) -> float:
        """Share of peak of the members feeding a contraction on a ``kind`` target."""
        return self.prologue_efficiency.get(kind, self.efficiency[kind])
