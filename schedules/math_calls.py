"""Math library calls in TIR: which ones cost like an add, and what the others cost.

One table for two readers: the CPU rules (``_common.has_costly_call``: inlining a producer
that calls a transcendental would evaluate it again per load) and the cost models
(``graph``'s math work per kernel, which TVM's FLOP estimate counts as nothing). Names are
TIR op names without their namespace (``tirx.exp`` -> ``exp``).
"""

from __future__ import annotations

# Math library calls, weighted by their cost relative to exp. TVM's FLOP estimate counts them
# as nothing, yet each costs many instructions where an add costs one: without them a sigmoid
# looked like a copy to the cost models. exp, log, tanh, sigmoid and erf are vectorized
# polynomials (``fast_math``); the rest stay scalar libm calls. Measured 2026-12-01 on the
# emeraldrapids host, 2 threads, load average 5.6 (shared), 1M float32 elements, single-op
# kernels with our schedules, median machine-wide ns per element
# (``TVM_COSTFUSE_CALIBRATION=none python scripts/research/math_cost.py --repeat 15``):
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
