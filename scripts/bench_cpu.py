"""CPU benchmark: fusion strategies, optional tuned schedules and PyTorch eager side by side.

Per zoo model, in one process with interleaved timing rounds: TVM's stock pipeline, no fusion
+ our CPU rules, FuseOps + our rules, CostFuse + our rules, optionally FuseOps + a meta-schedule
database (``--tuned DIR``, rules for untuned kernels), and PyTorch eager at 1 and 2 threads
(``scripts/torch_zoo.py``, same weights) when torch is installed. Every output is checked
against stock before timing. Prints medians, ratios and geomeans.

Each strategy is compiled ``--builds`` times (default 3) and every build is sampled in every
round; a strategy's time is the median over all its samples. On this 2-vCPU VM separate builds
of the *same* plan differed by up to ~13% (``lab/build_spread.py``: four builds of
gpt2_block's CostFuse plan 21.5-23.3 ms, of mlp_gelu's FuseOps plan 15.0-16.5 ms), which a
single build per strategy turns into a spurious fusion effect. Most of that was where the
allocator put row-major weights; packed weights (``schedules/prepack.py``) cut it to a few
percent, and the extra builds cover what is left. Example::

    python scripts/bench_cpu.py --models mlp_gelu bert_layer --small
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import tvm

from tvm_costfuse import models
from tvm_costfuse.measurement.peers import eager_sampler
from tvm_costfuse.measurement.timing import (
    geomean,
    interleave,
    max_mismatch,
    run,
    vm_sampler,
)
from tvm_costfuse.strategies import STRATEGIES, strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target

try:
    import torch
except ImportError:  # torch is an optional extra
    torch = None
if torch is not None:
    import torch_zoo  # beside this script (Python puts the script's folder on the path)

# One timing sample lasts at least this long (back-to-back calls, averaged).
_SAMPLE_MS = 50
TORCH_THREADS = (1, 2)

def _ratio_line(times: dict[str, list[float]], num: str, den: str) -> str:
    pairs = [
        (a, b)
        for a, b in zip(times[num], times[den], strict=True)
        if math.isfinite(a) and math.isfinite(b)
    ]
    ratios = [a / b for a, b in pairs]
    return (
        f"geomean {num}/{den}: {geomean(ratios):.2f}x over {len(ratios)} models  "
        f"(per model: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None, help="zoo names (default: all)")
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGIES),
                    help="fusion strategies; costfuse-xgb plans with the learned model trained "
                         "in tuning_logs/ for this CPU")
    ap.add_argument("--small", action="store_true", help="the zoo's small shapes")
    ap.add_argument("--cores", type=int, default=None, help="num-cores of the target")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--builds", type=int, default=3,
                    help="independent compilations per strategy, all sampled every round")
    ap.add_argument(
        "--tuned",
        type=Path,
        default=None,
        help="meta-schedule database dir: adds a 'tuned' column (FuseOps + database)",
    )
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager columns")
    args = ap.parse_args()
    target = host_target(args.cores)
    names = args.models or models.zoo.names()
    pipelines = {s: strategy_pipeline(s, target) for s in args.strategies}
    if args.tuned is not None:
        from tvm_costfuse.tuning.metaschedule import tuned_pipeline

        pipelines["tuned"] = tuned_pipeline(target, args.tuned, fusion="tvm")
    with_torch = torch is not None and not args.no_torch
    columns = list(pipelines) + ([f"torch{n}" for n in TORCH_THREADS] if with_torch else [])
    print(
        f"target {target}  small={args.small}  repeat={args.repeat}  builds={args.builds}  "
        f"torch={torch.__version__ if with_torch else 'no'}"
    )
    width = {c: max(16, len(c) + 5) for c in columns}  # "costfuse-measured ms" and a gap
    print(f"{'model':<18}" + "".join(f"{c + ' ms':>{width[c]}}" for c in columns)
          + "  tvm err  torch err")
    times: dict[str, list[float]] = {c: [] for c in columns}
    for name in names:
        mod, inputs = models.load(name, small=args.small)
        built = {k: [tvm.compile(mod, target=target, relax_pipeline=p, tir_pipeline=tir_pipeline(k))
                     for _ in range(args.builds)] for k, p in pipelines.items()}
        ref = run(built[columns[0]][0], inputs)
        err = max(max_mismatch(ref, run(ex, inputs)) for exs in built.values() for ex in exs)
        samplers = {k: [vm_sampler(ex, inputs, min_ms=_SAMPLE_MS) for ex in exs]
                    for k, exs in built.items()}
        torch_err = math.nan
        if with_torch:
            fn, _ = torch_zoo.load(name, small=args.small)
            with torch.inference_mode():
                torch_err = max_mismatch(ref, [fn().numpy()])
            for n in TORCH_THREADS:
                samplers[f"torch{n}"] = [eager_sampler(fn, n)]
        t = {k: float(np.median(v)) for k, v in interleave(samplers, args.repeat).items()}
        for c in columns:
            times[c].append(t[c])
        print(
            f"{name:<18}"
            + "".join(f"{t[c] * 1e3:>{width[c]}.3f}" for c in columns)
            + f"  {err:7.2g}  {torch_err:9.2g}",
            flush=True,
        )
    base = columns[0]
    for c in columns[1:]:
        print(_ratio_line(times, base, c))
    if "tvm" in times:
        for c in ("none", "costfuse", "tuned", *(f"torch{n}" for n in TORCH_THREADS)):
            if c in times:
                print(_ratio_line(times, c, "tvm"))


if __name__ == "__main__":
    main()
