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
# polynomials (``fast_math``); the rest stay scalar libm calls. Measured 2026-12-01 on the
# emeraldrapids host, 2 threads, load average 5.6 (shared), 1M float32 elements, single-op
# kernels with our schedules, median machine-wide ns per element
# (``TVM_COSTFUSE_CALIBRATION=none python lab/math_cost.py --repeat 15``):
# vectorized exp 0.87, log 0.98, sigmoid 1.11, silu 1.08, tanh 1.33, erf 2.04, gelu 2.26,
# gelu_tanh 1.81; libm cos 15.7 and exp 5.3 (libm / vector exp: 6.1x); an add kernel's whole
# time is 0.49. Weights are whole-kernel ratios to exp, as before; the libm calls not measured
# keep their earlier ratio to libm exp, times 6.1. sqrt (one instruction) is not priced here,
# though the inlining rule below still treats it as a call not to repeat. erf was re-measured
# after its far branch became a polynomial (no exp), on the rocketlake host, 2 threads, load
# 2.5 (shared), same command: exp 0.358, erf 0.367, gelu 0.412 ns per element.
MATH_COST = {"exp": 1.0, "exp2": 6.0, "exp10": 6.0, "sigmoid": 1.3, "tanh": 1.5, "sinh": 12.0,
             "cosh": 12.0, "erf": 1.0, "log": 1.1, "log2": 18.0, "log10": 18.0,
             "log1p": 18.0, "asinh": 18.0, "acosh": 18.0, "atanh": 18.0, "sin": 18.0,
             "cos": 18.0, "tan": 18.0, "asin": 18.0, "acos": 18.0, "atan": 18.0, "atan2": 18.0,
             "pow": 24.0, "fmod": 6.0}

# A vectorized call nested in another one (after inlining: ``tanh(log(sigmoid(x)))`` in one
# fused kernel) keeps its scalar libm call (``fast_math.MAX_NESTED``): it costs the libm / vector
# ratio measured above. Applied to every nested call, so a nested libm-only call (cos) is
# priced 6.1x high; no corpus kernel nests those.
NESTED_CALL_FACTOR = 6.1

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
