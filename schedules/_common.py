"""Block analysis, inlining and the generic loop schedule shared by the CPU rules.

Predicates (``is_spatial``, ``expr_size``, ``vector_lanes``...) only read IR. The helpers that
take a ``Schedule`` mutate it through schedule primitives, whose own legality checks raise
instead of producing a wrong program; the rules catch that and fall through to the next rule.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.sym.analyzer import Analyzer

from ..targets.isa import num_cores, vector_lanes, vector_registers
from .conv_shape import _coefficient
from .math_calls import CHEAP_CALLS, short_name

__all__ = ["num_cores", "vector_lanes", "vector_registers"]  # re-exported for the rules

# Inlining substitutes the producer's expression at every load: a producer that reads its own
# input twice (gelu, silu) doubles per step. Above this many IR nodes in one block body we keep
# the intermediate in memory instead (compile time and code size explode otherwise).
MAX_INLINED_EXPR_NODES = 512

# Below this many iterations the cost of waking the thread pool (a few microseconds) exceeds
# the work; such loops stay serial.
MIN_PARALLEL_ITERS = 2048

# The same break-even for contractions, in multiply-adds: 2**18 FMAs is ~10 us on one AVX-512
# core, about what the pool's wake-up and join cost.
MIN_PARALLEL_FMAS = 1 << 18

# A GEMV reads each weight once: memory-bound, not bound by its multiply-adds. 768 x 256 fp32
# (196608 FMAs) took 8.6 us on one core, 5.3 on two; 768 x 128 4.0 / 3.2 (znver4, docs/log).
MIN_PARALLEL_BYTES = 1 << 18


def contraction_parallel(fmas: int, read_bytes: int) -> bool:
    """Does a contraction's nest pay for waking the pool? Its multiply-adds or the bytes it
    reads past the break-even (the rules and the cost model's launch term both ask)."""
    return fmas >= MIN_PARALLEL_FMAS or read_bytes >= MIN_PARALLEL_BYTES


# The parallel loop should have at least this many iterations per core so static chunking
# balances; with fewer outer rows the split-off vector-chunk loop joins the parallel loop.
PARALLEL_CHUNKS_PER_CORE = 4


def int_extent(sch: s_tir.Schedule, loop: LoopRV) -> int | None:
    """The loop's constant extent, or None when symbolic."""
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def largest_divisor(n: int, cap: int) -> int:
    """Largest d <= cap dividing n (1 at worst): tiles that divide exactly need no tail guard."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0:
            return d
    return 1


def vector_tile(extent: int, lanes: int, max_vectors: int = 1) -> int:
    """A tile for the vectorized loop: a power-of-two multiple of ``lanes``, or one register.

    Measured on znver4 (AVX-512): vector widths that are not a power-of-two number of registers
    (28 or 48 float32 lanes) are legalized badly by LLVM and ran 3-9x slower than 14 or 64
    lanes, and a non-dividing tile adds a guard that blocks vectorization. So: the largest
    ``lanes * 2**i <= max_vectors * lanes`` dividing ``extent``, else the largest divisor of
    ``extent`` that fits one register (7 of a 7x7 feature map: partly filled, still SIMD).
    """
    k = 1
    while k * 2 <= max_vectors:
        k *= 2
    while k >= 1:
        if extent % (k * lanes) == 0:
            return k * lanes
        k //= 2
    return largest_divisor(extent, lanes)


def is_spatial(block: tirx.SBlock) -> bool:
    """Every iter of the block is data-parallel (elementwise, broadcast, injective) and it has
    no ``T.init``.

    A reduction whose reduced axes all have extent 1 (a 1x1 depthwise conv, a sum over a unit
    dim, a matmul with K = 1) keeps its init after ``normalize_prim_func`` drops those axes,
    and its iter types then read all spatial. Inlining an epilogue into such a block puts it
    into the init and the update alike (``epi(epi(0) + x)``): a wrong result. The init is
    what makes it a reduction.
    """
    return block.init is None and all(
        iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)


def expr_size(node) -> int:
    """Number of IR nodes under ``node`` (a proxy for code size after inlining)."""
    count = 0

    def _visit(_):
        nonlocal count
        count += 1

    tvm_ffi.structural_walk(node, (tirx.Expr, _visit), order="post")
    return count


def has_costly_call(node) -> bool:
    """Whether ``node`` calls a transcendental (anything not in ``math_calls.CHEAP_CALLS``)."""
    found = False

    def _visit(call):
        nonlocal found
        op = getattr(call, "op", None)
        if op is not None and short_name(getattr(op, "name", "")) not in CHEAP_CALLS:
            found = True

    tvm_ffi.structural_walk(node, (tvm.ir.expr.Call, _visit), order="post")
    return found


def count_loads(node, buffer) -> int:
    """How many times ``node`` loads from ``buffer``."""
    count = 0

    def _visit(load):
        nonlocal count
        count += int(load.source.same_as(buffer))

    tvm_ffi.structural_walk(node, (tvm.ir.expr.TensorLoad, _visit), order="post")
    return count


def load_selections(node) -> tuple[bool, bool]:
    """Whether ``node`` picks between loads with ``if_then_else``: (a branch loads, in one
    selection both branches load). Vectorized, a lane-varying condition makes every branch's
    load and a blend per vector; a pad's guard against a constant loads in one branch only, a
    concat in both. One walk answers both questions."""
    some = both = False

    def _visit(call):
        nonlocal some, both
        op = getattr(call, "op", None)
        if op is not None and short_name(getattr(op, "name", "")) == "if_then_else":
            loading = []
            for arg in call.args[1:]:
                loads = []
                tvm_ffi.structural_walk(arg, (tvm.ir.expr.TensorLoad, loads.append))
                loading.append(bool(loads))
            some, both = some or any(loading), both or all(loading)

    tvm_ffi.structural_walk(node, (tvm.ir.expr.Call, _visit), order="post")
    return some, both


def selects_loads(node, both: bool = False) -> bool:
    """Whether ``node`` picks between loads with ``if_then_else`` (:func:`load_selections`);
    ``both``: only where both branches load (a concat, not a pad's guard)."""
    return load_selections(node)[1 if both else 0]


def _inline_recomputes(producer, consumers) -> bool:
    """Inlining would evaluate the producer's transcendental calls, or its selection between
    loads (:func:`selects_loads`), more than once per element.

    Then the intermediate is cheaper in memory (or, under a row loop, in cache) than recomputed:
    ``x * x`` of a tanh/exp chain, softmax's exp read by both the sum and the division, the
    concat a layer norm reads in each of its three passes (swin's patch merging), or the concat
    a max pool reads through overlapping windows (:func:`window_rereads`: inlined, squeezenet's
    128 x 55 x 55 concat + 3 x 3 / 2 pool ran as scalar selects, 330 us against 85 for the
    copy and the pool apart; znver4, 1 thread).
    """
    costly = has_costly_call(producer.body)
    selects, selects_both = load_selections(producer.body)
    if not (costly or selects):
        return False
    out = producer.writes[0].source
    if sum(count_loads(c.body, out) for c in consumers) > 1:
        return True
    # a pad's guard (a load or a constant) is cheap to repeat per tap; a concat's is not
    return (costly or selects_both) and any(
        window_rereads(c, out) for c in consumers)


def window_rereads(consumer: tirx.SBlock, buffer) -> bool:
    """Whether the reduction ``consumer`` reads one element of ``buffer`` from several outputs:
    along an index ``y * s + r * d`` (an output var ``y``, a reduction var ``r``), outputs
    ``|d| / g`` apart (``g = gcd(s, d)``) read the same element when ``r`` takes more than
    ``|s| / g`` values and ``y`` more than ``|d| / g`` (a 3 x 3 / 2 pooling window, a
    convolution's taps; not a 2 x 2 / 2 window, nor a reduction over a flattened axis)."""
    extents = {iv.var: int(iv.dom.extent) for iv in consumer.iter_vars
               if isinstance(iv.dom.extent, tirx.IntImm)}
    reduce = [iv.var for iv in consumer.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    spatial = [iv.var for iv in consumer.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    loads: list = []
    tvm_ffi.structural_walk(consumer.body, (tvm.ir.expr.TensorLoad, loads.append), order="post")
    for load in loads:
        if not load.source.same_as(buffer):
            continue
        for index in load.indices:
            for r in reduce:
                d = _coefficient(index, r)
                if not d or extents.get(r, 0) < 2:
                    continue
                for y in spatial:
                    s = _coefficient(index, y)
                    if not s:
                        continue
                    g = math.gcd(abs(s), abs(d))
                    if extents[r] > abs(s) // g and extents.get(y, 0) > abs(d) // g:
                        return True
    return False


def covers_output(consumer: tirx.SBlock, producer: tirx.SBlock) -> bool:
    """Whether ``consumer`` iterates once per element ``producer`` writes.

    ``reverse_compute_inline`` gives the producer the consumer's body but keeps the producer's
    own iteration domain. A consumer over fewer points (a slice that drops the last column of
    a convolution's output) then gets stored at indices it never had: TVM 0.27 does not refuse,
    and the kernel writes past its rows (wrong numbers, seen on a conv1d + slice + GELU group).
    """
    consumed = [iv.dom.extent for iv in consumer.iter_vars
                if iv.iter_type == tirx.IterVar.DataPar]
    written = list(producer.writes[0].source.shape)
    if all(isinstance(e, tirx.IntImm) for e in consumed + written):
        return math.prod(int(e) for e in consumed) == math.prod(int(e) for e in written)
    try:  # symbolic extents (a dynamic batch): equal only if the analyzer proves it
        as_i64 = [[tirx.Cast("int64", e) for e in side] for side in (consumed, written)]
        return Analyzer().can_prove_equal(math.prod(as_i64[0]), math.prod(as_i64[1]))
    except (TypeError, ValueError, RuntimeError):
        return False


def inline_epilogue(sch: s_tir.Schedule, producer) -> bool:
    """Inline the one consumer of ``producer`` (a contraction's write-back or crop) into it, so
    the epilogue is computed from registers; False where it stays a pass of its own.

    Only a sole consumer: with two (an attention output read by an add and by a subtract),
    inlining the first rewrites ``producer`` to store the first epilogue's tensor, and the
    second is left reading a buffer nothing defines any more. TVM 0.27's
    ``reverse_compute_inline`` does not refuse; the build fails ("used before its
    definition"). Nor a consumer over fewer points than ``producer`` writes
    (:func:`covers_output`), nor a ``producer`` that is still a reduction (its init would get
    the epilogue too, :func:`is_spatial`).
    """
    consumers = sch.get_consumers(producer)
    if len(consumers) != 1 or not is_spatial(sch.get(producer)):
        return False
    if not covers_output(sch.get(consumers[0]), sch.get(producer)):
        return False
    try:
        sch.reverse_compute_inline(consumers[0])
    except s_tir.ScheduleError:
        return False
    return True


def simplify_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each block's floor divisions and remainders simplified over the block's
    iteration domain.

    A legalized reshape reads ``x[(j // 197 + i) // 197 % 12, (j // 197 + i) % 197, j % 197]``
    for ``j < 197``: every ``//`` is 0 and every ``%`` the identity, but once the row is split
    into vectors TIR no longer sees that, and each vector load becomes a gather (ViT's attention
    reshape ran at 0.2 of the stream's bandwidth). Simplified first, the loads are contiguous.
    """

    def simplified(block):
        analyzer = Analyzer()
        for iv in block.iter_vars:
            analyzer.bind(iv.var, tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
        return tvm_ffi.structural_map(
            block.body, ((tirx.FloorDiv, tirx.FloorMod), analyzer.simplify))

    return map_block_bodies(func, simplified)


def map_block_bodies(func: tirx.PrimFunc, rewrite) -> tirx.PrimFunc:
    """``func`` with each block's body replaced by ``rewrite(block)`` (the block itself, and
    ``func``, kept where nothing changed)."""

    def per_block(block):
        body = rewrite(block)
        if body.same_as(block.body):
            return block
        return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                            block.init, block.alloc_buffers, block.match_buffers,
                            block.annotations)

    body = tvm_ffi.structural_map(func.body, (s_tir.SBlock, per_block))
    return func if body.same_as(func.body) else func.with_body(body)


def root_blocks(sch: s_tir.Schedule) -> list[SBlockRV]:
    """The blocks directly under the root block, in program order."""
    body = sch.mod["main"].body
    if not isinstance(body, s_tir.SBlockRealize):
        return []
    return list(sch.get_child_blocks(sch.get_sblock(body.block.name_hint)))


def uses(expr, var) -> bool:
    """Whether ``expr`` mentions ``var``."""
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Var, lambda v: found.append(v.same_as(var))))
    return any(found)


def reads_transposed(consumer: tirx.SBlock, buffer) -> bool:
    """Whether ``consumer`` reads ``buffer`` along another axis than the one it stores along:
    its store's last index is a block var that some load of ``buffer`` uses, but not in its
    last index (a transpose, ``[b, h, d, s] = x[b, h, s, d]``). Vectorized over the store,
    every such load is a gather."""
    body = consumer.body
    if not isinstance(body, tirx.BufferStore) or not body.indices:
        return False
    last = body.indices[-1]
    if not isinstance(last, tirx.Var):
        return False
    loads = []
    tvm_ffi.structural_walk(body.value, (tvm.ir.expr.TensorLoad, loads.append), order="post")
    return any(ld.source.same_as(buffer) and not uses(ld.indices[-1], last)
               and any(uses(i, last) for i in ld.indices[:-1]) for ld in loads)


def inline_spatial(sch: s_tir.Schedule, protect: set[str] | None = None,
                   materialize_transposed: bool = False) -> None:
    """Inline every spatial intermediate into its consumers, then epilogues into producers.

    Blocks named in ``protect`` are never inlined into (a contraction reads each input element
    many times, so inlining a producer into it would recompute it K times; the producer stays
    materialized and is streamed once).

    ``materialize_transposed``: a producer that reads more than one tensor is not inlined into
    a consumer that reads it transposed (:func:`reads_transposed`), nor that consumer into it.
    Inlined, each of its loads becomes a gather (llama's rotary embedding feeding K^T's
    transpose: five per element, 258 us against 154 us for the two kernels apart); kept, it
    runs as a contiguous vector nest and the transpose gathers once.
    """
    protect = protect or set()

    def transposed_edge(producer: tirx.SBlock, consumer: tirx.SBlock) -> bool:
        return (materialize_transposed and len(producer.reads) > 1
                and reads_transposed(consumer, producer.writes[0].source))

    changed = True
    while changed:
        changed = False
        for block in root_blocks(sch):
            stmt = sch.get(block)
            if not is_spatial(stmt) or stmt.name_hint in protect:
                continue
            consumers = [sch.get(c) for c in sch.get_consumers(block)]
            if not consumers or any(c.name_hint in protect for c in consumers):
                continue
            size = expr_size(stmt.body)
            if any(expr_size(c.body) + size > MAX_INLINED_EXPR_NODES for c in consumers):
                continue
            if len(stmt.writes) != 1 or _inline_recomputes(stmt, consumers):
                continue
            if any(transposed_edge(stmt, c) for c in consumers):
                continue
            try:
                sch.compute_inline(block)
                changed = True
            except s_tir.ScheduleError:
                continue
        for block in root_blocks(sch):
            stmt = sch.get(block)
            if not is_spatial(stmt) or stmt.name_hint in protect:
                continue
            producer_blocks = sch.get_producers(block)
            producers = [sch.get(p) for p in producer_blocks]
            if len(producers) != 1 or not is_spatial(producers[0]):
                continue
            if len(sch.get_consumers(producer_blocks[0])) != 1:
                # The producer's tensor has other readers: inlining this block into it would
                # overwrite that tensor's only definition. TVM 0.27's reverse_compute_inline
                # does not refuse, and lowering then fails ("used before its definition"; a
                # conv + BN + ReLU + residual-add group of synth-9).
                continue
            if producers[0].name_hint in protect:
                continue
            if expr_size(stmt.body) + expr_size(producers[0].body) > MAX_INLINED_EXPR_NODES:
                continue
            if len(producers[0].writes) != 1 or _inline_recomputes(producers[0], [stmt]):
                continue
            if not covers_output(stmt, producers[0]) or transposed_edge(producers[0], stmt):
                continue
            try:
                sch.reverse_compute_inline(block)
                changed = True
            except s_tir.ScheduleError:
                continue
