"""Each kernel of a corpus model's CostFuse build, priced and timed: the plan's estimate per
group beside the kernel's time inside the model (``fusion_bound._kernel_seconds``), largest
misprice first, so that a layout or fusion decision that goes wrong shows which price did::

    python3 lab/kernel_price.py shufflenet_v2_x1_0 --layout always --threads 1

Groups are matched to kernel symbols by name (FuseTIR's ``fused_`` + the members' PrimFunc
names); a symbol no group names is listed as unmatched.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import tvm

sys.path.insert(0, os.path.dirname(__file__))
from fusion_bound import _kernel_seconds

from tvm_costfuse.config import FusionConfig, register_config_keys
from tvm_costfuse.graph import build_graph
from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.pre_fusion import costfuse_model
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target, resolve
from tvm_costfuse.transform import plan_module


def priced(mod, target, layout: str) -> dict[str, tuple[float, str]]:
    """Kernel symbol -> (predicted seconds, the estimate's terms) of the plan CostFuse builds."""
    resolved = resolve(target)
    model, _, _ = costfuse_model(mod, resolved, layout=layout)
    prepared = prepare(model, resolved.tvm, fold=False)
    plan = plan_module(prepared, resolved.desc, FusionConfig.resolve(layout=layout), "main",
                       compile_target=resolved.tvm)
    graph = build_graph(prepared, "main")
    out = {}
    for members, est in plan.estimates.items():
        funcs = [graph[n].prim_func for n in sorted(members, key=lambda n: graph[n].index)
                 if graph[n].prim_func]
        if not funcs:
            continue
        name = funcs[0] if len(funcs) == 1 else "fused_" + "_".join(funcs)
        terms = " ".join(f"{k}={v * 1e6:.0f}" for k, v in est.breakdown.items() if v)
        shapes = [(graph[n].prim_func, graph[n].outputs[0].shape, graph[n].geometry)
                  for n in members if graph[n].geometry is not None]
        terms += f"; {shapes[0]}" if shapes else ""
        seconds, old = out.get(name, (0.0, ""))
        out[name] = (seconds + est.seconds, old or terms)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--layout", default="never", choices=["never", "always", "cost"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    register_config_keys()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    mod, inputs, _ = corpus.load(args.model)
    prices = priced(mod, target, args.layout)
    ex = tvm.compile(mod, target,
                     relax_pipeline=strategy_pipeline("costfuse", target, layout=args.layout),
                     tir_pipeline=tir_pipeline("costfuse"))
    measured = _kernel_seconds(ex, inputs, args.runs)
    rows, unmatched = [], []
    for symbol, seconds in measured.items():
        key = symbol if symbol in prices else re.sub(r"(\D)\d+$", r"\1", symbol)
        if key in prices:
            rows.append((symbol, seconds, *prices[key]))
        else:
            unmatched.append((symbol, seconds))
    rows.sort(key=lambda r: -abs(r[1] - r[2]))
    total_m, total_p = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{args.model}, layout {args.layout}, {args.threads} thread(s): matched kernels "
          f"measured {total_m * 1e3:.2f} ms, predicted {total_p * 1e3:.2f} ms; unmatched "
          f"{sum(s for _, s in unmatched) * 1e3:.2f} ms in {len(unmatched)} kernels")
    print(f"{'measured us':>11s} {'pred us':>8s} {'pred/meas':>9s}  kernel  [terms, us]")
    for symbol, seconds, pred, terms in rows[:args.top]:
        print(f"{seconds * 1e6:11.1f} {pred * 1e6:8.1f} {pred / max(seconds, 1e-9):9.2f}  {symbol}  [{terms}]")
    for symbol, seconds in sorted(unmatched, key=lambda r: -r[1])[:5]:
        print(f"{seconds * 1e6:11.1f} {'?':>8s} {'':9s}  {symbol} (no group of that name)")


if __name__ == "__main__":
    main()
