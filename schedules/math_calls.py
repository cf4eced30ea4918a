"""Math library calls in TIR: which ones cost like an add, and what the others cost.

One table for two readers: the CPU rules (``_common.has_costly_call``: inlining a producer
that calls a transcendental would evaluate it again per load) and the cost models
(``graph``'s math work per kernel, which TVM's FLOP estimate counts as nothing). Names are
TIR op names without their namespace (``tirx.exp`` -> ``exp``).
"""

from __future__ import annotations

# Math library calls, weighted by their cost relative to exp. TVM's FLOP estimate counts them
# as nothing, yet each costs many instructions where an add costs one: without them a sigmoid
# looked like a copy to the cost models. Over 1M float32 elements on this host (single-op
# kernels in tuning_logs/llvm-znver4/groups, machine-wide time per call): exp, sigmoid and silu
# 2.0-2.3 ns, tanh 4.4, log 6.4, cos 6.9, gelu (erf and four multiply-adds) 4.9-7.8; an add
# kernel's whole time is 0.2 ns per element. sqrt (one instruction) is not priced here, though
# the inlining rule below still treats it as a call not to repeat.
MATH_COST = {"exp": 1.0, "exp2": 1.0, "exp10": 1.0, "sigmoid": 1.0, "tanh": 2.0, "sinh": 2.0,
             "cosh": 2.0, "erf": 3.0, "log": 3.0, "log2": 3.0, "log10": 3.0, "log1p": 3.0,
             "asinh": 3.0, "acosh": 3.0, "atanh": 3.0, "sin": 3.5, "cos": 3.5, "tan": 3.5,
             "asin": 3.5, "acos": 3.5, "atan": 3.5, "atan2": 3.5, "pow": 4.0, "fmod": 1.0}

# Calls that cost about as much as an add: inlining may repeat them freely. Every other call
# (exp, erf, tanh, log, sigmoid..., and sqrt, conservatively) is not repeated by inlining.
CHEAP_CALLS = frozenset(
    {"if_then_else", "fabs", "likely", "floor", "ceil", "round", "trunc", "nearbyint"})


def short_name(op_name: str) -> str:
    """``tirx.exp`` / ``prim.if_then_else`` -> ``exp`` / ``if_then_else``."""
    return op_name.rsplit(".", 1)[-1]
