"""A ragged row reduction split into whole vectors and a tail (``schedules/ragged.py``): exact
for max and min, a sum within float reassociation, the head a reduction rfactor takes (the
only writer of its own buffer), and the forms it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.script import tirx as T
from tvm_costfuse.schedules._common import vector_lanes
from tvm_costfuse.schedules.ragged import split_tail
from tvm_costfuse.schedules.reduction import _vector_rfactor

from tvm_costfuse.targets import host_target


def _reduce(n: int, kind: str):
    """``out[i] = kind(x[i, :n])`` over 3 rows."""
    init = {"max": T.min_value("float32"), "min": T.max_value("float32"),
            "sum": T.float32(0)}[kind]

    def combine(acc, v):
        return {"max": T.max, "min": T.min}[kind](acc, v) if kind != "sum" else acc + v

    @T.prim_func(s_tir=True)
    def f(x: T.Buffer((3, n), "float32"), out: T.Buffer((3,), "float32")):
        for i, k in T.grid(3, n):
            with T.sblock("r"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    out[vi] = init
                out[vi] = combine(out[vi], x[vi, vk])

    return f


@pytest.mark.parametrize("kind", ["max", "min", "sum"])
@pytest.mark.parametrize(("vectors", "tail"), [(2, 1), (3, 5), (12, 5)])
def test_the_split_reduces_as_the_whole_row(kind, vectors, tail) -> None:
    """Rows of two or more whole vectors of this host's lanes and a tail (12 x 16 + 5: ViT's
    197 keys on AVX-512), built and run."""
    target = host_target(1)
    lanes = vector_lanes(target, "float32")
    n = vectors * lanes + tail
    func = split_tail(_reduce(n, kind), "r", lanes)
    assert func is not None
    sch = s_tir.Schedule(func)
    assert _vector_rfactor(sch, sch.get_sblock("r"), target) is not None  # the head: whole
    names: list[str] = []
    tvm_ffi.structural_walk(sch.mod["main"].body, (s_tir.SBlock, lambda b: names.append(
        b.name_hint)))
    assert {"r_rf", "r", "r_tail"} <= set(names)  # partials, their sum, the tail
    x = np.random.default_rng(n).standard_normal((3, n)).astype("float32")
    out = tvm.runtime.tensor(np.zeros(3, "float32"))
    tvm.compile(sch.mod, target)["main"](tvm.runtime.tensor(x), out)
    want = {"max": x.max(1), "min": x.min(1), "sum": x.astype(np.float64).sum(1)}[kind]
    if kind == "sum":
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(out.numpy(), want)  # max and min: exact


@pytest.mark.parametrize(("n", "lanes"), [(32, 16), (20, 16), (15, 8), (5, 16)])
def test_whole_or_short_rows_are_left_alone(n, lanes) -> None:
    """A row of whole vectors needs no tail; one shorter than two vectors has no head worth
    partials."""
    assert split_tail(_reduce(n, "sum"), "r", lanes) is None


def test_a_tuple_reduction_is_left_alone() -> None:
    """Two outputs in one block (a layer norm's sum and sum of squares): not this form."""

    @T.prim_func(s_tir=True)
    def f(x: T.Buffer((2, 40), "float32"), s: T.Buffer((2,), "float32"),
          q: T.Buffer((2,), "float32")):
        for i, k in T.grid(2, 40):
            with T.sblock("r"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    s[vi] = T.float32(0)
                    q[vi] = T.float32(0)
                s[vi] = s[vi] + x[vi, vk]
                q[vi] = q[vi] + x[vi, vk] * x[vi, vk]

    assert split_tail(f, "r", 16) is None


def test_a_guarded_a_shifted_or_a_bound_row_is_left_alone() -> None:
    """A predicate on the block (the tail would write the rows it leaves out), a loop from
    another start and a reduction var bound through an expression: forms the rewrite would
    not rebuild faithfully."""

    @T.prim_func(s_tir=True)
    def guarded(x: T.Buffer((4, 35), "float32"), out: T.Buffer((4,), "float32")):
        for i, k in T.grid(4, 35):
            with T.sblock("r"):
                T.where(i < 3)
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    out[vi] = T.float32(0)
                out[vi] = out[vi] + x[vi, vk]

    @T.prim_func(s_tir=True)
    def shifted(x: T.Buffer((4, 40), "float32"), out: T.Buffer((4,), "float32")):
        for i in range(4):
            for k in range(5, 40):
                with T.sblock("r"):
                    vi = T.axis.spatial(4, i)
                    vk = T.axis.reduce(40, k)
                    with T.init():
                        out[vi] = T.float32(0)
                    out[vi] = out[vi] + x[vi, vk]

    @T.prim_func(s_tir=True)
    def bound(x: T.Buffer((4, 70), "float32"), out: T.Buffer((4,), "float32")):
        for i, k in T.grid(4, 35):
            with T.sblock("r"):
                vi = T.axis.spatial(4, i)
                vk = T.axis.reduce(70, k * 2)
                with T.init():
                    out[vi] = T.float32(0)
                out[vi] = out[vi] + x[vi, vk]

    for func in (guarded, shifted, bound):
        assert split_tail(func, "r", 16) is None

