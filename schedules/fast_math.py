"""Vectorizable float32 exp, log, tanh, sigmoid and erf in TIR, and the pass that uses them.

TVM lowers ``tirx.exp`` to ``llvm.exp.f32``; LLVM has no vector libm to call, so inside a
vectorized loop it scalarizes the intrinsic into one ``expf`` call per lane (``erf`` is a plain
``erff`` call), and an elementwise chain with math ran ~7.5x slower than PyTorch. The
expressions below use only what LLVM vectorizes on any x86-64 ISA: multiply-adds, ``floor``,
compares and selects, integer shifts and bit casts. Through them gelu (erf and tanh forms),
silu (sigmoid), softplus (exp, log) and softmax (exp) vectorize as well.

Accuracy, float32 against a float64 reference, measured by ``tests/test_fast_math.py`` on this
host (Xeon, emeraldrapids, AVX-512) over 2.1M points of a dense range plus tails and special
values; the test asserts the bound in brackets:

- exp: Cody-Waite reduction by ln 2 and Cephes' degree-5 polynomial; 2^n applied as two
  factors so results down to the smallest subnormal and up to overflow round once.
  1.01 ulp (<= 1.5).
- log: mantissa in [sqrt(1/2), sqrt(2)) and Cephes' degree-8 polynomial; subnormal inputs are
  scaled by 2^23 first. 0.79 ulp (<= 1.5).
- tanh: Cephes' odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above.
  1.30 ulp (<= 2).
- sigmoid: 1 / (1 + exp(-x)) as a ratio of two in-range terms (:func:`fast_sigmoid`), so
  neither tail cancels or overflows. 2.48 ulp (<= 3; znver4).
- erf: x + x P(x^2) below |x| = 1, 1 - Q(|x| - 2.46) up to 3.92 (above, erf rounds to 1),
  P (degree 5) and Q (degree 12) fitted by ``lab/fit_erf.py``. 1.56 ulp (<= 2),
  the same in AVX2 (haswell) code, measured on a Xeon (rocketlake).

Special values: exp(+-inf) = inf / 0, overflow -> inf, underflow -> 0; log(0) = -inf,
log(x < 0) = nan, log(inf) = inf; tanh and erf saturate to +-1, sigmoid to 0 and 1; nan
propagates through all five.

Only scalar float32 calls are rewritten: the pass runs right after scheduling, before
``VectorizeLoop`` widens the expressions, and the polynomials are fitted to float32 precision.
float64 would need longer polynomials for its 2^-52; float16 kernels keep the exact call as
well (LLVM promotes them to float32 libm), as do the math calls not listed here. A call nested
in another rewritten call (the fused elementwise_chain's sigmoid -> log -> tanh...) also keeps
its library call: see :data:`MAX_NESTED` and docs/log/2026-12-01a.md for what that costs.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import tirx

F32 = "float32"

_LOG2E = 1.44269504088896341
# ln 2 split so that n * _LN2_HI is exact for |n| < 2**15 (Cephes' C1, C2).
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# exp's input range: above, the result is inf; below, 0. Both ends keep n within [-150, 128],
# where 2^(n/2) and 2^(n - n/2) are normal floats.
_EXP_HI = 89.0
_EXP_LO = -104.0
# Cephes expf: exp(r) = 1 + r + r^2 P(r) on |r| <= ln(2) / 2, lowest coefficient first.
_EXP_P = (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
          1.3981999507e-3, 1.9875691500e-4)
# Cephes logf: log(1 + m) = m - m^2 / 2 + m^3 P(m) on m in [sqrt(1/2) - 1, sqrt(2) - 1].
_LOG_P = (3.3333331174e-1, -2.4999993993e-1, 2.0000714765e-1, -1.6668057665e-1,
          1.4249322787e-1, -1.2420140846e-1, 1.1676998740e-1, -1.1514610310e-1,
          7.0376836292e-2)
_SQRT_HALF = 0.707106781186547524
_FLT_MIN = 1.17549435e-38  # smallest normal float32: below, log scales its input by 2^23
# Cephes tanhf: tanh(x) = x + x z P(z), z = x^2, for |x| < 0.625.
_TANH_SMALL = 0.625
_TANH_P = (-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2,
           -5.70498872745e-3)
# erf(x) = x + x P(x^2) for |x| < _ERF_SPLIT, 1 - Q(|x| - _ERF_MID) up to _ERF_ONE; P fits
# erf(x)/x - 1 in relative error, Q fits erfc in absolute error (fit_erf.py).
_ERF_SPLIT = 1.0
_ERF_MID = 2.46
_ERF_ONE = 3.92  # erfc(3.92) = 2.96e-8 < 2^-25: erf rounds to 1 from here on
_ERF_P = (0.12837912142276764, -0.37612324953079224, 0.11280179768800735,
          -0.02671130932867527, 0.004917548969388008, -0.0005631413077935576)
_ERF_Q = (0.0005033267661929131, -0.0026561934500932693, 0.006535762920975685,
          -0.009832995012402534, 0.009904828853905201, -0.006797656416893005,
          0.002963505918160081, -0.00046216545160859823, -0.0003911283565685153,
          0.00030167511431500316, -5.1667815569089726e-05, -2.5420515157748014e-05,
          9.124863936449401e-06)


def _f(value: float) -> tirx.PrimExpr:
    return tirx.const(value, F32)


def _i(value: int) -> tirx.PrimExpr:
    return tirx.const(value, "int32")


def _let(value: tirx.PrimExpr, body: Callable[[tirx.Var], tirx.PrimExpr],
         name: str) -> tirx.PrimExpr:
    """``body(v)`` with ``v`` bound to ``value`` once: the expressions use their input many
    times, and a Let keeps it one computation (and one vector register) however it is
    lowered."""
    var = tirx.Var(name, value.ty)
    return tirx.Let(var, value, body(var))


def _horner(t: tirx.PrimExpr, coeffs: tuple[float, ...]) -> tirx.PrimExpr:
    """sum(c_k t^k), lowest coefficient first."""
    acc = _f(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * t + _f(c)
    return acc


def _keep_nan(x: tirx.PrimExpr, value: tirx.PrimExpr) -> tirx.PrimExpr:
    """``x`` where it is NaN, else ``value``. NaN is tested on the bits (magnitude above
    infinity's): TVM's VectorizeLoop cannot widen ``isnan`` and scalarizes the whole loop
    around it (LLVM then re-vectorizes it at 256 bits on AVX-512 at best), and ``x != x``
    is folded to false by TIR's simplifier."""
    magnitude = tirx.reinterpret("int32", x) & _i(0x7FFFFFFF)
    return tirx.Select(magnitude > _i(0x7F800000), x, value)


def _copysign(magnitude: tirx.PrimExpr, sign: tirx.PrimExpr) -> tirx.PrimExpr:
    """``magnitude`` (>= 0) with the sign bit of ``sign``, on the bits: TVM's VectorizeLoop
    cannot widen ``copysign`` either and scalarizes the loop around it."""
    bits = tirx.reinterpret("int32", magnitude) | (
        tirx.reinterpret("int32", sign) & _i(-(1 << 31)))
    return tirx.reinterpret(F32, bits)


def _pow2(n: tirx.PrimExpr) -> tirx.PrimExpr:
    """2^n for an int32 n in [-126, 127], built from its exponent bits."""
    return tirx.reinterpret(F32, tirx.shift_left(n + _i(127), _i(23)))


def fast_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp(x) for float32, <= 1.5 ulp (see the module docstring)."""
    def body(x):
        xc = tirx.Max(tirx.Min(x, _f(_EXP_HI)), _f(_EXP_LO))
        return _let(tirx.floor(xc * _f(_LOG2E) + _f(0.5)), lambda n: _let(
            xc - n * _f(_LN2_HI) - n * _f(_LN2_LO), lambda r: _let(
                tirx.Cast("int32", n), lambda k: _scaled(r, k), "k"), "r"), "n")

    def _scaled(r, k):
        y = _horner(r, _EXP_P) * r * r + r + _f(1.0)
        half = tirx.shift_right(k, _i(1))
        return y * _pow2(half) * _pow2(k - half)

    return _let(x, lambda v: _keep_nan(v, body(v)), "x")


def fast_log(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """log(x) for float32, <= 1.5 ulp (see the module docstring)."""
    def body(x):
        sub = x < _f(_FLT_MIN)
        bits = tirx.reinterpret("int32", tirx.Select(sub, x * _f(8388608.0), x))
        e = tirx.Cast(F32, tirx.shift_right(bits, _i(23)) - _i(126)) \
            - tirx.Select(sub, _f(23.0), _f(0.0))
        mant = tirx.reinterpret(F32, tirx.bitwise_or(tirx.bitwise_and(bits, _i(0x007FFFFF)),
                                                     _i(0x3F000000)))
        return _let(mant, lambda m: _let(
            tirx.Select(m < _f(_SQRT_HALF), e - _f(1.0), e), lambda ex: _let(
                tirx.Select(m < _f(_SQRT_HALF), m + m, m) - _f(1.0), lambda t: _poly(t, ex),
                "t"), "e"), "m")

    def _poly(t, ex):
        def with_z(z):
            y = t * z * _horner(t, _LOG_P) + ex * _f(_LN2_LO) - _f(0.5) * z
            return t + y + ex * _f(_LN2_HI)
        return _let(t * t, with_z, "z")

    def special(x):
        inf = _f(float("inf"))
        out = tirx.Select(x == _f(0.0), -inf, body(x))
        out = tirx.Select(x < _f(0.0), _f(float("nan")), out)
        return _keep_nan(x, tirx.Select(x == inf, inf, out))

    return _let(x, special, "x")


def fast_tanh(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """tanh(x) for float32, <= 2 ulp (see the module docstring)."""
    def body(a):
        small = _let(a * a, lambda z: a + a * z * _horner(z, _TANH_P), "z")
        large = _f(1.0) - _f(2.0) / (fast_exp(a * _f(2.0)) + _f(1.0))
        return tirx.Select(a < _f(_TANH_SMALL), small, large)

    return _let(x, lambda v: _keep_nan(
        v, _copysign(_let(tirx.abs(v), body, "a"), v)), "x")


def fast_sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """1 / (1 + exp(-x)) for float32, <= 3 ulp (see the module docstring).

    ``exp(-x) = y * 2^k`` is not built: for ``x`` below -88.7 it overflows while the result
    is still a subnormal worth keeping. With ``k = h + (k - h)``, ``h = k >> 1``, the sigmoid
    is ``2^-h / (2^-h + y * 2^(k-h))``: both terms stay in range over the whole clamp, the
    numerator is exact and one division rounds. It needs no ``|x|``, sign select or second
    product, as ``e / (1 + e)`` with ``e = exp(-|x|)`` did: ``x * sigmoid(x)`` over 64K
    elements in L2 ran 0.36 ns per element against 0.415 (znver4, 16 lanes, 1 thread). A
    rational approximation (ONNX Runtime's, Eigen's) ran 0.29 but is only absolutely accurate
    (1e-7): thousands of ulp in the negative tail, where SiLU's small outputs live."""
    def body(x):
        xc = tirx.Max(tirx.Min(-x, _f(-_EXP_LO)), _f(-_EXP_HI))
        return _let(tirx.floor(xc * _f(_LOG2E) + _f(0.5)), lambda n: _let(
            xc - n * _f(_LN2_HI) - n * _f(_LN2_LO), lambda r: _let(
                tirx.Cast("int32", n), lambda k: _ratio(r, k), "k"), "r"), "n")

    def _ratio(r, k):
        y = _horner(r, _EXP_P) * r * r + r + _f(1.0)
        return _let(tirx.shift_right(k, _i(1)), lambda h: _let(
            _pow2(_i(0) - h), lambda p: p / (p + y * _pow2(k - h)), "p"), "h")

    return _let(x, lambda v: _keep_nan(v, body(v)), "x")


def fast_erf(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """erf(x) for float32, <= 2 ulp (see the module docstring).

    Both branches are computed for every lane (a select), so their cost adds: the far one is
    a plain polynomial in erfc's absolute error, where the fixed ulp of ``1 - erfc`` asks
    for no relative accuracy, not an exp of ``log(erfc)``. The selects test ``|x| >= bound``
    so that a NaN fails both and takes the near branch, which propagates it."""
    def body(a):
        near = a + a * _horner(a * a, _ERF_P)
        far = _f(1.0) - _horner(a - _f(_ERF_MID), _ERF_Q)
        return tirx.Select(a >= _f(_ERF_ONE), _f(1.0),
                           tirx.Select(a >= _f(_ERF_SPLIT), far, near))

    return _let(x, lambda v: _copysign(_let(tirx.abs(v), body, "a"), v), "x")


# TIR op name -> its float32 expression.
FAST_MATH = {"tirx.exp": fast_exp, "tirx.log": fast_log, "tirx.tanh": fast_tanh,
             "tirx.sigmoid": fast_sigmoid, "tirx.erf": fast_erf}


# How many rewritten calls may nest in one expression. TVM's LLVM codegen binds every Let into
# its arithmetic analyzer, which simplifies each bound value with the earlier bindings
# substituted: the work grows as (uses of the input per expression) ^ depth. Measured on this
# host (2 cores): a chain of 4 fast exps took over 100 s to compile; the fused zoo
# elementwise_chain took 10.6 s with 2 levels and 0.3 s with 1. Deeper calls keep the scalar
# library call.
MAX_NESTED = 1
_TAG = "fastmath"


def _nesting(expr) -> int:
    """How many rewritten calls nest in ``expr`` (read from the tags on their input Lets)."""
    depth = [0]

    def visit(let):
        name = str(let.var.name)
        if name.startswith(_TAG):
            depth[0] = max(depth[0], int(name[len(_TAG):]))

    tvm_ffi.structural_walk(expr, (tirx.Let, visit))
    return depth[0]


def is_integer_power(call) -> bool:
    """A float ``pow(x, n)`` with a constant n of 2, 3 or 4 (:func:`integer_power`)."""
    if getattr(call.op, "name", None) != "tirx.pow" or len(call.args) != 2:
        return False
    exponent = call.args[1]
    return (isinstance(exponent, tirx.FloatImm) and exponent.value in (2.0, 3.0, 4.0)
            and "float" in str(call.ty))


def integer_power(call) -> tirx.PrimExpr | None:
    """``pow(x, n)`` for a constant n in 2..4 as n - 1 multiplies; None for any other call.

    GPT-2's GELU (``x + 0.044715 * x ** 3``) legalizes to ``pow(x, 3.0)``, a scalar libm call
    per element that LLVM keeps: measured 7.4 ms for 393K elements of the fused GELU, 5x
    PyTorch. The product rounds once per multiply where pow rounds once (a few ulp at most).
    """
    if not is_integer_power(call):
        return None
    exponent, x = call.args[1], call.args[0]

    def product(v):
        out = v
        for _ in range(int(exponent.value) - 1):
            out = out * v
        return out

    if isinstance(x, tirx.Var | tvm.ir.expr.TensorLoad):
        return product(x)
    return _let(x, product, "powbase")


def rewrite_calls(stmt):
    """``stmt`` with every scalar float32 call in :data:`FAST_MATH` replaced by its expression,
    up to :data:`MAX_NESTED` deep, and small integer powers by multiplies."""
    def visit(call):
        if (power := integer_power(call)) is not None:
            return power
        name = getattr(call.op, "name", None)
        if name not in FAST_MATH or str(call.ty) != F32 or len(call.args) != 1:
            return call
        depth = _nesting(call.args[0]) + 1
        if depth > MAX_NESTED:
            return call
        tag = tirx.Var(f"{_TAG}{depth}", F32)
        return tirx.Let(tag, call.args[0], FAST_MATH[name](tag))

    return tvm_ffi.structural_map(stmt, (tvm.ir.expr.Call, visit))


@tirx.transform.prim_func_pass(opt_level=0, name="CostFuseFastMath")
def fast_math_pass(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Every PrimFunc's exp/log/tanh/sigmoid/erf (float32) as vectorizable expressions.

    Runs after the CPU schedule rules (they read the calls to decide what to inline, and
    expanded bodies would exceed their expression-size limits) and before lowering, whose
    ``VectorizeLoop`` turns the scalar expressions into vector ones.
    """
    body = rewrite_calls(func.body)
    return func if body.same_as(func.body) else func.with_body(body)
