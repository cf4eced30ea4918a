"""Greedy vs exact planning on graphs small enough to solve exactly.

Random synthetic DAGs with 6-9 units (``tvm_costfuse.testing.random_dag``: chains with fan-in;
``branchy_dag``: diamonds, siblings, mixed sizes) and the small zoo models
of at most 9 units, on host and H100: the predicted cost of the greedy plan and of the exact
optimum (same cost model), and the gap (greedy / exact - 1).

    python lab/planner_gap.py [--seeds 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tvm_costfuse import FusionConfig, build_graph, models, plan_exact, plan_greedy
from tvm_costfuse import testing as synthetic
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.planner import initial_units
from tvm_costfuse.targets import preset

MAX_UNITS = 9


def graphs(seeds: int):
    """(label, OpGraph) for every graph compared."""
    for n in range(6, MAX_UNITS + 1):
        for seed in range(seeds):
            yield f"random n={n} seed={seed}", synthetic.random_dag(n, seed=seed, fan_in=0.5)
            yield f"branchy n={n} seed={seed}", synthetic.branchy_dag(n, seed=seed)
    for name in models.zoo.names():
        graph = build_graph(prepare(models.load(name, small=True)[0]))
        if len(initial_units(graph)) <= MAX_UNITS:
            yield f"zoo {name}", graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="random graphs per size")
    args = parser.parse_args(argv)
    config = FusionConfig()
    cases = list(graphs(args.seeds))
    print(f"{'graph':<28} {'units':>5} {'target':<6} {'greedy us':>10} {'exact us':>10} "
          f"{'gap %':>7} {'k g/e':>6} {'exact s':>8}")
    gaps: dict[str, list[float]] = {}
    for target_name in ("host", "h100"):
        target = preset(target_name)
        for label, graph in cases:
            greedy = plan_greedy(graph, target, config)
            start = time.perf_counter()
            exact = plan_exact(graph, target, config, max_units=MAX_UNITS)
            exact_s = time.perf_counter() - start
            gap = greedy.seconds / exact.seconds - 1
            kind = label.split()[0]
            gaps.setdefault(f"{kind:<7} {target_name}", []).append(gap)
            print(f"{label:<28} {len(initial_units(graph)):>5} {target_name:<6} "
                  f"{greedy.seconds * 1e6:>10.2f} {exact.seconds * 1e6:>10.2f} "
                  f"{100 * gap:>7.2f} {greedy.kernels():>2}/{exact.kernels():<3} {exact_s:>8.2f}")
    print()
    print(f"{'set':<13} {'graphs':>6} {'mean gap %':>10} {'max gap %':>10} {'optimal':>8}")
    for key, values in gaps.items():
        optimal = sum(v <= 1e-9 for v in values)
        print(f"{key:<13} {len(values):>6} {100 * statistics.fmean(values):>10.2f} "
              f"{100 * max(values):>10.2f} {optimal:>5}/{len(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
