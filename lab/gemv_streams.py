"""Is a decode step's GEMV bound by one memory stream per core? The same GEMV read as 1, 2 or
4 concurrent streams.

``lab/gemv_bandwidth.py`` found the GEMV kernels of a decode step at 0.31 (1 thread) and 0.49
(2 threads) of the calibrated stream bandwidth, with an inner loop that is already 4
accumulators of FMAs on whole vectors: the weights arrive slower than one core's FMAs use
them. One sequential stream per core is limited by the misses a core keeps in flight; reading
``s`` distant parts of the reduction axis at once gives the prefetchers ``s`` streams. Here
``out[p, j] = sum_k x[k] W[p, k, j]`` (``W`` packed panel-major as the rule packs weights,
64-column panels) is scheduled as the rule does (parallel panels, 64 lanes of accumulators,
vectorized), with the reduction axis split into ``s`` chunks read in the same loop::

    python lab/gemv_streams.py --k 4864 --n 896 --threads 1
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax, s_tir, te

from tvm_costfuse.measurement.calibrate import stream_timer
from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import interleave
from tvm_costfuse.targets import host_target, isa, resolve

PANEL = 64


def gemv(k: int, n: int, streams: int) -> tvm.tirx.PrimFunc:
    chunk = k // streams
    x = te.placeholder((k,), "float32", name="x")
    w = te.placeholder((n // PANEL, k, PANEL), "float32", name="w")
    rc = te.reduce_axis((0, streams), name="rc")
    rk = te.reduce_axis((0, chunk), name="rk")
    out = te.compute(
        (n // PANEL, PANEL),
        lambda p, j: te.sum(x[rc * chunk + rk] * w[p, rc * chunk + rk, j], axis=[rc, rk]),
        name="out")
    func = te.create_prim_func([x, w, out])
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("out")
    p, j, c, kk = sch.get_loops(block)
    sch.reorder(p, kk, c, j)
    sch.parallel(p)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, p)
    p, kk, c, j = sch.get_loops(block)
    sch.unroll(c)
    sch.vectorize(j)  # before decompose: the update block alone is no reduction
    init = sch.decompose_reduction(block, kk)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(local)[-1])
    return sch.mod["main"]


def _cycled(kernel: tvm.tirx.PrimFunc, copies: int, args) -> tvm.IRModule:
    """``main(x, w0, .., wN)``: the kernel on each weight in turn."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((args.k,), "float32"))
    ws = [relax.Var(f"w{i}", relax.TensorType((args.n // PANEL, args.k, PANEL), "float32"))
          for i in range(copies)]
    with bb.function("main", [x, *ws]):
        gv = bb.add_func(kernel.without_attr("global_symbol"), "gemv")
        with bb.dataflow():
            outs = [bb.emit(relax.call_tir(gv, [x, w], relax.TensorType((args.n // PANEL, PANEL),
                                                                         "float32")))
                    for w in ws]
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    return bb.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4864)
    ap.add_argument("--n", type=int, default=896)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    target = host_target(args.threads)
    desc = resolve(target).desc
    thread_pool(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.k, dtype=np.float32)
    w = rng.standard_normal((args.n // PANEL, args.k, PANEL), dtype=np.float32)
    want = np.einsum("k,pkj->pj", x, w)
    dev = tvm.cpu()
    # Weights cycled through as a decode step's layers are: together at least twice the
    # last-level cache, so each call reads its weight from DRAM, as in a model.
    llc = desc.l3_bytes or desc.l2_bytes
    copies = max(1, -(-2 * llc // w.nbytes))
    weights = [tvm.runtime.tensor(w, dev) for _ in range(copies)]
    xs = tvm.runtime.tensor(x, dev)
    samplers = {}
    for s in (1, 2, 4, 8):
        # One VM call runs the GEMV on every copy in turn: no warm-up call of the same
        # weight before a timed one (``time_evaluator`` warms up, which left a 9 MiB weight
        # in a 32 MiB last-level cache and timed it at twice the stream).
        vm = relax.VirtualMachine(tvm.compile(_cycled(gemv(args.k, args.n, s), copies, args),
                                              target=target), dev)
        outs = vm["main"](xs, *weights)
        np.testing.assert_allclose(outs[0].numpy(), want, rtol=1e-3, atol=1e-3)
        timer = vm.time_evaluator("main", dev, number=1, repeat=1)
        samplers[s] = lambda timer=timer: timer(xs, *weights).mean / copies
    nbytes = w.nbytes + x.nbytes
    lanes = isa.vector_bits(target) // 32
    moved, stream = stream_timer(nbytes * copies, lanes, args.threads, target)
    samplers["stream"] = lambda: stream(1, 20)
    timed = interleave(samplers, args.repeat)
    print(f"GEMV {args.k} x {args.n} ({nbytes / 2**20:.1f} MiB, {copies} copies cycled), "
          f"{args.threads} thread(s), calibrated stream {desc.dram_bw / 1e9:.1f} GB/s")
    stream_bw = moved / float(np.median(timed.pop("stream")))
    print(f"  the calibration's stream kernel over as many bytes, timed beside: "
          f"{stream_bw / 1e9:.1f} GB/s (bytes read + written)")
    for s, v in timed.items():
        sec = float(np.median(v))
        print(f"  {s} stream(s): {sec * 1e6:8.1f} us  {nbytes / sec / 1e9:6.1f} GB/s  "
              f"{nbytes / sec / desc.dram_bw:5.2f} of the calibration, "
              f"{nbytes / sec / stream_bw:5.2f} of the stream beside")


if __name__ == "__main__":
    main()
