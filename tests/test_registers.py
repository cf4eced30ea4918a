"""Register-pressure ground truth: ptxas reports (CUDA, no GPU) and x86 spill counts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tvm
from tvm.script import tirx as T
from tvm_costfuse.schedules.cuda import GuardedRule

from tvm_costfuse import models
from tvm_costfuse.measurement import cuda_source as cuda
from tvm_costfuse.measurement import registers
from tvm_costfuse.measurement.registers import KernelResources, SpillCount
from tvm_costfuse.targets import cuda_target

DATA = Path(__file__).parent / "data"


# ---------------------------------------------------------------------------------------------
# Kernels with a known number of live values
# ---------------------------------------------------------------------------------------------


def live_accumulators(n: int, rows: int = 1024, cols: int = 256) -> tvm.IRModule:
    """CUDA: one thread per row keeps ``n`` running sums of that row live across the column
    loop (``n`` registers at least; sm_90 spills from n=256)."""

    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((rows, cols), "float32"), y: T.Buffer((rows, n), "float32")):
        T.func_attr({"global_symbol": f"acc{n}", "tirx.noalias": True})
        acc = T.alloc_buffer((n,), "float32", scope="local")
        for bx in T.thread_binding(rows // 128, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                for k in T.unroll(n):
                    acc[k] = T.float32(0)
                for j in range(cols):
                    for k in T.unroll(n):
                        acc[k] = acc[k] * T.float32(0.5) + x[bx * 128 + tx, (j + k) % cols]
                for k in T.unroll(n):
                    y[bx * 128 + tx, k] = acc[k]

    return tvm.IRModule({f"acc{n}": main})


def vector_sums(n: int, lanes: int = 16, cols: int = 256, parallel: int = 1) -> tvm.IRModule:
    """x86: ``n`` vector accumulators of ``lanes`` floats (AVX-512 has 32 zmm registers)."""

    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((cols, lanes), "float32"), y: T.Buffer((parallel, n, lanes), "float32")):
        T.func_attr({"global_symbol": f"vsum{n}", "tirx.noalias": True})
        for p in T.parallel(parallel):
            acc = T.alloc_buffer((n, lanes), "float32", scope="local")
            for k in T.unroll(n):
                for v in T.vectorized(lanes):
                    acc[k, v] = T.float32(0)
            for j in range(cols):
                for k in T.unroll(n):
                    for v in T.vectorized(lanes):
                        acc[k, v] = acc[k, v] * T.float32(0.5) + x[(j + k + p) % cols, v]
            for k in T.unroll(n):
                for v in T.vectorized(lanes):
                    y[p, k, v] = acc[k, v]

    return tvm.IRModule({f"vsum{n}": main})


@T.prim_func(s_tir=True)
def add_one(x: T.Buffer((1024,), "float32"), y: T.Buffer((1024,), "float32")):
    T.func_attr({"global_symbol": "add_one", "tirx.noalias": True})
    for i in T.vectorized(1024):
        y[i] = x[i] + T.float32(1)


# ---------------------------------------------------------------------------------------------
# Parser, on real nvcc output
# ---------------------------------------------------------------------------------------------


def test_parse_captured_nvcc_output():
    report = registers.parse_resource_usage((DATA / "ptxas_resource_usage_sm90.txt").read_text())
    assert len(report) == 6
    assert report["layer_norm_kernel"] == KernelResources(20, 0, 0, 0, 324)
    assert report["fused_matmul_add_gelu_kernel"] == KernelResources(64, 0, 0, 0, 6912)
    assert report["acc256_kernel"] == KernelResources(255, 220, 236, 136, 0)
    assert report["acc64_kernel"] == KernelResources(32, 608, 748, 384, 0)  # -maxrregcount=32
    chain = next(v for k, v in report.items() if k.startswith("fused_tir_sigmoid"))
    assert chain == KernelResources(19, 0, 0, 32, 0)  # a stack frame (cosf) is not a spill
    assert report["acc256_kernel"].spills and not chain.spills


def test_parse_ignores_device_functions_and_noise():
    text = """warning: something
ptxas info    : Function properties for helper
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
"""
    assert registers.parse_resource_usage(text) == {"k": KernelResources(12)}


# ---------------------------------------------------------------------------------------------
# Every small zoo model: CUDA C for sm_90 with FuseOps + dlight, then ptxas
# ---------------------------------------------------------------------------------------------


# one worker builds the module fixture once (pyproject: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("cuda-zoo")

@pytest.fixture(scope="module")
def zoo_cuda() -> dict[str, str]:
    """Model -> CUDA source of its small variant (TVM codegen, ~9 s for all ten)."""
    return {
        name: cuda.cuda_source(cuda.compile_cuda(models.load(name, small=True)[0]))
        for name in models.zoo.names()
    }


@pytest.fixture(scope="module")
def zoo_ptxas(zoo_cuda) -> dict[str, dict[str, KernelResources]]:
    """ptxas reports, two nvcc processes at a time (~7 s for all ten on 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = pool.map(registers.ptxas_report, zoo_cuda.values())
        return dict(zip(zoo_cuda, reports, strict=True))


@pytest.mark.parametrize("name", models.zoo.names())
def test_zoo_model_compiles_for_sm90(zoo_cuda, name):
    kernels = cuda.kernel_sources(zoo_cuda[name])
    assert kernels
    assert all(f" {k}(" in src for k, src in kernels.items())
    assert all(src.count("__global__") == 1 for src in kernels.values())


@pytest.mark.parametrize("name", models.zoo.names())
def test_zoo_model_ptxas_one_entry_per_kernel(zoo_cuda, zoo_ptxas, name):
    report = zoo_ptxas[name]
    assert set(report) == set(cuda.kernel_sources(zoo_cuda[name]))
    assert all(0 < r.registers <= 255 for r in report.values())


def test_guarded_rule_turns_errors_into_no_match():
    """dlight's GEMV rule asserts on a depthwise conv with 1x1 output: TVM's own CUDA pipeline
    fails on small MobileNetV2 (compiled above); guarded, the next rule gets the function."""
    mod = live_accumulators(4)

    class Raises(tvm.s_tir.dlight.ScheduleRule):
        def apply(self, func, target, tunable):
            raise AssertionError("boom")

    rule = GuardedRule(Raises())
    assert rule.apply(mod["acc4"], cuda_target(), False) is None
    assert "AssertionError: boom" in rule.rejections[0][1]


@T.prim_func(private=True, s_tir=True)
def matmul_two_slices(a: T.Buffer((4, 2, 8), "float32"), b: T.Buffer((4, 8, 64), "float32"),
                      s0: T.Buffer((1, 2, 64), "float32"), s1: T.Buffer((1, 2, 64), "float32")):
    """A batch matmul read by two epilogue blocks (LSTM: per-step slices of one projection)."""
    mm = T.sblock_alloc_buffer((4, 2, 64))
    for n, i, j, k in T.grid(4, 2, 64, 8):
        with T.sblock("matmul"):
            vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
            with T.init():
                mm[vn, vi, vj] = T.float32(0)
            mm[vn, vi, vj] = mm[vn, vi, vj] + a[vn, vi, vk] * b[vn, vk, vj]
    for n, i, j in T.grid(1, 2, 64):
        with T.sblock("slice0"):
            vn, vi, vj = T.axis.remap("SSS", [n, i, j])
            s0[vn, vi, vj] = mm[vn, vi, vj]
    for n, i, j in T.grid(1, 2, 64):
        with T.sblock("slice1"):
            vn, vi, vj = T.axis.remap("SSS", [n, i, j])
            s1[vn, vi, vj] = mm[vn + 3, vi, vj]


def test_guarded_rule_turns_ill_formed_schedules_into_no_match():
    """dlight's Matmul caches the output for the first epilogue and leaves the second one
    reading a buffer that no longer exists; lowering would reject it. Guarded, the rule does
    not apply and Fallback schedules the function, which builds."""
    target = cuda_target()
    assert tvm.s_tir.dlight.gpu.Matmul().apply(matmul_two_slices, target, False) is not None
    matmul = GuardedRule(tvm.s_tir.dlight.gpu.Matmul())
    assert matmul.apply(matmul_two_slices, target, False) is None
    assert "not well formed" in matmul.rejections[0][1]
    ex = cuda.compile_cuda(tvm.IRModule({"main": matmul_two_slices.with_attr(
        "global_symbol", "matmul_two_slices")}), target)
    assert "matmul_two_slices_kernel" in cuda.kernel_sources(ex)


# ---------------------------------------------------------------------------------------------
# Spills seen by ptxas
# ---------------------------------------------------------------------------------------------


def test_live_accumulators_spill_on_sm90():
    few = registers.ptxas_report(cuda.cuda_source(cuda.compile_cuda(live_accumulators(16))))
    many = registers.ptxas_report(cuda.cuda_source(cuda.compile_cuda(live_accumulators(384))))
    assert not few["acc16_kernel"].spills and few["acc16_kernel"].registers < 64
    assert many["acc384_kernel"].registers == 255
    assert many["acc384_kernel"].spill_store_bytes > 0 < many["acc384_kernel"].spill_load_bytes


def test_register_cap_needs_stripped_launch_bounds():
    src = cuda.cuda_source(cuda.compile_cuda(live_accumulators(64)))
    assert not registers.ptxas_report(src)["acc64_kernel"].spills  # ~80 registers
    with pytest.raises(ValueError, match="strip_launch_bounds"):
        registers.ptxas_report(src, maxrregcount=32)
    capped = registers.ptxas_report(src, strip_launch_bounds=True, maxrregcount=32)
    assert capped["acc64_kernel"].registers <= 32 and capped["acc64_kernel"].spills


# ---------------------------------------------------------------------------------------------
# Spills counted in LLVM's x86 assembly
# ---------------------------------------------------------------------------------------------

AVX512 = "skylake-avx512"  # any host can generate code for it; 32 vector registers


def _cpu_build(mod: tvm.IRModule):
    return tvm.compile(mod, target=tvm.target.Target({"kind": "llvm", "mcpu": AVX512}))


def test_cpu_spills_with_64_vector_accumulators():
    import llvmlite  # noqa: F401  (test extra; the spill counter needs it)
    assert registers.cpu_spill_report(_cpu_build(vector_sums(16)), AVX512) == {
        "vsum16": SpillCount()
    }
    many = registers.cpu_spill_report(_cpu_build(vector_sums(64)), AVX512)["vsum64"]
    assert many.spills > 0 and many.reloads > 0 and many.spill_bytes >= 64 * many.spills // 2


def test_cpu_no_spills_in_elementwise_kernel():
    import llvmlite  # noqa: F401  (test extra; the spill counter needs it)
    ex = _cpu_build(tvm.IRModule({"add_one": add_one}))
    assert registers.cpu_spill_report(ex, AVX512) == {"add_one": SpillCount()}


def test_cpu_spills_in_parallel_lambda_count_for_their_kernel():
    import llvmlite  # noqa: F401  (test extra; the spill counter needs it)
    report = registers.cpu_spill_report(_cpu_build(vector_sums(64, parallel=4)), AVX512)
    assert list(report) == ["vsum64"] and report["vsum64"].spills > 0


def test_cpu_spill_report_names_relax_kernels():
    import llvmlite  # noqa: F401  (test extra; the spill counter needs it)
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    target = tvm.target.Target({"kind": "llvm", "mcpu": AVX512})
    mod, _ = models.load("layernorm_mlp", small=True)
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu_generic.get_default_pipeline(target))
    report = registers.cpu_spill_report(ex)
    assert set(report) == {"layer_norm", "fused_matmul_add_gelu", "fused_matmul1_add1_add2"}


# A float constant (-FLT_MAX, a max reduction's init) held by a variable over part of the
# function: DWARF emits it as DW_OP_implicit_value bytes, and LLVM's verbose assembly quotes
# each byte raw in its comment (`.byte 255  # <0xff>`), which is not UTF-8.
_RAW_BYTE_COMMENTS_IR = """
target triple = "x86_64-unknown-linux-gnu"

define float @k_compute_(float %x, float %z) !dbg !5 {
entry:
    #dbg_value(float 0xC7EFFFFFE0000000, !9, !DIExpression(), !10)
  %y = fmul float %x, %z, !dbg !10
  %c = fcmp ogt float %y, 0.0, !dbg !10
  br i1 %c, label %a, label %b, !dbg !10
a:
  %w = fadd float %y, %x, !dbg !10
    #dbg_value(float %w, !9, !DIExpression(), !10)
  %v = fmul float %w, %w, !dbg !10
  ret float %v, !dbg !10
b:
  ret float %y, !dbg !10
}

!llvm.dbg.cu = !{!0}
!llvm.module.flags = !{!3, !4}
!0 = distinct !DICompileUnit(language: DW_LANG_C, file: !1, producer: "t", isOptimized: true,
                             runtimeVersion: 0, emissionKind: FullDebug)
!1 = !DIFile(filename: "k.c", directory: "/")
!3 = !{i32 2, !"Dwarf Version", i32 4}
!4 = !{i32 2, !"Debug Info Version", i32 3}
!5 = distinct !DISubprogram(name: "k_compute_", scope: !1, file: !1, line: 1, type: !6,
                            spFlags: DISPFlagDefinition | DISPFlagOptimized, unit: !0)
!6 = !DISubroutineType(types: !7)
!7 = !{!8, !8, !8}
!8 = !DIBasicType(name: "float", size: 32, encoding: DW_ATE_float)
!9 = !DILocalVariable(name: "acc", scope: !5, file: !1, line: 1, type: !8)
!10 = !DILocation(line: 1, scope: !5)
"""


@pytest.mark.parametrize("mcpu", ["x86-64", "haswell", AVX512, "znver4"])
def test_cpu_spill_report_reads_raw_bytes_in_assembly_comments(mcpu):
    import llvmlite  # noqa: F401  (test extra; the spill counter needs it)
    assert registers.cpu_spill_report(_RAW_BYTE_COMMENTS_IR, mcpu) == {"k": SpillCount()}


def test_cpu_spill_report_of_a_max_reduction_build():
    # A scheduled row max (init -FLT_MAX) on generic x86-64: its DWARF carries the raw bytes.
    import llvmlite  # noqa: F401  (test extra; the spill counter needs it)

    from tvm_costfuse.strategies import strategy_pipeline

    target = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 1})
    mod, _ = models.load("attention", small=True)
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline("none", target))
    report = registers.cpu_spill_report(ex, "x86-64")
    assert "softmax" in report
