"""Measure this machine's target description: DRAM bandwidth, FP32 FLOP/s, kernel launch cost.

Each figure comes from a small kernel built here for the host LLVM target with its schedule
written out (parallel over cores, vectorized to the CPU's vector width), timed with TVM's
``time_evaluator`` after a warm-up, and reduced to a median over repeats:

- ``dram_bw``: a streaming ``B[i] = 2 * A[i]`` over buffers much larger than the LLC; bytes
  read + bytes written / median time (STREAM's convention: write-allocate traffic not counted,
  so this is a lower bound on what the memory system moves).
- ``l2_bw``, ``l3_bw``: the same kernel over buffers that fit in L2 (per core) and in the LLC.
- ``fp32_flops``: a register-blocked FMA chain (``acc = acc * m + c``, independent accumulators
  held in vector registers, no memory traffic in the loop). This is the throughput of the FMA
  units as TVM's LLVM code reaches them: a lower bound on the datasheet peak, and an upper
  bound on what any real kernel (matmul included) reaches on this machine.
- ``math_s``: seconds one core spends per float32 exp of our vectorized polynomial
  (``schedules/fast_math``), in registers and L1: ``x = exp(-x)`` swept over a slice of a few
  KiB per core, less the same sweep of ``x = 0.5 - 0.5 x``. The cost models price math calls in
  units of it (``schedules.math_calls.MATH_COST``); the FMA peak does not tell it, as the
  polynomial's rounding, shifts and selects are no FMAs.
- ``depthwise_s1`` .. ``channels_last_s2``, ``gather_s``, ``transpose_s``: our depthwise kernels'
  shares of the peak, a gathering and a lone transpose's seconds per element (:mod:`.gather`).
- ``launch_s``: a Relax VM function calling N tiny ``call_tir`` kernels vs one:
  ``(t_N - t_1) / (N - 1)``. Measured for a parallel kernel (what scheduled kernels pay: VM
  dispatch + thread-pool fork/join) and a serial one (VM dispatch alone).

The figures are saved as JSON (default ``~/.cache/tvm_costfuse/host_calibration.json``) with the
date and CPU; :func:`tvm_costfuse.targets.host` reads them back when the CPU matches. On a
shared or virtualised machine the medians include interference from other tenants: they are
the figures a fusion decision should use here, not the silicon's.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, tirx
from tvm.script import tirx as T

from .. import targets
from ..schedules.fast_math import rewrite_calls
from . import depthwise_shares, gather
from .kernel_time import optional_figures
from .quiet import OtherLoad
from .timing import thread_pool

DEFAULT_PATH = targets.CALIBRATION_PATH

#: Bytes of each stream buffer of the full run: 256 MB (8x a 32 MB LLC). Quick mode uses 64 MB,
#: still 2x such an LLC counting input and output, to stay under ~10 s on 2 busy cores.
DRAM_STREAM_BYTES = 256 << 20
_DRAM_BYTES = {False: DRAM_STREAM_BYTES, True: 64 << 20}
_STREAM_BYTES_PER_CALL = 64 << 20  # cache-sized streams sweep until ~this much moved
#: The LLC stream's buffers: a quarter of the LLC (in + out fill half), at most this (or the
#: cores' L2 together, where that is larger, so that the stream leaves L2). A VM may
#: report a last-level cache far beyond its share: 480 MiB on a 2-vCPU rocketlake host, whose
#: stream ran 29.4 GB/s per core over 2-32 MiB buffers and 15.5 GB/s over the 120 MiB a
#: quarter of it asked (below its DRAM stream, 21 GB/s), so every tensor past L2 was priced at
#: half what kernels reached there. A 32 MiB LLC (znver4) gives 8 MiB either way.
_L3_STREAM_BYTES = 8 << 20
_LAUNCH_KERNELS = 64  # N tiny kernels: t_N - t_1 must dwarf the timer noise (~1 us).
_FMA_ACCUMULATORS = 12  # independent chains: > FMA latency (4) x pipes (2), < vector registers.
_MATH_FLOATS_PER_CORE = 2048  # 8 KiB per core: resident in any L1d
_MATH_CALLS_PER_CALL = 1 << 23  # exp calls per core per timed call: ~2 ms at 0.25 ns each


def _median(rt_mod, name: str, args, repeat: int, min_repeat_ms: int) -> float:
    """Median seconds of one call after a warm-up call; ``min_repeat_ms`` swamps timer jitter."""
    rt_mod[name](*args)
    timer = rt_mod.time_evaluator(
        name, tvm.cpu(), number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
    )
    return float(np.median(timer(*args).results))


def _build(func: tirx.PrimFunc, name: str, target: tvm.target.Target):
    return tvm.compile(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=target)


# ---------------------------------------------------------------------------- bandwidth
def _stream_kernel(per_core: int, lanes: int, cores: int, sweeps: int) -> tirx.PrimFunc:
    """``B = 2 * A``, one contiguous slice of ``per_core`` floats per core, vectorized.

    Each core sweeps its slice ``sweeps`` times inside one call, so that buffers sized for a
    cache level take long enough to time past the thread pool's fork/join (~6 us here)."""
    n = per_core * cores

    @T.prim_func
    def stream(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        T.func_attr({"tir.noalias": True})
        for c in T.parallel(cores):
            for _ in range(sweeps):
                for i in range(per_core // lanes):
                    for v in T.vectorized(lanes):
                        b[c * per_core + i * lanes + v] = a[
                            c * per_core + i * lanes + v
                        ] * T.float32(2)

    return stream


def stream_timer(nbytes: int, lanes: int, cores: int, target):
    """:func:`_stream_kernel` on two ``nbytes`` buffers, built once: (bytes read + written per
    call, ``timer(repeat, min_repeat_ms)`` -> median seconds per call). Kernel benchmarks time
    it next to their own kernels at the same working-set size."""
    per_core = max(lanes, nbytes // 4 // cores // lanes * lanes)
    n = per_core * cores
    sweeps = max(1, _STREAM_BYTES_PER_CALL // (2 * 4 * n))
    ex = _build(_stream_kernel(per_core, lanes, cores, sweeps), "stream", target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ones(n, "float32"), dev), tvm.runtime.empty((n,), "float32", dev)]
    moved = 2 * 4 * n * sweeps  # one read + one write per element and sweep
    return moved, lambda repeat, ms: _median(ex.mod, "stream", args, repeat, ms)


def _stream_bandwidth(nbytes: int, lanes: int, cores: int, target, repeat: int, ms: int) -> float:
    """Bytes read + written per second by :func:`_stream_kernel` on two ``nbytes`` buffers."""
    moved, timer = stream_timer(nbytes, lanes, cores, target)
    return moved / timer(repeat, ms)


# ---------------------------------------------------------------------------- FLOP/s
def _fma_kernel(tasks: int, iters: int, lanes: int, nacc: int):
    """``tasks`` parallel tasks, each ``iters`` rounds of ``nacc`` vector FMAs in registers.

    The accumulator is a "global"-scope buffer under 1 KB: TVM lowers it to a stack ``alloca``
    that LLVM promotes to registers ("local" scope went through the workspace allocator and
    kept every accumulator in memory)."""

    @T.prim_func
    def fma(
        x: T.Buffer((tasks, nacc, lanes), "float32"),
        m: T.Buffer((lanes,), "float32"),
        c: T.Buffer((lanes,), "float32"),
        y: T.Buffer((tasks, nacc, lanes), "float32"),
    ):
        T.func_attr({"tir.noalias": True})
        for p in T.parallel(tasks):
            acc = T.decl_buffer((nacc, lanes), "float32", scope="global")
            for a in T.unroll(nacc):
                for v in T.vectorized(lanes):
                    acc[a, v] = x[p, a, v]
            for _ in range(iters):
                for a in T.unroll(nacc):
                    for v in T.vectorized(lanes):
                        acc[a, v] = acc[a, v] * m[v] + c[v]
            for a in T.unroll(nacc):
                for v in T.vectorized(lanes):
                    y[p, a, v] = acc[a, v]

    return fma


def fma_timer(lanes: int, cores: int, target, iters: int):
    """:func:`_fma_kernel` on ``cores`` x ``lanes`` lanes, built once: (FLOPs per call,
    ``timer(repeat, min_repeat_ms)`` -> median seconds per call), for scripts that time the
    peak beside their own kernels in every round."""
    tasks = cores * 4
    nacc = _FMA_ACCUMULATORS
    ex = _build(_fma_kernel(tasks, iters, lanes, nacc), "fma", target)
    dev = tvm.cpu()
    # m = 1, c = 0 keeps values finite (no denormal or overflow slow paths) over any iters.
    shapes_values = [
        ((tasks, nacc, lanes), 0.5),
        ((lanes,), 1.0),
        ((lanes,), 0.0),
        ((tasks, nacc, lanes), 0.0),
    ]
    args = [tvm.runtime.tensor(np.full(s, v, "float32"), dev) for s, v in shapes_values]
    flops = 2.0 * tasks * iters * nacc * lanes
    return flops, lambda repeat, ms: _median(ex.mod, "fma", args, repeat, ms)


def fp32_flops(lanes: int, cores: int, target, iters: int, repeat: int, ms: int) -> float:
    """FP32 FLOP/s of independent FMA chains on ``cores`` x ``lanes`` lanes: the peak the
    calibration records (and ``scripts/bench_kernels.py --peak`` times beside its kernels)."""
    flops, timer = fma_timer(lanes, cores, target, iters)
    return flops / timer(repeat, ms)


# ---------------------------------------------------------------------------- math calls
def _math_kernel(per_core: int, lanes: int, cores: int, sweeps: int, exp: bool):
    """``x = exp(-x)`` (``exp``) or ``x = 0.5 - 0.5 x`` in place over ``per_core`` floats per
    core, ``sweeps`` times. Each lane's chain converges (to 0.567, 1/3), so no input leaves
    the polynomial's range; a sweep's vectors are independent, so the time is throughput."""
    n = per_core * cores

    @T.prim_func
    def math(x: T.Buffer((n,), "float32")):
        T.func_attr({"tir.noalias": True})
        for c in T.parallel(cores):
            for _ in range(sweeps):
                for i in range(per_core // lanes):
                    for v in T.vectorized(lanes):
                        x[c * per_core + i * lanes + v] = T.float32(0.5) - T.float32(0.5) * x[
                            c * per_core + i * lanes + v]

    if not exp:
        return math

    def to_exp(store):
        return tirx.BufferStore(store.buffer, tirx.exp(-tirx.BufferLoad(store.buffer,
                                                                        store.indices)),
                                store.indices)

    # The rule CostFuse's kernels get (schedules/fast_math) turns the call into its polynomial.
    body = tvm_ffi.structural_map(math.body, (tirx.BufferStore, to_exp))
    return math.with_body(rewrite_calls(body))


def math_seconds(lanes: int, cores: int, target, repeat: int, ms: int) -> float | None:
    """Seconds one core spends per vectorized float32 exp, beyond a multiply-add's sweep; None
    where timer noise left no difference (the record then derives it, ``exp_seconds``)."""
    per_core = _MATH_FLOATS_PER_CORE // lanes * lanes
    sweeps = max(1, _MATH_CALLS_PER_CALL // per_core)
    dev = tvm.cpu()
    x = tvm.runtime.tensor(np.full(per_core * cores, 0.5, "float32"), dev)
    times = {}
    for exp in (True, False):
        ex = _build(_math_kernel(per_core, lanes, cores, sweeps, exp), "math", target)
        times[exp] = _median(ex.mod, "math", [x], repeat, ms)
    extra = times[True] - times[False]
    return extra / (per_core * sweeps) if extra > 0 else None


# ---------------------------------------------------------------------------- launch cost
def _tiny_kernel(parallel: bool, cores: int) -> tirx.PrimFunc:
    """y = x + 1 on 16 floats per core; when ``parallel``, split over ``cores`` threads.

    Built from TE so it keeps the block form Relax's pipeline (op-pattern analysis) expects."""
    x = te.placeholder((cores, 16), "float32", name="x")
    y = te.compute((cores, 16), lambda i, j: x[i, j] + tirx.const(1.0, "float32"), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    outer, inner = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(inner)
    if parallel:
        sch.parallel(outer)
    return sch.mod["main"].with_attr("global_symbol", "tiny")


def chain_module(kernels: int, parallel: bool, cores: int) -> tvm.IRModule:
    """Relax ``main`` calling ``kernels`` call_tir kernels in a chain (no fusion: no FuseOps)."""
    ty = relax.TensorType([cores, 16], "float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", ty)
    with bb.function("main", [x]):
        gv = bb.add_func(_tiny_kernel(parallel, cores), "tiny")
        with bb.dataflow():
            y = x
            for _ in range(kernels):
                y = bb.emit(relax.call_tir(gv, [y], ty))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _launch_seconds(parallel: bool, cores: int, target, repeat: int, ms: int) -> float:
    """Seconds per extra kernel launch: the fastest repeat of the long chain minus the fastest
    of the one-kernel call. Fastest, not median: the difference of two medians went to zero or
    below when another job took the second core mid-run; an overhead is what the quiet case
    costs. Measured again (up to 3 times) while the difference is not positive."""
    dev = tvm.cpu()
    x = tvm.runtime.tensor(np.zeros((cores, 16), "float32"), dev)
    timers = {}
    for kernels in (1, _LAUNCH_KERNELS):
        ex = tvm.compile(chain_module(kernels, parallel, cores), target=target)
        vm = relax.VirtualMachine(ex, dev)
        vm["main"](x)
        timers[kernels] = vm.time_evaluator("main", dev, number=1, repeat=repeat,
                                            min_repeat_ms=ms)
    extra = 0.0
    for _ in range(3):
        times = {k: float(np.min(t(x).results)) for k, t in timers.items()}
        extra = (times[_LAUNCH_KERNELS] - times[1]) / (_LAUNCH_KERNELS - 1)
        if extra > 0:
            break
    return max(extra, 0.0)


# ---------------------------------------------------------------------------- driver
def measure(num_cores: int | None = None, quick: bool = False) -> dict:
    """Run the calibration kernels; returns the JSON-ready record (figures, CPU, date, timings).

    ``num_cores`` sizes TVM's thread pool for the run and the kernels' parallel split
    (default: the CPUs this process may run on); the pool is restored afterwards.
    """
    # What TVM's pool starts with (TVM_NUM_THREADS, else the CPUs we may run on): restored after.
    pool_default = int(os.environ.get("TVM_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
    cores = num_cores or len(os.sched_getaffinity(0))
    cpu = targets.host_cpu()
    lanes = targets.isa.vector_bits(targets.host_target()) // 32
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": cores})
    caches = targets.host_caches()
    plan = (5, 20) if quick else (15, 50)  # (repeats, min ms per repeat)
    timings: dict[str, float] = {}
    figures: dict[str, float] = {}

    def timed(key, fn, *args):
        t0 = time.perf_counter()
        figures[key] = fn(*args)
        timings[key] = round(time.perf_counter() - t0, 3)

    thread_pool(cores)
    try:
        timed("dram_bw", _stream_bandwidth, _DRAM_BYTES[quick], lanes, cores, target, *plan)
        # Both buffers (in + out) fill half of a level, so the stream stays resident in it.
        l2_total = caches["l2_bytes"] * cores
        timed("l2_bw", _stream_bandwidth, l2_total // 4, lanes, cores, target, *plan)
        if caches["l3_bytes"]:
            l3 = caches["l3_bytes"]
            # past every core's L2 (both buffers), within a quarter of the LLC
            l3_buffer = min(l3 // 4, max(_L3_STREAM_BYTES, l2_total))
            timed("l3_bw", _stream_bandwidth, l3_buffer, lanes, cores, target, *plan)
        timed("fp32_flops", fp32_flops, lanes, cores, target, 20_000 if quick else 100_000, *plan)
        timed("math_s", math_seconds, lanes, cores, target, *plan)
        timed("depthwise", optional_figures, "depthwise shares", depthwise_shares.measure,
              target, figures["fp32_flops"], *plan)
        timed("gather", optional_figures, "transpose costs", gather.measure, cores, target, *plan)
        figures |= figures.pop("depthwise") | figures.pop("gather")
        timed("launch_s", _launch_seconds, True, cores, target, *plan)
        timed("launch_s_serial", _launch_seconds, False, cores, target, *plan)
    finally:
        thread_pool(pool_default)
    return {
        "cpu": cpu,
        "cpu_model": targets.host_cpu_model(),
        "num_cores": cores,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "tvm_version": tvm.__version__,
        "quick": quick,
        "figures": figures,
        "timings_s": timings,
    }


save, load = targets.save_calibration, targets.load_calibration


def _first_use(num_cores: int) -> tuple[dict, float]:
    """The quick measurement a host without a record gets on first use, with the cores other
    processes kept busy meanwhile (``targets.calibration`` caches it only if that is low)."""
    with OtherLoad() as load_elsewhere:
        record = measure(num_cores, quick=True)
    return record, load_elsewhere.cores


targets.calibration.measure_on_first_use(_first_use)


def calibrate(
    num_cores: int | None = None,
    quick: bool = False,
    path: str | os.PathLike | None = None,
    save_record: bool = True,
) -> targets.TargetDesc:
    """Measure this machine and return its :class:`~tvm_costfuse.targets.TargetDesc`.

    Saves the record to ``path`` (default :data:`DEFAULT_PATH`) unless ``save_record`` is False;
    a record that cannot be saved is still returned (:func:`save` says why once).
    Takes ~10-20 s on 2 busy cores (``quick``: ~5 s: a 64 MB stream, fewer repeats).
    """
    record = measure(num_cores, quick)
    if save_record:
        save(record, path)
    return targets.host(num_cores=record["num_cores"], calibration=record)


def main(argv: list[str] | None = None) -> None:
    """``python -m tvm_costfuse.measurement.calibrate [--quick] [--cores N] [--path FILE]``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller buffers, fewer repeats")
    parser.add_argument("--cores", type=int, default=None, help="threads (default: affinity)")
    parser.add_argument("--path", default=None, help=f"JSON record (default {DEFAULT_PATH})")
    args = parser.parse_args(argv)
    target = Path(args.path).expanduser() if args.path else targets.calibration.CALIBRATION_PATH
    why = targets.calibration.refusal(target)
    if why is not None:  # said before seconds of measuring, not after
        print(f"costfuse calibrate: error: cannot save to {target}: {why}", file=sys.stderr)
        raise SystemExit(1)
    t0 = time.perf_counter()
    record = measure(args.cores, args.quick)
    path = save(record, args.path)
    print(json.dumps(record, indent=2, sort_keys=True))
    if path is None:  # save gave the reason
        print(f"measured in {time.perf_counter() - t0:.1f} s, not saved", file=sys.stderr)
        raise SystemExit(1)
    print(f"saved to {path} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
