"""Planning cost: seconds to plan elementwise chains and random DAGs of 1k, 5k and 10k ops
(greedy, analytical model), and FuseOps' time on a Relax chain of the same length. ``cpu s``
is the planner's process time: on a shared host it moves less than the wall clock.

    python scripts/planner_speed.py [--sizes 1000 5000 10000] [--no-fuseops]
"""

from __future__ import annotations

import argparse
import time

from tvm_costfuse import FusionConfig, plan_greedy
from tvm_costfuse.graph import OpPattern
from tvm_costfuse.targets import preset
from tvm_costfuse.testing import make_graph, op, random_dag


def chain(n: int):
    """n elementwise ops, each reading the previous one."""
    return make_graph([op(0, "op0", OpPattern.ELEMWISE, ["%x"])]
                      + [op(i, f"op{i}", OpPattern.ELEMWISE, [f"op{i - 1}"])
                         for i in range(1, n)])


def fuseops_seconds(n: int) -> float:
    """FuseOps alone on a legalized, pattern-annotated Relax chain of n relu/exp ops."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4096], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for i in range(n):
                v = bb.emit(relax.op.nn.relu(v) if i % 2 else relax.op.exp(v))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(bb.get()))
    start = time.perf_counter()
    relax.transform.FuseOps()(mod)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--no-fuseops", action="store_true")
    args = parser.parse_args()
    print(f"{'graph':<12} {'target':<5} {'ops':>6} {'kernels':>7} {'plan s':>7} {'cpu s':>7}")
    for n in args.sizes:
        for kind, graph in (("chain", chain(n)), ("random_dag", random_dag(n, seed=1))):
            for target in ("host", "h100"):
                start, cpu = time.perf_counter(), time.process_time()
                plan = plan_greedy(graph, preset(target), FusionConfig())
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                print(f"{kind:<12} {target:<5} {n:>6} {plan.kernels():>7} {elapsed:>7.2f} "
                      f"{cpu:>7.2f}", flush=True)
        if not args.no_fuseops:
            print(f"{'chain':<12} {'FuseOps':<5} {n:>6} {'':>7} {fuseops_seconds(n):>7.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
