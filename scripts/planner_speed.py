"""Planning cost: seconds to plan synthetic graphs of 1k and 10k ops (greedy, analytical model).

    python scripts/planner_speed.py
"""

from __future__ import annotations

import time

from tvm_costfuse import FusionConfig, plan_greedy
from tvm_costfuse.targets import preset
from tvm_costfuse.testing import random_dag


def main() -> None:
    for target in ("host", "h100"):
        for n in (1000, 10000):
            graph = random_dag(n, seed=1)
            start = time.perf_counter()
            plan = plan_greedy(graph, preset(target), FusionConfig())
            elapsed = time.perf_counter() - start
            print(f"{target:<5} {n:>6} ops -> {plan.kernels():>5} kernels in {elapsed:6.2f} s")


if __name__ == "__main__":
    main()
