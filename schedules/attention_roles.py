"""Block roles of a fused attention PrimFunc, for the attention schedules (``attention.py``,
``attention_decode.py``).

Predicates read the schedule's IR; :func:`last_index` (a layout transform) and
:func:`inline_probabilities` (an inline, for the one-row kernel) are the only ones that change
it, both through the schedule, whose own checks raise instead of producing a wrong program.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

from . import gemm
from ._common import has_costly_call, int_extent, is_spatial, root_blocks, uses
from .contraction import contraction_operands


def einsum(block: s_tir.SBlock):
    """(store, row operand, streamed operand, gemm roles) of an einsum-form contraction."""
    if is_spatial(block):
        return None
    ops = contraction_operands(block)
    roles = gemm.analyze(block, *ops) if ops else None
    return None if roles is None else roles


def same_vars(a, b) -> bool:
    """The same index vars in the same order, constants (unit dims) left out: an inlined
    reshape between a 4-D softmax and a 3-D batch matmul adds or drops a leading 0."""
    a = [x for x in a if not isinstance(x, tirx.IntImm)]
    b = [y for y in b if not isinstance(y, tirx.IntImm)]
    return len(a) == len(b) and all(isinstance(x, tirx.Var) and x.same_as(y)
                                    for x, y in zip(a, b))


def producer_of(sch, buffer):
    for blk in root_blocks(sch):
        if any(w.source.same_as(buffer) for w in sch.get(blk).writes):
            return blk
    return None


def loops_below(sch, block, top) -> dict | None:
    """The loops of ``block`` under ``top``, keyed by the block var each one drives (a loop
    of extent 1 may drive none); None where a loop drives several."""
    stmt = sch.get(block)
    values = get_sblockrealize(sch, block).iter_values
    loops = sch.get_loops(block)
    start = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(top))) + 1
    out = {}
    for lp in loops[start:]:
        var = sch.get(lp).loop_var
        bound = [iv.var for iv, val in zip(stmt.iter_vars, values) if uses(val, var)]
        if len(bound) > 1 or (not bound and int_extent(sch, lp) != 1):
            return None
        if bound:
            out[bound[0]] = lp
    return out


def last_index(sch, block_name: str, load, var) -> None:
    """Store ``load``'s buffer with the index ``var`` last (vectors along it are contiguous):
    a transform of its producer's layout, or of a copy when the buffer is an input."""
    pos = next(i for i, x in enumerate(load.indices) if isinstance(x, tirx.Var)
               and x.same_as(var))
    ndim = len(load.indices)
    if pos == ndim - 1:
        return
    block = sch.get_sblock(block_name)
    producer = producer_of(sch, load.source)
    if producer is None:
        index = next(i for i, r in enumerate(sch.get(block).reads)
                     if r.source.same_as(load.source))
        producer = sch.cache_read(block, index, "global")
    mapping = tirx.IndexMap.from_func(
        lambda *idx: (*idx[:pos], *idx[pos + 1:], idx[pos]), ndim=ndim)
    sch.transform_layout(producer, ("write", 0), mapping)


def reduces_last_axis(block: s_tir.SBlock, intermediates) -> bool:
    """Whether a block's reduction vars index only the last axis of the ``intermediates``
    (buffers the function allocates) it reads: a row reduction over the keys; a spatial block
    trivially. Loads of the function's inputs are not judged: an input read transposed
    (DeBERTa's position-to-content scores, ``bias[h, key, row]``) is still read per row
    block. A reduction that really runs across the rows of an input is computed, under the
    row-block loop, over the region it needs: where that spans more rows than a block the
    rule declines (its work check), where one block holds every row it is exact."""
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if not reduce:
        return True
    loads = []
    tvm_ffi.structural_walk(block.body, (tvm.ir.expr.TensorLoad, loads.append))
    return all(not uses(index, var) for load in loads
               if any(load.source.same_as(b) for b in intermediates)
               for index in load.indices[:-1] for var in reduce)


def p_chain(sch, p_buffer, first: str | None):
    """Names of the blocks P is computed from (program order), stopping at ``first``; None
    where the chain holds another contraction or P is an input."""
    start = producer_of(sch, p_buffer)
    if start is None:
        return None
    seen, stack = {}, [start]
    while stack:
        blk = stack.pop()
        name = sch.get(blk).name_hint
        if name in seen or name == first:
            continue
        if einsum(sch.get(blk)) is not None:
            return None
        seen[name] = blk
        stack.extend(sch.get_producers(blk))
    order = [sch.get(b).name_hint for b in root_blocks(sch)]
    return sorted(seen, key=order.index)


def inline_probabilities(sch, p_buffer, chain: list[str]) -> None:
    """Inline P's producer (``P = exp * (1 / sum)``, read once per key and output tile) into
    P V where it is spatial, calls nothing costly and has no other consumer; its name leaves
    ``chain``."""
    p_block = producer_of(sch, p_buffer)
    p_stmt = sch.get(p_block)
    if not is_spatial(p_stmt) or has_costly_call(p_stmt.body) or len(
            sch.get_consumers(p_block)) != 1:
        return
    try:
        sch.compute_inline(p_block)
        chain.remove(p_stmt.name_hint)
    except s_tir.ScheduleError:
        pass


def reduce_extent(sch, name: str) -> int:
    """The product of block ``name``'s constant reduction extents (1 for a spatial block)."""
    stmt = sch.get(sch.get_sblock(name))
    return math.prod(int(iv.dom.extent) for iv in stmt.iter_vars
                     if iv.iter_type == tirx.IterVar.CommReduce
                     and isinstance(iv.dom.extent, tirx.IntImm))


def _along(index) -> tirx.Var | None:
    """The var an index runs along with unit stride: ``v`` or ``v +- c``; None otherwise."""
    if isinstance(index, tirx.Var):
        return index
    if isinstance(index, (tirx.Add, tirx.Sub)) and isinstance(index.a, tirx.Var) and isinstance(
            index.b, tirx.IntImm):
        return index.a
    return None


def reads_along(sch, block) -> None:
    """Reorder a spatial block's last two loops where more of its accesses run contiguously
    along the second-to-last one: the generic schedule vectorizes the innermost loop, the
    write's last axis. K^T packed from K with the rotary embedding computed on the way (a
    llama-style prefill) loads K at d and d +- half, cos and sin along the head dim and stores
    along the keys; vectorized along the keys, each output vector gathered its four loads 16
    scalars at a time, a fifth of the fused kernel's time (``perf``; docs/log/2026-12-07e.md).
    Along the head dim the loads are whole vectors and the one store scatters. An access
    votes where it moves along both loops, once (a load inside either branch of a select
    too); a tie keeps the innermost loop."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if not is_spatial(stmt) or len(loops) < 2 or not isinstance(stmt.body, tirx.BufferStore):
        return
    values = get_sblockrealize(sch, block).iter_values
    bound = {}
    for lp in loops[-2:]:
        var = sch.get(lp).loop_var
        ivs = [iv.var for iv, v in zip(stmt.iter_vars, values) if uses(v, var)]
        if len(ivs) != 1 or not any(isinstance(v, tirx.Var) and v.same_as(var)
                                    for v in values):
            return  # a loop driving several block vars, or through an expression
        bound[lp] = ivs[0]
    outer, inner = loops[-2:]
    loads: list = []
    tvm_ffi.structural_walk(stmt.body.value, (tvm.ir.expr.TensorLoad, loads.append))
    # an access that does not move along one of the two loops costs the same either way (a
    # broadcast operand: one scalar per vector, or one vector per row): it does not vote
    indices = [list(ld.indices) for ld in loads] + [list(stmt.body.indices)]
    voters = [ix for ix in indices if ix and all(any(uses(i, bound[lp]) for i in ix)
                                                 for lp in (outer, inner))]
    count = {lp: sum(1 for ix in voters if (v := _along(ix[-1])) is not None
                     and v.same_as(bound[lp])) for lp in (outer, inner)}
    if count[outer] > count[inner]:
        sch.reorder(inner, outer)
