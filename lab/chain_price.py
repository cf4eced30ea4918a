"""Each channel chain of a CNN, priced and timed: the analytical model's split / chain ratio
beside the one measured inside the model (``chain_in_model.py``'s builds and timings), with the
terms of both prices, so that a refit of the chain card sees where the model is off::

    python3 lab/chain_price.py efficientnet_b0 mobilenet_v2 --threads 1
    python3 lab/chain_price.py mobilenet_v2 --threads 2 --no-measure

The pairs are the chain groups of the plan with the chain's 1x1 conv priced at its standalone
share (the planner then takes nearly every pair the card claims); each is split at its second
contraction into the 1x1 conv's group and the depthwise conv's, as FuseOps groups them. ``--json F`` writes every row (shapes, predicted and measured seconds) for a fit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

import tvm

sys.path.insert(0, os.path.dirname(__file__))
from chain_in_model import chains_taken, time_both

from tvm_costfuse.config import FusionConfig, register_config_keys
from tvm_costfuse.cost.analytical import estimate
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.fold import fold_weights
from tvm_costfuse.graph import build_graph
from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.schedules.classes import ScheduleClass
from tvm_costfuse.targets import host_target, resolve
from tvm_costfuse.transform import plan_module


def _pairs(mod, target):
    """(chain members, 1x1 half, depthwise half, graph) of every chain the forced plan forms."""
    resolved = resolve(target)
    folded, _ = fold_weights(mod)
    prepared = prepare(folded, resolved.tvm, fold=False)
    plan = plan_module(prepared, resolved.desc, FusionConfig.resolve(), "main",
                       compile_target=resolved.tvm)
    graph = build_graph(prepared, "main")
    out = []
    for members in plan.groups:
        f = group_features(graph, members)
        if f.schedule_on("cpu") != ScheduleClass.CONTRACTION_CHAIN.value:
            continue
        ordered = sorted(members, key=lambda n: graph[n].index)
        contractions = [i for i, n in enumerate(ordered)
                        if group_features(graph, [n]).n_contractions]
        cut = contractions[1]
        out.append((ordered, ordered[:cut], ordered[cut:]))
    return out, graph, resolved.desc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-measure", action="store_true")
    ap.add_argument("--json", help="append one JSON row per pair to this file")
    args = ap.parse_args()
    register_config_keys()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    rows = []
    for name in args.models:
        mod, inputs, _ = corpus.load(name)
        with chains_taken():
            pairs, graph, desc = _pairs(mod, target)
        measured = {} if args.no_measure else time_both(mod, inputs, target, args.runs,
                                                        args.rounds)[0]
        print(f"{name}, {args.threads} thread(s), load {os.getloadavg()[0]:.2f}")
        print(f"  {'pair':<22} {'pred chain':>10} {'pred split':>10} {'pred s/c':>8} "
              f"{'meas chain':>10} {'meas split':>10} {'meas s/c':>8}")
        for members, first, second in pairs:
            est = {k: estimate(group_features(graph, m), desc)
                   for k, m in (("chain", members), ("a", first), ("b", second))}
            pred_split = est["a"].seconds + est["b"].seconds
            f = group_features(graph, members)
            w = [w for w in f.op_work if w.contraction]
            g0, g1 = w[0].geometry, w[1].geometry
            pixels = g0.gemm.n * (g0.gemm.height or 1)
            shape = (f"{g0.k}->{g0.gemm.m} {math.isqrt(pixels)}^2 "
                     f"k{g1.k} s{g1.depthwise}")
            convs = [graph[n].prim_func for n in members if "conv2d" in graph[n].prim_func]
            row = {"model": name, "threads": args.threads, "shape": shape, "k_in": g0.k,
                   "mid": g0.gemm.m, "pixels": pixels, "taps": g1.k, "stride": g1.depthwise,
                   "dw_elems": w[1].elems,
                   "pred": {k: e.seconds for k, e in est.items()},
                   "breakdown": {k: dict(e.breakdown) for k, e in est.items()}}
            line = (f"  {shape:<22} {est['chain'].seconds * 1e6:10.1f} {pred_split * 1e6:10.1f} "
                    f"{pred_split / est['chain'].seconds:8.2f}")
            if measured:
                kc = [k for k in measured["chain"] if re.search(
                    rf"_{convs[0]}_.*_{convs[1]}(_|$)", k) and k.count("conv2d") == 2]
                ka = [k for k in measured["split"] if re.match(rf"fused_{convs[0]}(_|$)", k)]
                kb = [k for k in measured["split"] if re.match(rf"fused_{convs[1]}(_|$)", k)]
                if len(kc) == 1 and len(ka) == 1 and len(kb) == 1:
                    mc = measured["chain"][kc[0]]
                    ma, mb = measured["split"][ka[0]], measured["split"][kb[0]]
                    row["meas"] = {"chain": mc, "a": ma, "b": mb}
                    line += f" {mc * 1e6:10.1f} {(ma + mb) * 1e6:10.1f} {(ma + mb) / mc:8.2f}"
                else:
                    line += f"  kernels not matched ({len(kc)}, {len(ka)}, {len(kb)})"
            print(line)
            rows.append(row)
    if args.json:
        with open(args.json, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
