"""CPU benchmark: fusion strategies (and PyTorch eager, when installed) side by side.

Per zoo model, in one process with interleaved timing rounds: TVM's stock pipeline, no fusion
+ our CPU rules, FuseOps + our rules, CostFuse + our rules; numerics checked against stock.
Prints medians, ratios and geomeans. Example::

    python scripts/bench_cpu.py --models mlp_gelu bert_layer --small
"""

from __future__ import annotations

import argparse

import tvm

from tvm_costfuse import zoo
from tvm_costfuse.measure import geomean, interleaved_medians, max_mismatch, run
from tvm_costfuse.schedules import host_target
from tvm_costfuse.strategies import STRATEGIES, strategy_pipeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None, help="zoo names (default: all)")
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGIES))
    ap.add_argument("--small", action="store_true", help="the zoo's small shapes")
    ap.add_argument("--cores", type=int, default=None, help="num-cores of the target")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    target = host_target(args.cores)
    names = args.models or zoo.names()
    strategies = args.strategies
    print(f"target {target}  small={args.small}")
    print(f"{'model':<18}" + "".join(f"{s + ' ms':>13}" for s in strategies) + "  worst err")
    times: dict[str, list[float]] = {s: [] for s in strategies}
    for name in names:
        mod, inputs = zoo.load(name, small=args.small)
        built = {
            s: tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(s, target))
            for s in strategies
        }
        ref = run(built[strategies[0]], inputs)
        err = max(max_mismatch(ref, run(ex, inputs)) for ex in built.values())
        t = interleaved_medians(built, inputs, args.repeat)
        for s in strategies:
            times[s].append(t[s])
        print(f"{name:<18}" + "".join(f"{t[s] * 1e3:>13.3f}" for s in strategies)
              + f"  {err:9.2g}", flush=True)
    base = strategies[0]
    for s in strategies[1:]:
        ratios = [a / b for a, b in zip(times[base], times[s], strict=True)]
        print(f"geomean {base}/{s}: {geomean(ratios):.2f}x over {len(names)} models")
    if "tvm" in strategies and "costfuse" in strategies:
        ratios = [a / b for a, b in zip(times["tvm"], times["costfuse"], strict=True)]
        print(f"geomean tvm/costfuse: {geomean(ratios):.2f}x  "
              f"(per model: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
