"""One column axis for an einsum whose output and streamed operand share their trailing axes.

A 1x1 convolution in NCHW, ``C[n, f, h, w] += W[f, c] * X[n, c, h, w]``, is a GEMM whose
columns are the ``h * w`` pixels: both ``C`` and ``X`` hold them as one contiguous run per
channel. Tiled over ``w`` alone, the micro-kernel's column tile must fit a row of the image:
112, 56, 28 or 14 pixels are not multiples of 64 (or 32), so ``pad_einsum`` copied ``X`` into
padded rows and the write-back stored 12-50 % of each row tile under a mask (a 16 -> 96
channel layer at 112 x 112: 0.23 of the FMA peak). Merged, the column extent is ``h * w``
(12544 = 196 x 64) and the tile reads ``X`` and writes ``C`` in place, in whole vectors.

The merge rewrites the block's iteration space (``transform_block_layout``): the block then
reads ``X[.., hw // w, hw % w]``, which flattens back to one contiguous address. Buffers the
kernel owns (the register tile) are relaid to the merged axis as well, so the write-back's
region under the tile loop is exact.
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx

__all__ = ["inline_copy", "merge_block", "merge_buffer", "mergeable"]


def _var_at(indices, pos: int):
    if len(indices) < -pos:
        return None
    x = indices[pos]
    return x if isinstance(x, tirx.Var) else None


def _ext(x) -> int | None:
    return int(x) if isinstance(x, tirx.IntImm) else None


def mergeable(block: tirx.SBlock, store, shape) -> int | None:
    """The extent of the axis that can merge into the columns of the einsum ``shape`` (an
    ``gemm.Einsum``) whose update is ``store``; None where there is none.

    The axis must be the second-to-last index of both the output and the streamed operand,
    with the columns last in both at the full width of their buffers, and neither the row nor
    an index of the other operand (then it is a batch or row axis, not pixels).
    """
    col = shape.col
    streamed = shape.streamed
    outer = _var_at(store.indices, -2)
    last, second = _var_at(streamed.indices, -1), _var_at(streamed.indices, -2)
    if outer is None or last is None or second is None:
        return None
    if not (last.same_as(col) and second.same_as(outer)):
        return None
    if shape.row is not None and outer.same_as(shape.row):
        return None
    if any(isinstance(i, tirx.Var) and i.same_as(outer) for i in shape.other.indices):
        return None
    kinds = {iv.var: (iv.iter_type, _ext(iv.dom.extent), _ext(iv.dom.min))
             for iv in block.iter_vars}
    kind, extent, start = kinds[outer]
    width = kinds[col][1]
    if kind != tirx.IterVar.DataPar or extent is None or start != 0 or width is None:
        return None
    for buffer in (store.buffer, streamed.source):
        if [_ext(s) for s in buffer.shape[-2:]] != [extent, width]:
            return None  # a slice of a larger buffer: the merged run is not contiguous
    return extent


def _positions(block: tirx.SBlock, store) -> tuple[int, int] | None:
    """Positions among ``block``'s iter vars of the vars indexing the last two output axes."""
    pos = []
    for x in (store.indices[-2], store.indices[-1]):
        if not isinstance(x, tirx.Var):
            return None
        hits = [i for i, iv in enumerate(block.iter_vars) if iv.var.same_as(x)]
        if not hits:
            return None
        pos.append(hits[0])
    return (pos[0], pos[1]) if pos[0] < pos[1] else None


def merge_block(sch: s_tir.Schedule, block, width: int) -> tuple[int, int] | None:
    """Merge the iter vars of ``block`` that index its output's last two axes (the second
    ``width`` wide) into one; (the old position of the first, removed, the new position of the
    merged var), or None if they are not plain, ordered iter vars."""
    stmt = sch.get(block)
    store = stmt.body
    if not isinstance(store, tirx.BufferStore):
        return None
    pos = _positions(stmt, store)
    if pos is None:
        return None
    ph, pw = pos

    def mapping(*v):
        out = [x for i, x in enumerate(v) if i != ph]
        out[pw - 1] = v[ph] * width + v[pw]
        return tuple(out)

    sch.transform_block_layout(block, tirx.IndexMap.from_func(mapping, ndim=len(stmt.iter_vars)))
    return ph, pw - 1


def merge_buffer(sch: s_tir.Schedule, block, width: int) -> None:
    """Relay the buffer ``block`` writes so that its last two axes are one."""
    ndim = len(sch.get(block).writes[0].source.shape)

    def mapping(*i):
        return (*i[:-2], i[-2] * width + i[-1])

    sch.transform_layout(block, ("write", 0), tirx.IndexMap.from_func(mapping, ndim=ndim))


def inline_copy(sch: s_tir.Schedule, block, buffer) -> None:
    """Inline the producer of ``buffer`` into ``block`` where it is a plain copy (the
    zero-width ``pad`` a legalized 1x1 convolution reads its input through)."""
    for producer in sch.get_producers(block):
        stmt = sch.get(producer)
        if (stmt.writes[0].source.same_as(buffer) and isinstance(stmt.body, tirx.BufferStore)
                and isinstance(stmt.body.value, ir.TensorLoad)):
            try:
                sch.compute_inline(producer)
            except s_tir.ScheduleError:
                pass
