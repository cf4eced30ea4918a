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

The tile edge is the widest of :data:`EDGES` that divides both axes. A 4 x 4 tile takes the
images of 28 or 12 pixels a side that 8 leaves out, whose gathered rows are slowest where an
input row is a multiple of 128 bytes (64 to 160 channels: 0.74-0.99 ns an element on a
rocketlake core, 0.27-0.30 at 116 or 120): 0.13-0.14 ns as 4 x 4 tiles, and where 8 divides
too, 8 x 8 and 4 x 4 ran alike (0.143 / 0.144 ns; 2026-12-08).
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

from ._common import int_extent, is_spatial
from ._loops import parallelize

__all__ = ["EDGES", "classify", "gathers", "schedule_transpose", "tiles"]

#: Tile edges, tried widest first: 8 x 8 ran 1.45x a 16 x 16 tile on
#: ``lab/transpose_tile_probe.py`` (measured with the other tile order; 16 vectors and their
#: transposed copies would fill the register file).
EDGES = (8, 4)


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


def _edge(sch: s_tir.Schedule, loops) -> int | None:
    """The widest of :data:`EDGES` dividing every loop's extent; None if none does."""
    extents = [int_extent(sch, lp) for lp in loops]
    return next((e for e in EDGES if all(x % e == 0 for x in extents)), None)


def _found(func: tirx.PrimFunc):
    """(schedule, :func:`_transposed`'s loops) of a one-block ``func``; None otherwise."""
    if not isinstance(func.body, s_tir.SBlockRealize):
        return None
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (RuntimeError, ValueError):
        return None
    found = _transposed(sch, blocks[0]) if len(blocks) == 1 else None
    return None if found is None else (sch, found)


def gathers(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is a copy of 4-byte elements through a permutation that moves the
    innermost axis (:func:`_transposed`; other element sizes are not marked). Fused into
    another kernel, its loads gather; the cost model prices them so (``cost.extract``)."""
    return _found(func) is not None


def tiles(func: tirx.PrimFunc) -> bool:
    """Whether ``func``, alone in its kernel, runs as this rule's tiles: a :func:`gathers`
    permutation whose two axes an edge divides (the cost model prices it at the host's
    tiled-transpose cost; ``cost.analytical._transposes``)."""
    return classify(func)[1]


def classify(func: tirx.PrimFunc) -> tuple[bool, bool]:
    """(:func:`gathers`, :func:`tiles`) of ``func``, its loops analysed once."""
    found = _found(func)
    return found is not None, found is not None and _edge(found[0], found[1]) is not None


def schedule_transpose(sch: s_tir.Schedule, name: str):
    """``(schedule, names of the blocks it scheduled)`` with block ``name`` as tiles (module
    docstring) where it is such a transpose and both axes are whole tiles, on a copy of
    ``sch``; None otherwise, also where TVM refuses a step (``sch`` is never changed)."""
    found = _transposed(sch, sch.get_sblock(name))
    if found is None:
        return None
    edge = _edge(sch, found)
    if edge is None:
        return None
    trial = sch.copy()
    try:
        block = trial.get_sblock(name)
        out_loop, in_loop = _transposed(trial, block)
        tile = _tile(trial, block, out_loop, in_loop, edge)
    except (RuntimeError, ValueError):  # ScheduleError is a RuntimeError
        return None
    return trial, {name, trial.get(tile).name_hint}


def _tile(sch: s_tir.Schedule, block, out_loop, in_loop, edge: int):
    loops = sch.get_loops(block)
    work = 1
    for lp in loops:
        work *= int_extent(sch, lp)
    others = [lp for lp in loops if not sch.get(lp).same_as(sch.get(out_loop))
              and not sch.get(lp).same_as(sch.get(in_loop))]
    oo, oi = sch.split(out_loop, factors=[None, edge])
    io, ii = sch.split(in_loop, factors=[None, edge])
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
