"""LLVM-CPU schedule rules for fused PrimFuncs (run right after FuseTIR).

FuseTIR concatenates loop nests: each intermediate is still a buffer and no loop is parallel or
vectorized. The rules below turn any such PrimFunc into a parallel, vectorized nest in which the
spatial intermediates are inlined, so a fusion decision can show up in the measured time.

Rules are tried in the order :func:`rules` returns (first that applies wins, as in dlight):

1. :class:`Contraction` -- one matmul / batch-matmul / conv2d / depthwise block
   (``C += A * B``) plus spatial producers and at most one epilogue: register-blocked tiles
   (``gemm.py``'s micro-kernel for einsum-form blocks, ``conv.py``'s direct kernel for NC(H)W
   convolutions, ``depthwise.py``'s for NCHW depthwise ones), accumulator in a local
   buffer, epilogue computed from registers.
2. :class:`Attention` -- scores -> scale/mask -> softmax -> P V (``attention.py``): parallel
   over batch x blocks of query rows, the row block's scores, softmax and output tile in
   local buffers and registers.
3. :class:`RowReduction` -- softmax, layer/RMS norm, mean, sum chains whose blocks share
   leading spatial axes: parallel over rows, every block computed per row, inner loops
   vectorized.
4. :class:`Fallback` -- always applies: inline spatial intermediates, then a transpose that
   moves the innermost axis runs as register tiles (``transpose.py``) and each remaining
   block gets parallel outer spatial loops and a vectorized inner loop.

A rule that cannot prove its preconditions, or whose schedule primitives reject a step, returns
None and the next rule is tried; a function no rule schedules is left as it was (still correct).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from . import transpose
from ._common import (
    inline_spatial,
    root_blocks,
    simplify_indices,
)
from ._loops import SafeRule, schedule_rest
from .attention import Attention
from .card import Card
from .chain import ChannelChain
from .classes import ScheduleClass
from .contraction import Contraction
from .reduction import RowReduction

__all__ = ["Attention", "ChannelChain", "Contraction", "Fallback", "RowReduction", "rules"]


def _claims_elementwise(f, kind: str) -> bool:
    """Elementwise and injective chains: no contraction, no reduction."""
    return f.schedule == ScheduleClass.ELEMENTWISE


def _fallback_nests(f) -> int:
    """One parallel nest per contraction and reduction, one more for the spatial rest."""
    heavy = f.n_contractions + f.n_reductions
    return max(1, heavy + (1 if f.n_ops > heavy else 0))


# Loops bound by memory: their compute runs at vector rate, transcendental calls (erf, exp ~20
# instructions each) priced apart (``cost/analytical.py``). CUDA: memory bound, ptxas gives
# elementwise chains 12-18 registers.
ELEMENTWISE_CARD = Card(ScheduleClass.ELEMENTWISE, "Fallback", _claims_elementwise,
                        efficiency={"cpu": 0.05, "cuda": 0.10}, cuda_registers=10)
# Everything else: intermediates materialize; a contraction runs as a naive loop nest, 0.7-1.9
# GFLOP/s measured on CPU (TVM_NOTES), on CUDA one thread per output element without tiling
# (~2% of peak).
FALLBACK_CARD = Card(ScheduleClass.FALLBACK, "Fallback", lambda f, kind: True,
                     efficiency={"cpu": 0.05, "cuda": 0.10}, contraction_flops={"cpu": 1.0e9},
                     contraction_efficiency={"cuda": 0.02}, cuda_registers=24,
                     materializes=True, nests=_fallback_nests)


class Fallback(SafeRule):
    """Always applies: inline spatial intermediates, then parallelize + vectorize each block.

    An all-spatial group gets one vectorized nest this way (``elementwise``); anything else
    keeps its reductions and contractions as plain loop nests (``fallback``).
    """

    cards = (ELEMENTWISE_CARD, FALLBACK_CARD)

    def apply(self, func, target: Target, tunable: bool):
        sch = super().apply(func, target, tunable)
        if sch is None and isinstance(func, tirx.PrimFunc) and self.is_target_available(target):
            # inlining tripped over something: schedule the blocks as they are
            sch = self.guarded(func, target, self._schedule_blocks)
        return sch

    def _apply(self, sch, target):
        sch = s_tir.Schedule(simplify_indices(sch.mod["main"]))
        inline_spatial(sch, materialize_transposed=True)
        return self._schedule_blocks(sch, target)

    @staticmethod
    def _schedule_blocks(sch, target):
        blocks = root_blocks(sch)
        if not blocks:
            return None
        done: set[str] = set()
        for name in [sch.get(b).name_hint for b in blocks]:
            tiled = transpose.schedule_transpose(sch, name)  # a transpose moving its rows
            if tiled is not None:
                sch, names = tiled
                done |= names
        schedule_rest(sch, target, done=done)
        return sch


def rules() -> list[dl.ScheduleRule]:
    """The CPU rules in policy order: most specific first, the always-applying one last."""
    return [ChannelChain(), Contraction(), Attention(), RowReduction(), Fallback()]
