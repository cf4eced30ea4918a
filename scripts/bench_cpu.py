"""Per zoo model: TVM stock pipeline vs FuseOps + our CPU rules vs no fusion + our rules.

Prints median times, the speedups over stock, fused vs unfused, the worst output mismatch
against stock (<= 1 means within rtol/atol), and geomeans. Example::

    python scripts/bench_cpu.py --models mlp_gelu bert_layer --small
"""

from __future__ import annotations

import argparse

from tvm_costfuse.schedules import bench, host_target

from tvm_costfuse import zoo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None, help="zoo names (default: all)")
    ap.add_argument("--small", action="store_true", help="the zoo's small shapes")
    ap.add_argument("--cores", type=int, default=None, help="num-cores of the target")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    args = ap.parse_args()
    target = host_target(args.cores)
    names = args.models or zoo.names()
    print(f"target {target}  small={args.small}")
    head = f"{'model':<18}{'stock ms':>10}{'fuse ms':>10}{'nofuse ms':>10}"
    print(head + f"{'stock/fuse':>11}{'nofuse/fuse':>12}{'err fuse':>9}{'err nof':>9}")
    speedup, fusion_gain = [], []
    for name in names:
        mod, inputs = zoo.load(name, small=args.small)
        built = {v: bench.build(mod, target, v) for v in bench.VARIANTS}
        ref = bench.run(built["stock"], mod, inputs)
        err = {
            v: bench.max_mismatch(ref, bench.run(built[v], mod, inputs), args.rtol, args.atol)
            for v in ("fuseops", "nofuse")
        }
        t = bench.interleaved_medians(built, mod, inputs, args.repeat)
        speedup.append(t["stock"] / t["fuseops"])
        fusion_gain.append(t["nofuse"] / t["fuseops"])
        print(
            f"{name:<18}{t['stock'] * 1e3:>10.3f}{t['fuseops'] * 1e3:>10.3f}"
            f"{t['nofuse'] * 1e3:>10.3f}{speedup[-1]:>11.2f}{fusion_gain[-1]:>12.2f}"
            f"{err['fuseops']:>9.2g}{err['nofuse']:>9.2g}",
            flush=True,
        )
    print(
        f"geomean stock/fuse {bench.geomean(speedup):.2f}x  "
        f"nofuse/fuse {bench.geomean(fusion_gain):.2f}x  over {len(names)} models"
    )


if __name__ == "__main__":
    main()
