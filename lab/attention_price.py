"""What the analytical model predicts for the cases of ``scripts/bench_attention.py``: the
fused attention group against the split groups ``[K^T] [Q K^T, scale, mask] [softmax] [P V]``,
on the host description (calibrated unless ``TVM_COSTFUSE_CALIBRATION=none``) at the given
thread count, to set beside the measured figures, and whether the greedy planner forms the
attention group on its own (``planner=attention``) or which groups it forms instead.

    python lab/attention_price.py --threads 1 1,8,4096,64,masked
"""

from __future__ import annotations

import argparse

import tvm_costfuse.measurement  # noqa: F401 -- registers the calibration measurement
from tvm_costfuse import FusionConfig, build_graph, plan_greedy
from tvm_costfuse.cost import analytical
from tvm_costfuse.cost.extract import group_features
from tvm_costfuse.targets import host
from tvm_costfuse.testing import attention_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="B,H,S,D,FORM[,ROWS]")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    target = host(args.threads)
    for case in args.cases:
        b, h, s, d, form, *rows = case.split(",")
        graph = build_graph(attention_program(*map(int, (b, h, s, d)), form,
                                              rows=int(rows[0]) if rows else None)[0])
        calls = [n.name for n in graph.nodes if n.kind == "call_tir"]
        softmax = next(i for i, n in enumerate(calls)
                       if graph[n].prim_func.startswith("softmax"))
        split = [calls[:1], calls[1:softmax], *([c] for c in calls[softmax:])]
        fused = group_features(graph, calls)
        t_fused = analytical.estimate(fused, target).seconds
        t_split = sum(analytical.estimate(group_features(graph, g), target).seconds
                      for g in split)
        groups = plan_greedy(graph, target, FusionConfig()).groups
        planned = ("attention" if any(set(g) == set(calls) for g in groups) else
                   " ".join("[" + ",".join(graph[n].prim_func for n in g) + "]" for g in groups))
        print(f"{case} threads={args.threads} class={fused.schedule_on('cpu')} "
              f"fused={t_fused * 1e3:.2f}ms split={t_split * 1e3:.2f}ms "
              f"split/fused={t_split / t_fused:.2f} planner={planned}")


if __name__ == "__main__":
    main()
