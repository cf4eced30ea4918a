"""A/B of 2 MiB pages under a model's weights: the same plan built twice in one process, one
build's memory left in 4 KiB pages, the other's collapsed (``tvm_costfuse.huge_pages``), timed
in interleaved rounds (``measurement.peers.time_builds``) and compared for numerics::

    python lab/huge_pages_ab.py --models qwen2_decode1024 llama_decode128 --threads 1 2

The 4 KiB build is built first and every chunk resident by then is left alone, so the second
build's constants (imported weights, compile-time packed panels) are what moves; the bytes that
moved are printed beside the timings (memory the second build reused from the first one's
freed compile buffers stays in 4 KiB pages, so the effect is if anything understated).
``--control`` collapses nothing: the two builds' own spread, the noise floor of the A/B.
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax

from tvm_costfuse import huge_pages
from tvm_costfuse.measurement.peers import time_builds
from tvm_costfuse.measurement.timing import run
from tvm_costfuse.models import corpus
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target


def _build(name: str, strategy: str, target):
    mod, inputs, _ = corpus.load(name)
    ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(strategy, target))
    relax.VirtualMachine(ex, tvm.cpu())  # constants resident before the snapshot
    return ex, inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--strategy", default="costfuse")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--builds", type=int, default=1,
                    help="compilations per side: a side's time is their median, and the "
                         "spread between them is printed (does the page size set it?)")
    ap.add_argument("--control", action="store_true",
                    help="collapse nothing: the two builds' own spread")
    args = ap.parse_args()
    for name in args.models:
        target = host_target(max(args.threads))
        small = [_build(name, args.strategy, target) for _ in range(args.builds)]
        inputs = small[0][1]
        small = [ex for ex, _ in small]
        ref = run(small[0], inputs)
        keep = frozenset(huge_pages.resident_chunks())
        huge = [_build(name, args.strategy, target)[0] for _ in range(args.builds)]
        moved = (huge_pages.Collapsed(0, "--control") if args.control
                 else huge_pages.collapse(keep=keep))
        for ex in [*small[1:], *huge]:
            for a, b in zip(ref, run(ex, inputs), strict=True):
                np.testing.assert_array_equal(a, b)
        print(f"{name}: {moved.describe()}")
        for threads in args.threads:
            ms, load = time_builds({"4k": small, "2m": huge}, inputs, threads, args.repeat)
            a, b = float(np.median(ms["4k"])), float(np.median(ms["2m"]))
            spread = {k: max(v) / min(v) - 1 for k, v in ms.items()}
            print(f"  {threads} thread(s): 4 KiB {a:.3f} ms, 2 MiB {b:.3f} ms, {a / b:.2f}x; "
                  f"builds 4 KiB {' '.join(f'{x:.3f}' for x in ms['4k'])} (spread "
                  f"{spread['4k']:.1%}), 2 MiB {' '.join(f'{x:.3f}' for x in ms['2m'])} (spread "
                  f"{spread['2m']:.1%}); other load {load:.2f} cores", flush=True)


if __name__ == "__main__":
    main()
