"""A row reduction over a ragged row, split into whole vectors and a tail block.

A vector of partial results (``reduction._vector_rfactor``) needs a row of whole vectors, or a
guard on its last one. Where the reduction is then computed per block of rows (the fused
attention's row max and row sum, ``attention.py``), ``compute_at`` regenerates the partial
block's loops from the region its consumer reads and drops that guard: the last vector reads
past the row. So a ragged row kept scalar chains, and 197 keys (ViT's) ran the fused
attention kernel 1.33x the time of 192.

:func:`split_tail` rewrites the reduction ``acc[s] = f(acc[s], x[s, k]) for k < n`` as two
blocks, each in a loop nest of its own: the head over ``k < h`` (``h`` a multiple of the
vector) into a buffer of its own, ``acc_head``, with the reduction's init, and the tail over
``h <= k < n``, whose init is ``acc[s] = acc_head[s]`` and which folds the last ``n - h``
elements in. The head's row is whole vectors, so its partials need no guard, and it is the
only writer of its buffer, as rfactor requires; the tail stays scalar. The fold keeps the
order of the original (the tail starts from the head's result), so any combiner gives the
same result as the whole row, up to the reassociation the head's partials bring to a sum.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ._common import is_spatial

__all__ = ["split_tail", "whole_vector_rows"]


def _reduce_var(block: s_tir.SBlock):
    """The block's one reduction iter var, or None."""
    reduce = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    return reduce[0] if len(reduce) == 1 else None


def _renamed(node, pairs):
    """``node`` with each ``old`` Var of ``pairs`` replaced by its ``new`` one."""
    def swap(v):
        return next((new for old, new in pairs if v.same_as(old)), v)

    return tvm_ffi.structural_map(node, (tirx.Var, swap))


def _nest(loops: list[tirx.For], inner: tirx.Stmt) -> tirx.Stmt:
    """``inner`` under copies of ``loops`` (outermost first)."""
    for loop in reversed(loops):
        inner = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, inner)
    return inner


def _head(realize: s_tir.SBlockRealize, loops: list[tirx.For], head: int, partial
          ) -> tirx.Stmt:
    """The nest of ``loops`` with the innermost cut to ``head`` iterations, and ``realize``'s
    block over the reduction's first ``head`` values into the buffer ``partial`` (its init
    kept)."""
    block, reduce, inner = realize.block, _reduce_var(realize.block), loops[-1]
    dtype = reduce.dom.extent.ty.dtype
    iter_vars = [tirx.IterVar(tvm.ir.Range.from_min_extent(iv.dom.min, tirx.const(head, dtype)),
                              iv.var, iv.iter_type) if iv.same_as(reduce) else iv
                 for iv in block.iter_vars]
    into = [(block.writes[0].source, partial)]
    first = s_tir.SBlock(iter_vars, _renamed(block.reads, into), _renamed(block.writes, into),
                         block.name_hint, _renamed(block.body, into),
                         _renamed(block.init, into), block.alloc_buffers, block.match_buffers,
                         block.annotations)
    cut = tirx.For(inner.loop_var, inner.min, tirx.const(head, inner.extent.ty.dtype),
                   inner.kind, s_tir.SBlockRealize(realize.iter_values, realize.predicate, first))
    return _nest(loops[:-1], cut)


def _tail(realize: s_tir.SBlockRealize, loops: list[tirx.For], head: int, partial
          ) -> tirx.Stmt:
    """A nest of its own (fresh loop and block vars) for ``realize``'s block over the
    reduction's last ``extent - head`` values, bound ``head + k``, its init the head's
    result (``partial``): the block stays the one writer of the reduction's output."""
    block, reduce, inner = realize.block, _reduce_var(realize.block), loops[-1]
    extent = int(inner.extent)
    itype = inner.extent.ty.dtype
    fresh = [tirx.Var(lp.loop_var.name, lp.extent.ty.dtype) for lp in loops]
    loop_pairs = [(lp.loop_var, v) for lp, v in zip(loops, fresh, strict=True)]
    block_pairs = [(iv.var, tirx.Var(iv.var.name, iv.dom.extent.ty.dtype))
                   for iv in block.iter_vars]
    iter_vars, values = [], []
    for iv, value, (_, new) in zip(block.iter_vars, realize.iter_values, block_pairs,
                                   strict=True):
        dom = iv.dom
        if iv.same_as(reduce):
            dtype = iv.dom.extent.ty.dtype
            dom = tvm.ir.Range.from_min_extent(tirx.const(head, dtype),
                                               tirx.const(extent - head, dtype))
            value = fresh[-1] + tirx.const(head, itype)
        else:
            value = _renamed(value, loop_pairs)
        iter_vars.append(tirx.IterVar(dom, new, iv.iter_type))
        values.append(value)
    out = block.writes[0]
    init = tirx.BufferStore(out.source, tirx.BufferLoad(partial, block.init.indices),
                            block.init.indices)
    reads = [*block.reads, *_renamed([out], [(out.source, partial)])]
    tail = s_tir.SBlock(iter_vars, _renamed(reads, block_pairs),
                        _renamed(block.writes, block_pairs), block.name_hint + "_tail",
                        _renamed(block.body, block_pairs), _renamed(init, block_pairs),
                        block.alloc_buffers, block.match_buffers, block.annotations)
    cut = tirx.For(fresh[-1], tirx.const(0, itype), tirx.const(extent - head, itype),
                   inner.kind, s_tir.SBlockRealize(values, True, tail))
    outer = [tirx.For(v, lp.min, lp.extent, lp.kind, tirx.Evaluate(0))
             for lp, v in zip(loops[:-1], fresh[:-1], strict=True)]
    return _nest(outer, cut)


def _loops_to(stmt: tirx.Stmt, name: str) -> tuple[list[tirx.For], s_tir.SBlockRealize] | None:
    """The perfect nest of loops from ``stmt`` down to block ``name``'s realize, if it is one."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    if (loops and isinstance(stmt, s_tir.SBlockRealize) and stmt.block.name_hint == name):
        return loops, stmt
    return None


def _plain(loops: list[tirx.For], realize: s_tir.SBlockRealize) -> bool:
    """Whether the nest is what the rewrite rebuilds faithfully: serial loops from 0 over
    constant extents, without annotations or thread bindings, down to a block without a
    predicate, allocations or matched buffers, whose reduction domain is constant."""
    block = realize.block
    reduce = _reduce_var(block)
    return (all(lp.kind == tirx.ForKind.SERIAL and not lp.annotations
                and lp.thread_binding is None and isinstance(lp.min, tirx.IntImm)
                and int(lp.min) == 0 and isinstance(lp.extent, tirx.IntImm) for lp in loops)
            and isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate) == 1
            and not block.alloc_buffers and not block.match_buffers
            and reduce is not None and isinstance(reduce.dom.min, tirx.IntImm)
            and int(reduce.dom.min) == 0 and isinstance(reduce.dom.extent, tirx.IntImm))


def split_tail(func: tirx.PrimFunc, name: str, lanes: int) -> tirx.PrimFunc | None:
    """``func`` with block ``name`` (a reduction alone in a root-level loop nest whose
    innermost loop binds its one reduction var directly, over a constant extent that is no
    whole number of ``lanes`` but at least two of them) split into a head of whole vectors
    and a tail block ``name + "_tail"`` in a nest of its own after it (module docstring);
    None where the block is not of that form."""
    root = func.body.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    for i, stmt in enumerate(stmts):
        found = _loops_to(stmt, name)
        if found is None:
            continue
        loops, realize = found
        if not _plain(loops, realize):
            return None
        block, reduce, inner = realize.block, _reduce_var(realize.block), loops[-1]
        if not isinstance(block.init, tirx.BufferStore) or len(block.writes) != 1:
            return None  # a tuple reduction (two outputs) or an init of another form
        extent = int(inner.extent)
        head = extent - extent % lanes
        bound = next(v for iv, v in zip(block.iter_vars, realize.iter_values, strict=True)
                     if iv.same_as(reduce))
        if (extent % lanes == 0 or head < 2 * lanes
                or not isinstance(bound, tirx.Var) or not bound.same_as(inner.loop_var)
                or int(reduce.dom.extent) != extent):
            return None
        out = block.writes[0].source
        partial = tirx.decl_buffer(out.shape, out.dtype, out.name + "_head", scope=out.scope())
        stmts[i:i + 1] = [_head(realize, loops, head, partial),
                          _tail(realize, loops, head, partial)]
        new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                                tirx.SeqStmt(stmts), root.init, [*root.alloc_buffers, partial],
                                root.match_buffers, root.annotations)
        body = func.body
        return func.with_body(s_tir.SBlockRealize(body.iter_values, body.predicate, new_root))
    return None


def whole_vector_rows(sch, chain: list[str], keys: int, lanes: int):
    """``sch`` with each row reduction of ``chain`` over whole vectors of keys: as it is where
    ``keys`` is a whole number of ``lanes``, else split into a head of whole vectors and a
    scalar tail (:func:`split_tail`; the tails join ``chain`` after their heads), on a new
    schedule of the rewritten function; and whether the rows are now whole vectors. A row
    shorter than two vectors, or a reduction of another form, keeps its scalar chains
    (``(sch, False)``): ``compute_at`` would drop the guard of a ragged partial's last vector,
    which then reads past the row."""
    if keys % lanes == 0:
        return sch, True
    func = sch.mod["main"]
    reductions = [n for n in chain if not is_spatial(sch.get(sch.get_sblock(n)))]
    for name in reductions:
        func = split_tail(func, name, lanes)
        if func is None:
            return sch, False
    for name in reductions:
        chain.insert(chain.index(name) + 1, name + "_tail")
    return s_tir.Schedule(func), True
