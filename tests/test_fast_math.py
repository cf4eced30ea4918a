"""Vectorized float32 math (``schedules/fast_math``): accuracy, vector code, model numerics.

Accuracy runs on this host against a float64 reference, in ulp of the float32 result (a result
that rounds to the reference's own float32 counts 0). Structural checks build for explicit ISAs
(AVX2 and AVX-512) and read the assembly: no scalar libm call may remain for the rewritten
ops. Model numerics compare strategy builds, which all get the rewrite, with the unscheduled
build, which keeps the libm calls.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from conftest import reference
from scipy import special
from tvm import relax, s_tir, te, tirx
from tvm.script import relax as R
from tvm_costfuse.schedules.fast_math import fast_math_pass

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import assert_close, run
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target

TARGET = host_target(2)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})

# op -> (TIR op, float64 reference, ulp bound stated in the module docstring)
OPS = {
    "exp": (tirx.exp, np.exp, 1.5),
    "log": (tirx.log, np.log, 1.5),
    "tanh": (tirx.tanh, np.tanh, 2.0),
    "sigmoid": (tirx.sigmoid, special.expit, 3.0),
    "erf": (tirx.erf, special.erf, 2.0),
}
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 88.72, 88.73,
                    -87.4, -103.9, -104.5, 3e38, -3e38, 0.625, -0.625, 1.1, 3.92, -3.92, 9.0,
                    -9.0, 44.0, 1.0], np.float32)
LANES = 16


def _kernel(op: str, n: int):
    """``B[i] = op(A[i])`` over ``n`` elements, vectorized by 16, with the rewrite."""
    a = te.placeholder((n,), "float32", name="A")
    b = te.compute((n,), lambda i: OPS[op][0](a[i]), name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    (loop,) = sch.get_loops(sch.get_sblock("B"))
    sch.vectorize(sch.split(loop, [None, LANES])[1])
    return tvm.compile(fast_math_pass(sch.mod), target=TARGET)


def _apply(op: str, x: np.ndarray) -> np.ndarray:
    x = np.concatenate([x, np.zeros(-x.size % LANES, np.float32)])
    out = tvm.runtime.tensor(np.zeros_like(x))
    _kernel(op, x.size)(tvm.runtime.tensor(x), out)
    return out.numpy()


def ulp_error(got: np.ndarray, x: np.ndarray, ref_fn) -> np.ndarray:
    """|got - ref| in units of the spacing of float32 at ref; 0 where got is ref rounded."""
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
        err = np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref32)).astype(np.float64)
    same = (got == ref32) | (np.isnan(got) & np.isnan(ref32))
    return np.where(same, 0.0, np.where(np.isfinite(ref32), err, np.inf))


def _dense(op: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if op == "log":
        parts = [np.linspace(0, 4, 1 << 20), np.exp(rng.uniform(-103, 88.7, 1 << 20)),
                 rng.uniform(0, 1.2e-38, 1 << 14)]
    else:
        parts = [np.linspace(-110, 110, 1 << 20), np.linspace(-5, 5, 1 << 20),
                 rng.uniform(-1e-3, 1e-3, 1 << 14)]
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.parametrize("op", list(OPS))
def test_accuracy_within_stated_ulp(op: str) -> None:
    x = _dense(op)
    got = _apply(op, x)[: x.size]
    err = ulp_error(got, x, OPS[op][1])
    worst = int(np.argmax(err))
    assert err[worst] <= OPS[op][2], f"{op}({x[worst]!r}) = {got[worst]!r}: {err[worst]} ulp"


@pytest.mark.parametrize("op", list(OPS))
def test_special_values(op: str) -> None:
    got = _apply(op, SPECIAL)[: SPECIAL.size]
    with np.errstate(all="ignore"):
        want = OPS[op][1](SPECIAL.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    err = ulp_error(got[finite], SPECIAL[finite], OPS[op][1])
    assert err.max() <= OPS[op][2], list(zip(SPECIAL[finite], got[finite], want[finite]))


def _math_module() -> tvm.IRModule:
    """Relax ops whose legalized kernels call exp, log, tanh, sigmoid or erf once per element.

    softplus (log(1 + exp(x))) is left out: its log nests a rewritten exp, and a nested call
    keeps the library call (``fast_math.MAX_NESTED``)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 256), "float32"))
    ops = [relax.op.nn.gelu, relax.op.nn.gelu_tanh, relax.op.nn.silu, relax.op.sigmoid,
           relax.op.tanh, relax.op.exp, relax.op.log, relax.op.erf,
           relax.op.nn.softmax]
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(op(x)) for op in ops]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _asm(ex) -> str:
    stack = [ex.mod]
    while stack:
        m = stack.pop()
        if m.kind == "llvm":
            return m.inspect_source("asm")
        stack.extend(m.imports)
    raise AssertionError("no llvm module")


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("strategy", ["none", "tvm"])
def test_no_scalar_libm_call_remains(target, strategy: str) -> None:
    ex = tvm.compile(_math_module(), target=target,
                     relax_pipeline=strategy_pipeline(strategy, target))
    asm = _asm(ex)
    calls = set(re.findall(r"\bcall\w*\s+\*?([\w.@]+)", asm))
    libm = {c for c in calls if re.match(r"(exp|log|tanh|erf)f?\b|(exp|log|tanh|erf)f@", c)}
    assert not libm, libm
    # LLVM may split 16-lane vectors into ymm halves on skylake-avx512 (its preferred width)
    assert re.search(r"vfmadd\w*ps\s+%[yz]mm", asm), "no packed FMA: not vectorized"


@pytest.mark.parametrize("name", ["mlp_gelu", "gpt2_block", "bert_layer", "elementwise_chain"])
@pytest.mark.parametrize("strategy", ["none", "costfuse"])
def test_models_with_math_match_the_libm_build(name: str, strategy: str) -> None:
    mod, inputs = models.load(name, small=True)
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=strategy_pipeline(strategy, TARGET))
    assert_close(run(ex, inputs), reference(name), rtol=1e-4, atol=1e-4)
