"""A reduction over the image of a channels-last tensor: the channels stay the vector axis.

A mean over the image of an NHWC tensor (a squeeze-excite block's squeeze, a global average
pool), ``S[n, c] += X[n, h, w, c]``, reduces axes that lie outside the contiguous one. The row
reduction rule fuses the output axes into parallel rows and reduces each row's elements, here
``H * W`` loads ``C`` floats apart: efficientnet_b0's 32 x 112 x 112 squeeze ran 0.79 ms that
way (1 thread, rocketlake). Read as columns, the channels stay the vector axis and the image is
one pass over contiguous memory:

``parallel(outer spatial, channel tiles) -> reduction loops -> channels (vectorized)``
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

from ._common import uses, vector_lanes
from ._loops import loop_kinds, parallelize, schedule_rest
from .depthwise_nhwc import channel_tile  # the same channels per vector

__all__ = ["schedule_columns"]


def _column_loop(sch: s_tir.Schedule, block):
    """(the last spatial loop, the reduction loops) where ``block`` reduces the image of a
    channels-last tensor: it reads one 4-d buffer whose two middle axes are its reduction
    loops' and whose last axis is its last spatial loop's, as is its output's last axis;
    None otherwise (a row reduction, a window, a non-trivial binding, other shapes: a column
    reduction of another form is left to the row rule, unmeasured here)."""
    kinds = loop_kinds(sch, block)
    loops = sch.get_loops(block)
    if kinds is None or "R" not in kinds or kinds[-1] != "R" or "S" not in kinds:
        return None
    first_r = kinds.index("R")
    if "S" in kinds[first_r:]:
        return None
    stmt = sch.get(block)
    bound = dict(zip([v for v in get_sblockrealize(sch, block).iter_values],
                     [iv.var for iv in stmt.iter_vars]))
    column = loops[first_r - 1]
    var = bound.get(sch.get(column).loop_var)
    if var is None:
        return None
    for region in [*stmt.reads, *stmt.writes]:
        last = region.region[-1].min
        if not (isinstance(last, tirx.Var) and last.same_as(var)):
            return None
        if any(uses(r.min, var) for r in region.region[:-1]):
            return None
    reduced = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(stmt.reads) != 1 or len(stmt.reads[0].region) != 4 or len(reduced) != 2:
        return None
    middle = [r.min for r in stmt.reads[0].region[1:3]]
    if not all(isinstance(m, tirx.Var) and any(m.same_as(v) for v in reduced) for m in middle):
        return None
    return column, loops[first_r:]


def schedule_columns(sch: s_tir.Schedule, block, target) -> bool:
    """Schedule ``block`` as a column reduction (module docstring) and the rest generically;
    False (nothing changed) where it is none."""
    found = _column_loop(sch, block)
    if found is None:
        return False
    column, reduce_loops = found
    extent = int(sch.get(column).extent)
    tile = channel_tile(extent, vector_lanes(target, str(sch.get(block).writes[0].source.dtype)))
    if tile < 4:
        return False
    outer = list(sch.get_loops(block)[:-len(reduce_loops) - 1])
    co, ci = sch.split(column, factors=[None, tile])
    sch.reorder(*outer, co, *reduce_loops, ci)
    work = math.prod(int(sch.get(lp).extent) for lp in sch.get_loops(block))
    parallelize(sch, [*outer, co], work)
    sch.vectorize(ci)  # before decompose: the update block alone is no reduction
    init = sch.decompose_reduction(block, reduce_loops[0])
    sch.vectorize(sch.get_loops(init)[-1])
    schedule_rest(sch, target, {sch.get(b).name_hint for b in (block, init)})
    return True
