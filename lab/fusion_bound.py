"""Estimate how much faster than FuseOps *any* fusion plan could be on this CPU, with our
schedules: a ceiling from a simple model of what fusion saves, not a proof.

Fusion removes kernel launches and the memory traffic of intermediates; it does not make a
kernel's arithmetic cheaper (a matmul's tile, an erf or an exp cost the same fused or not). So
from the unfused build (every op its own kernel), a plan can save at most, per kernel,

    saving(k) = min(t(k), launch + (bytes read + bytes written by k) / stream bandwidth)

and can never go below the time of the contraction kernels (matmul, conv) alone. The most a
plan could gain over FuseOps on a model is then estimated as

    ceiling = t(FuseOps) / max(t(contractions), t(unfused) - sum of saving(k))

and, making no assumption about what fusion saves (every other op vanishes),

    loose = t(FuseOps) / t(contractions)

Where CostFuse already puts the whole model in one kernel (rmsnorm, elementwise_chain), the
floor is that kernel's measured time (the most fusion there is), so the ceiling equals what
CostFuse measured there. The saving errs high (the launch is the host description's 10 us,
the VM dispatch plus thread-pool wake-up measured ~6 us; the bandwidth is a single-thread NumPy
copy of 256 MB, slower than the caches these intermediates often stay in). The estimate is as
noisy as the machine: FuseOps, CostFuse and the unfused build are each compiled ``--builds``
times and timed interleaved (median over builds), but the per-kernel profile that gives the
contraction time and the savings comes from one unfused build, and separate builds of one plan
differ by up to 13% here (``build_spread.py``); a measured gain can land above its estimate.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

import numpy as np
import tvm
from tvm import relax

from tvm_costfuse import models
from tvm_costfuse.cost.features import op_class
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measurement.timing import geomean, interleaved_medians, kernel_calls
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host, host_target


def _wall(vm, args, runs: int) -> float:
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        vm["main"](*args)
        walls.append(time.perf_counter() - t0)
    return float(np.median(walls))


def _kernel_seconds(ex, inputs, runs: int) -> dict[str, float]:
    """Median seconds per kernel symbol per run of ``main`` (its calls summed), less the whole
    cost of the instrument per call (before and after callbacks, measured as the extra wall
    time of instrumented runs): an under-estimate of kernel time, so the saving errs high."""
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    plain = relax.VirtualMachine(ex, dev)
    vm = relax.VirtualMachine(ex, dev)
    seconds: Counter[str] = Counter()  # this run's time per kernel symbol
    calls: Counter[str] = Counter()  # this run's calls per kernel symbol
    events = [0]
    start = [0.0]

    def instrument(_func, symbol, before_run, _ret, *_args) -> int:
        events[0] += 1
        if symbol.startswith("vm."):
            return 0
        if before_run:
            start[0] = time.perf_counter()
        else:
            seconds[symbol] += time.perf_counter() - start[0]
            calls[symbol] += 1
        return 0

    vm.set_instrument(instrument)
    _wall(plain, args, 2)  # warm-up
    _wall(vm, args, 2)
    per_run: list[Counter[str]] = []
    for _ in range(runs):
        seconds.clear()
        calls.clear()
        _wall(vm, args, 1)
        per_run.append(seconds.copy())
    calls_per_run = calls.copy()
    events[0] = 0
    instrumented = _wall(vm, args, runs)
    per_call = max(0.0, instrumented - _wall(plain, args, runs)) / (events[0] / runs / 2)
    return {s: max(0.0, float(np.median([r[s] for r in per_run])) - per_call * calls_per_run[s])
            for s in per_run[0]}


def _stream_bandwidth(nbytes: int = 256 * 2**20) -> float:
    """Bytes/s of a single-thread NumPy copy (read + write) of ``nbytes``: best of 5."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = math.inf
    for _ in range(6):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--builds", type=int, default=3,
                    help="compilations per strategy, timed interleaved (median of medians)")
    args = ap.parse_args()
    target = host_target()
    print(f"target {target}  repeat={args.repeat}")
    bandwidth = _stream_bandwidth()
    launch = host(calibration=False).launch_s
    print(f"stream bandwidth {bandwidth / 1e9:.1f} GB/s, launch {launch * 1e6:.0f} us")
    print(f"{'model':<18}{'tvm ms':>9}{'costfuse ms':>13}{'unfused ms':>12}"
          f"{'contractions ms':>17}{'max saving ms':>15}{'tvm/costfuse':>14}{'ceiling':>9}"
          f"{'loose':>8}")
    bounds, loose, achieved = [], [], []
    for name in args.models or models.zoo.names():
        mod, inputs = models.load(name)
        builds = {(s, i): tvm.compile(mod, target=target,
                                      relax_pipeline=strategy_pipeline(s, target),
                                      tir_pipeline=tir_pipeline())
                  for s in ("tvm", "costfuse", "none") for i in range(args.builds)}
        per_build = interleaved_medians(builds, inputs, repeat=args.repeat)
        t = {s: float(np.median([v for (k, _), v in per_build.items() if k == s]))
             for s in ("tvm", "costfuse", "none")}
        built = {s: builds[(s, 0)] for s in ("tvm", "costfuse", "none")}
        graph = build_graph(prepare(mod, target))
        nodes: dict[str, list] = {}
        for n in graph.nodes:
            if n.kind == "call_tir":
                nodes.setdefault(n.prim_func, []).append(n)
        per_kernel = _kernel_seconds(built["none"], inputs, args.repeat)
        contraction = sum(sec for s, sec in per_kernel.items()
                          if any(op_class(n) == "contraction" for n in nodes[s]))
        saving = sum(min(sec, sum(launch + (n.bytes_read + n.bytes_written) / bandwidth
                                  for n in nodes[s] if not n.view))
                     for s, sec in per_kernel.items())
        floor = max(contraction, t["none"] - saving)
        loose_floor = contraction
        if len(kernel_calls(built["costfuse"], inputs)) == 1:
            floor = loose_floor = t["costfuse"]  # the whole model in one kernel
        ratio = t["tvm"] / t["costfuse"]
        bound = t["tvm"] / floor if floor > 0 else math.inf
        loose.append(t["tvm"] / loose_floor if loose_floor > 0 else math.inf)
        bounds.append(bound)
        achieved.append(ratio)
        print(f"{name:<18}{t['tvm'] * 1e3:>9.3f}{t['costfuse'] * 1e3:>13.3f}"
              f"{t['none'] * 1e3:>12.3f}{contraction * 1e3:>17.3f}{saving * 1e3:>15.3f}"
              f"{ratio:>14.2f}{bound:>9.2f}{loose[-1]:>8.2f}", flush=True)
    print(f"geomean tvm/costfuse {geomean(achieved):.2f}x; geomean ceiling {geomean(bounds):.2f}x,"
          f" loose {geomean(loose):.2f}x over {len(bounds)} models")


if __name__ == "__main__":
    main()
