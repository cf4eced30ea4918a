"""Each channel chain of a CNN timed inside the model against its two kernels: the model built
with every pair the chain card claims fused (its 1x1 conv priced as the standalone tile, so the
planner takes them all) and with FuseOps' grouping, per-kernel seconds per call in alternating
runs of one process (``fusion_bound._kernel_seconds``), chain against the sum of its halves::

    python3 lab/chain_in_model.py efficientnet_b0 mobilenet_v2 --threads 1
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from contextlib import contextmanager

import numpy as np
import tvm

sys.path.insert(0, os.path.dirname(__file__))
from conv_roofline import _shapes
from fusion_bound import _kernel_seconds
from tvm_costfuse.schedules import chain

from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import fuse
from tvm_costfuse.strategies import fusion_pass, strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target


def _per_call(ex, mod, strategy, target, inputs, runs):
    calls = {k: v[1] for k, v in _shapes(fuse(mod, target, fusion_pass(strategy, target))).items()}
    seconds = _kernel_seconds(ex, inputs, runs)
    return {k: s / calls.get(k, 1) for k, s in seconds.items()}, calls


@contextmanager
def chains_taken():
    """The chain card's 1x1 conv priced as its standalone kernel, so the planner chains
    (nearly) every pair the card claims; the card as it was afterwards."""
    card = chain.CHAIN_CARD
    saved = card.share
    object.__setattr__(card, "share", lambda *a: None)
    try:
        yield
    finally:
        object.__setattr__(card, "share", saved)


def time_both(mod, inputs, target, runs: int, rounds: int):
    """({"chain": ..., "split": ...} median seconds per call of each kernel, the chained
    build's calls per kernel): CostFuse's build (under :func:`chains_taken`, the chains) and
    FuseOps', timed in alternating rounds."""
    with chains_taken():
        builds = {"chain": (tvm.compile(mod, target,
                                        relax_pipeline=strategy_pipeline("costfuse", target),
                                        tir_pipeline=tir_pipeline()), "costfuse")}
    builds["split"] = (tvm.compile(mod, target, relax_pipeline=strategy_pipeline("tvm", target),
                                   tir_pipeline=tir_pipeline()), "tvm")
    per = {key: [] for key in builds}
    for _ in range(rounds):
        for key, (ex, strategy) in builds.items():
            per[key].append(_per_call(ex, mod, strategy, target, inputs, runs))
    medians = {key: {k: float(np.median([r[0][k] for r in runs_])) for k in runs_[0][0]}
               for key, runs_ in per.items()}
    return medians, per["chain"][0][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    for name in args.models:
        mod, inputs, _ = corpus.load(name)
        medians, calls = time_both(mod, inputs, target, args.runs, args.rounds)
        chain_t, split_t = medians["chain"], medians["split"]
        print(f"{name}, {args.threads} thread(s), load {os.getloadavg()[0]:.2f}")
        ratios = []
        for kernel, seconds in sorted(chain_t.items(), key=lambda kv: -kv[1]):
            parts = re.match(r"(fused_conv2d\d+_.*?)_(conv2d\d+_.*)$", kernel)
            if not parts or kernel.count("conv2d") != 2:
                continue
            first, second = parts.group(1), "fused_" + parts.group(2)
            if first not in split_t or second not in split_t:
                print(f"  {kernel}: halves not found")
                continue
            split = split_t[first] + split_t[second]
            ratios.append(split / seconds)
            print(f"  {seconds * 1e6:8.1f} us chain  {split * 1e6:8.1f} us split  "
                  f"split/chain {ratios[-1]:5.2f}  x{calls.get(kernel, 1)}  {kernel}")
        if ratios:
            print(f"  geomean split/chain {float(np.exp(np.mean(np.log(ratios)))):.3f} "
                  f"over {len(ratios)} pairs")


if __name__ == "__main__":
    main()
