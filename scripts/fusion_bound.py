"""How much faster than FuseOps could *any* fusion plan be on this CPU, with our schedules?

Fusion removes launches and intermediate traffic; it does not make a matmul or a convolution
compute faster (our contraction rule computes an epilogue on top of the same tile, and a fused
prologue is a packing pass of its own). So a model's time under any plan is at least the time
of its contraction kernels alone, and the most a plan can gain over FuseOps is

    bound = t(FuseOps) / t(contraction kernels, unfused)

per model with contractions. Models without one (rmsnorm, elementwise_chain) are bounded by a
single kernel holding the whole model, the most fusion there is; CostFuse builds exactly that
for both, so their bound is what CostFuse measures. All times come from one process:
FuseOps and CostFuse timed interleaved, the contraction kernels read off a per-kernel profile of
the unfused build (VM instrument; its own per-call overhead, measured on the same build,
subtracted).

    TVM_COSTFUSE_CALIBRATION=none python scripts/fusion_bound.py [--models ...] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import tvm
from tvm import relax
from tvm_costfuse.schedules import host_target

from tvm_costfuse import zoo
from tvm_costfuse.cost.features import op_class
from tvm_costfuse.graph import build_graph
from tvm_costfuse.measure import geomean, interleaved_medians, kernel_calls
from tvm_costfuse.passes import prepare
from tvm_costfuse.strategies import strategy_pipeline


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
    time of instrumented runs): an under-estimate of kernel time, so the bound errs high."""
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    plain = relax.VirtualMachine(ex, dev)
    vm = relax.VirtualMachine(ex, dev)
    current: dict[str, float] = {}
    events = [0]
    start = [0.0]

    def instrument(_func, symbol, before_run, _ret, *_args) -> int:
        events[0] += 1
        if symbol.startswith("vm."):
            return 0
        if before_run:
            start[0] = time.perf_counter()
        else:
            current[symbol] = current.get(symbol, 0.0) + time.perf_counter() - start[0]
        return 0

    vm.set_instrument(instrument)
    _wall(plain, args, 2)  # warm-up
    _wall(vm, args, 2)
    per_run: list[dict[str, float]] = []
    for _ in range(runs):
        current = {}
        _wall(vm, args, 1)
        per_run.append(current)
    events[0] = 0
    instrumented = _wall(vm, args, runs)
    per_call = max(0.0, instrumented - _wall(plain, args, runs)) / (events[0] / runs / 2)
    counts = Counter(kernel_calls(ex, inputs))
    return {s: max(0.0, float(np.median([r[s] for r in per_run])) - per_call * counts[s])
            for s in per_run[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    target = host_target()
    print(f"target {target}  repeat={args.repeat}")
    print(f"{'model':<18}{'tvm ms':>9}{'costfuse ms':>13}{'contraction ms':>16}"
          f"{'tvm/costfuse':>14}{'bound':>8}")
    bounds, achieved = [], []
    for name in args.models or zoo.names():
        mod, inputs = zoo.load(name)
        built = {s: tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(s, target))
                 for s in ("tvm", "costfuse", "none")}
        t = interleaved_medians({s: built[s] for s in ("tvm", "costfuse")}, inputs,
                                repeat=args.repeat)
        graph = build_graph(prepare(mod, target))
        contraction_funcs = {n.prim_func for n in graph.nodes
                             if n.kind == "call_tir" and op_class(n) == "contraction"}
        ratio = t["tvm"] / t["costfuse"]
        if contraction_funcs:
            per_kernel = _kernel_seconds(built["none"], inputs, args.repeat)
            contraction = sum(sec for s, sec in per_kernel.items() if s in contraction_funcs)
            bound = t["tvm"] / contraction
        else:
            contraction, bound = float("nan"), ratio
        bounds.append(bound)
        achieved.append(ratio)
        print(f"{name:<18}{t['tvm'] * 1e3:>9.3f}{t['costfuse'] * 1e3:>13.3f}"
              f"{contraction * 1e3:>16.3f}{ratio:>14.2f}{bound:>8.2f}", flush=True)
    print(f"geomean tvm/costfuse {geomean(achieved):.2f}x; geomean bound {geomean(bounds):.2f}x "
          f"over {len(bounds)} models")


if __name__ == "__main__":
    main()
