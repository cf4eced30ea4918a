"""Math library calls in TIR: which ones cost like an add, and what the others cost.

One table for two readers: the CPU rules (``_common.has_costly_call``: inlining a producer
that calls a transcendental would evaluate it again per load) and the cost models
(``graph``'s math work per kernel, which TVM's FLOP estimate counts as nothing). Names are
TIR op names without their namespace (``tirx.exp`` -> ``exp``).
"""

from __future__ import annotations

import functools

import tvm
import tvm_ffi
from tvm import tirx

# Math library calls, weighted by their cost relative to exp. TVM's FLOP estimate counts them
# as nothing, yet each costs many instructions where an add costs one: without them a sigmoid
# looked like a copy to the cost models. exp, log, tanh, sigmoid and erf are vectorized
# polynomials (``fast_math``); the rest stay scalar libm calls. A weight is an op's time beyond
# an add kernel's (its loads and stores) over exp's, single-op kernels with our schedules over
# 64K float32 elements (in L2), one core, median of 15 interleaved rounds, znver4 2026-12-07
# (``TVM_COSTFUSE_CALIBRATION=none python lab/math_cost.py --threads 1 --repeat 15``):
# vectorized exp 0.270 ns per element (add 0.087), sigmoid 1.13, silu 1.18, tanh 2.31,
# log 2.13, erf 1.69, gelu 2.02; libm exp 13.7, libm cos 29.6. The libm calls not timed are
# priced at a ratio to libm exp (sin as cos; tan, log2, log10, log1p and the inverse trig
# and inverse hyperbolic ~3, sinh and cosh ~2, pow ~4, exp2, exp10 and fmod ~1), times 13.7.
# What one exp costs is the host's (``TargetDesc.exp_seconds``). Timed in L2, not DRAM: over
# 1M elements every op reads about alike (the memory's time, which the cost model charges
# apart). sqrt (one instruction) is not priced here, though the inlining rule below still
# treats it as a call not to repeat.
MATH_COST = {"exp": 1.0, "exp2": 14.0, "exp10": 14.0, "sigmoid": 1.1, "tanh": 2.3, "sinh": 27.0,
             "cosh": 27.0, "erf": 1.7, "log": 2.1, "log2": 41.0, "log10": 41.0,
             "log1p": 41.0, "asinh": 41.0, "acosh": 41.0, "atanh": 41.0, "sin": 30.0,
             "cos": 30.0, "tan": 41.0, "asin": 41.0, "acos": 41.0, "atan": 41.0, "atan2": 41.0,
             "pow": 55.0, "fmod": 14.0}

# A vectorized call nested in another one (after inlining: ``tanh(log(sigmoid(x)))`` in one
# fused kernel) keeps its scalar libm call (``fast_math.MAX_NESTED``): it costs the libm / vector
# ratio measured above. Applied to every nested call, so a nested libm-only call (cos) is
# priced 13.7x high; no corpus kernel nests those.
NESTED_CALL_FACTOR = 13.7

# Calls that cost about as much as an add: inlining may repeat them freely. Every other call
# (exp, erf, tanh, log, sigmoid..., and sqrt, conservatively) is not repeated by inlining.
CHEAP_CALLS = frozenset(
    {"if_then_else", "fabs", "likely", "floor", "ceil", "round", "trunc", "nearbyint"})


def short_name(op_name: str) -> str:
    """``tirx.exp`` / ``prim.if_then_else`` -> ``exp`` / ``if_then_else``."""
    return op_name.rsplit(".", 1)[-1]


def _registered(op: tvm.ir.Op, attr: str) -> bool:
    try:
        return op.get_attr(attr) is not None
    except (AttributeError, KeyError, RuntimeError, TypeError, ValueError):
        return False


@functools.cache
def _needs_scalar(op: tvm.ir.Op) -> bool:
    """TVM marks ``op`` vectorizable (so ``VectorizeLoop`` widens it) but the LLVM backend has
    no lowering for it, only the default scalar libm call: a vector of it fails in codegen
    ("unknown intrinsic tirx.sinh"). Read from TVM's op registry, not a list of names."""
    return (_registered(op, "TVectorizable") and _registered(op, "default.FLowerIntrinsic")
            and not _registered(op, "llvm.FLowerIntrinsic")
            and not _registered(op, "llvm.FLegalize"))


def _calls_scalar_only(node) -> bool:
    found = []

    def visit(call):
        op = getattr(call, "op", None)
        if isinstance(op, tvm.ir.Op) and _needs_scalar(op):
            found.append(op)

    tvm_ffi.structural_walk(node, (tvm.ir.expr.Call, visit))
    return bool(found)


def _serial_if_scalar_only(loop: tirx.For):
    if loop.kind == tirx.ForKind.VECTORIZED and _calls_scalar_only(loop.body):
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                        loop.thread_binding, loop.annotations, loop.step, loop.span)
    return loop


@tirx.transform.prim_func_pass(opt_level=0, name="CostFuseScalarMathLoops")
def scalar_math_loops(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Every vectorized loop that calls a math function with no vector lowering on LLVM
    (sinh, cosh: :func:`_needs_scalar`) made serial again, so it builds (a scalar libm call
    per element) instead of failing. The rules vectorize without looking at the calls; this
    runs after them, before lowering."""
    body = tvm_ffi.structural_map(func.body, (tirx.For, _serial_if_scalar_only))
    return func if body.same_as(func.body) else func.with_body(body)
