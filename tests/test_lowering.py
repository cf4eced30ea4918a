"""The "costfuse" TIR pipeline: register tiles on the stack, not a workspace call per tile
(``schedules/lowering.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.script import tirx as T
from tvm_costfuse.schedules.lowering import STACK_BYTES

from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline
from tvm_costfuse.measurement.timing import run

_WORKSPACE_CALL = "load ptr, ptr @__TVMBackendAllocWorkspace"


def _llvm_ir(ex) -> str:
    mod = ex.mod if hasattr(ex, "mod") else ex
    lib = mod.imports[0] if mod.imports else mod
    return lib.inspect_source("ll")


def _conv_relu():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((32, 16, 3, 3)).astype("float32")
    x = relax.Var("x", relax.TensorType((1, 16, 20, 20), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=1))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(out)
    return bb.get(), {"x": rng.standard_normal((1, 16, 20, 20)).astype("float32")}


@pytest.mark.parametrize("strategy", ["tvm", "costfuse"])
def test_register_tiles_are_on_the_stack(strategy):
    """The convolution's accumulator tile (allocated inside the parallel tile loop) is a
    workspace call pair per tile under TVM's default TIR pipeline and a stack slot under
    ours; the numbers are the same bit for bit."""
    mod, inputs = _conv_relu()
    target = host_target()
    built = {name: tvm.compile(mod, target, relax_pipeline=strategy_pipeline(strategy, target),
                               tir_pipeline=name)
             for name in ("default", tir_pipeline(strategy))}
    assert _WORKSPACE_CALL in _llvm_ir(built["default"])
    assert _WORKSPACE_CALL not in _llvm_ir(built["costfuse"])
    np.testing.assert_array_equal(run(built["default"], inputs)[0],
                                  run(built["costfuse"], inputs)[0])


def _tiled(rows: int):
    """A parallel loop whose body writes a ``rows x 64`` float tile through a local buffer."""

    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((8, rows, 64), "float32"), b: T.Buffer((8, rows, 64), "float32")):
        T.func_attr({"global_symbol": "main"})
        for i, j, k in T.grid(8, rows, 64):
            with T.sblock("c"):
                vi, vj, vk = T.axis.remap("SSS", [i, j, k])
                b[vi, vj, vk] = a[vi, vj, vk] * T.float32(2)

    sch = s_tir.Schedule(func)
    block = sch.get_sblock("c")
    tile = sch.cache_write(block, 0, "local")
    outer = sch.get_loops(block)[0]
    sch.parallel(outer)
    sch.reverse_compute_at(tile, outer)
    return sch.mod


def test_only_buffers_up_to_the_limit_go_on_the_stack():
    """A thread's stack holds a few register tiles, not a plane of hundreds of KiB: a buffer
    over ``STACK_BYTES`` keeps its workspace allocation."""
    small_rows = STACK_BYTES // (64 * 4)
    target = host_target()
    small = tvm.compile(_tiled(small_rows), target=target, tir_pipeline=tir_pipeline())
    large = tvm.compile(_tiled(small_rows + 1), target=target, tir_pipeline=tir_pipeline())
    assert _WORKSPACE_CALL not in _llvm_ir(small)
    assert _WORKSPACE_CALL in _llvm_ir(large)
    a = np.arange(8 * small_rows * 64, dtype="float32").reshape(8, small_rows, 64)
    out = tvm.runtime.tensor(np.zeros_like(a))
    small["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), a * 2)


def test_stock_keeps_tvms_own_tir_pipeline():
    assert tir_pipeline("stock") == "default"
    assert tir_pipeline("none") == tir_pipeline("tvm") == tir_pipeline() == "costfuse"


@T.prim_func(s_tir=True)
def _two_cuda_kernels(a: T.Buffer((256,), "float32"), c: T.Buffer((256,), "float32")):
    T.func_attr({"global_symbol": "main"})
    b = T.sblock_alloc_buffer((256,))
    for bx in T.thread_binding(2, "blockIdx.x"):
        for tx in T.thread_binding(128, "threadIdx.x"):
            with T.sblock("double"):
                i = T.axis.spatial(256, bx * 128 + tx)
                b[i] = a[i] * T.float32(2)
    for bx in T.thread_binding(2, "blockIdx.x"):
        for tx in T.thread_binding(128, "threadIdx.x"):
            with T.sblock("add"):
                i = T.axis.spatial(256, bx * 128 + tx)
                c[i] = b[255 - i] + T.float32(1)


def test_a_gpu_builds_device_buffers_stay_workspace_allocations():
    """The host code of a CUDA build allocates the device buffer between its two kernels with
    a workspace call on the GPU: the pass leaves it (a host stack slot would be a wrong
    program), so the host code is TVM's own."""
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    hosts = {name: tvm.compile(_two_cuda_kernels, target=target, tir_pipeline=name)
             .mod.inspect_source("ll") for name in ("default", tir_pipeline())}
    assert _WORKSPACE_CALL in hosts["default"]
    assert hosts["costfuse"] == hosts["default"]
