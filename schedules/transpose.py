"""A transpose that moves the innermost axis, as tiles through registers.

``O[.., i, .., j] = X[.., j, .., i]`` (the output's innermost axis is not the input's): the
generic schedule vectorizes the output's innermost loop, so every output vector gathers its
elements from input addresses a whole input row apart. Such transposes sit around every
convolution a channels-last model keeps NCHW, and between a vision transformer's token-major
and image-major tensors.

``parallel(outer loops, input-innermost tiles) -> output-innermost tiles -> tile read (rows
unrolled, vectorized along the input's innermost axis) -> tile written (rows unrolled,
vectorized along the output's)``: consecutive tiles complete an output row (with the
output-innermost tiles outermost instead, a token-major transpose ran 0.27x the gathered
rows, its tile rows landing 256 bytes apart). 1.40-5.51x the gathered rows on the transposes
of ``lab/transpose_ab.py`` (1 thread, rocketlake). Only a pure copy of 4-byte elements whose
two axes are whole tiles is taken; the rest keeps the generic schedule.
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

from ._common import int_extent, is_spatial
from ._loops import parallelize

__all__ = ["TILE", "gathers", "schedule_transpose"]

#: Tile edge: 8 x 8 ran 1.45x a 16 x 16 tile on ``lab/transpose_tile_probe.py`` (measured
#: with the other tile order; 16 vectors and their transposed copies would fill the
#: register file).
TILE = 8


def _vars(indices) -> list | None:
    out = list(indices)
    return out if all(isinstance(i, tirx.Var) for i in out) else None


def _transposed(sch: s_tir.Schedule, block):
    """(loop of the output's innermost var, loop of the input's innermost var) where
    ``block`` is a spatial copy of another 4-byte buffer through a permutation of all its
    vars that moves the innermost axis, alone under its loops, every loop binding its own
    block var with a static extent; None otherwise."""
    stmt = sch.get(block)
    if not is_spatial(stmt) or len(stmt.reads) != 1 or len(stmt.writes) != 1:
        return None
    source, dest = stmt.reads[0].source, stmt.writes[0].source
    if source.same_as(dest) or source.dtype.bits != 32 or dest.dtype != source.dtype:
        return None
    store = stmt.body
    value = getattr(store, "value", None)
    if not isinstance(value, ir.TensorLoad) or not hasattr(store, "indices"):
        return None
    out_vars, in_vars = _vars(store.indices), _vars(value.indices)
    block_vars = [iv.var for iv in stmt.iter_vars]
    if out_vars is None or in_vars is None or len(block_vars) < 2:
        return None

    def same_set(a, b) -> bool:
        return len(a) == len(b) and all(sum(x.same_as(y) for y in b) == 1 for x in a)

    if not (same_set(out_vars, block_vars) and same_set(in_vars, block_vars)):
        return None  # a repeated or missing var: no permutation
    if out_vars[-1].same_as(in_vars[-1]):
        return None
    loops = sch.get_loops(block)
    values = get_sblockrealize(sch, block).iter_values
    if len(loops) != len(block_vars) or len(sch.get_child_blocks(loops[0])) != 1:
        return None
    found = {}
    for var, value_var, loop in zip(block_vars, values, loops):
        if not (isinstance(value_var, tirx.Var) and value_var.same_as(sch.get(loop).loop_var)):
            return None
        if int_extent(sch, loop) is None:
            return None
        for key, last in (("out", out_vars[-1]), ("in", in_vars[-1])):
            if var.same_as(last):
                found[key] = loop
    return found["out"], found["in"]


def gathers(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is a copy of 4-byte elements through a permutation that moves the
    innermost axis (:func:`_transposed`; other element sizes are not marked). Fused into
    another kernel, its loads gather; the cost model prices them so (``cost.extract``)."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (RuntimeError, ValueError):
        return False
    return len(blocks) == 1 and _transposed(sch, blocks[0]) is not None


def schedule_transpose(sch: s_tir.Schedule, name: str):
    """``(schedule, names of the blocks it scheduled)`` with block ``name`` as tiles (module
    docstring) where it is such a transpose and both axes are whole tiles, on a copy of
    ``sch``; None otherwise, also where TVM refuses a step (``sch`` is never changed)."""
    found = _transposed(sch, sch.get_sblock(name))
    if found is None:
        return None
    if any(int_extent(sch, lp) % TILE for lp in found):
        return None
    trial = sch.copy()
    try:
        block = trial.get_sblock(name)
        out_loop, in_loop = _transposed(trial, block)
        tile = _tile(trial, block, out_loop, in_loop)
    except (RuntimeError, ValueError):  # ScheduleError is a RuntimeError
        return None
    return trial, {name, trial.get(tile).name_hint}


def _tile(sch: s_tir.Schedule, block, out_loop, in_loop):
    loops = sch.get_loops(block)
    work = 1
    for lp in loops:
        work *= int_extent(sch, lp)
    others = [lp for lp in loops if not sch.get(lp).same_as(sch.get(out_loop))
              and not sch.get(lp).same_as(sch.get(in_loop))]
    oo, oi = sch.split(out_loop, factors=[None, TILE])
    io, ii = sch.split(in_loop, factors=[None, TILE])
    sch.reorder(*others, io, oo, ii, oi)
    tile = sch.cache_read(block, 0, "local", consumer_blocks=[block])
    sch.compute_at(tile, oo)
    read = sch.get_loops(tile)
    sch.vectorize(read[-1])
    sch.unroll(read[-2])
    sch.unroll(ii)
    sch.vectorize(oi)
    parallelize(sch, [*others, io], work)
    return tile
