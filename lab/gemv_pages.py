"""One GEMV schedule and the calibration's stream kernel, each over buffers in 4 KiB pages and
over the same buffers' twins moved to 2 MiB pages (``tvm_costfuse.huge_pages``), interleaved.

The GEMV is ``lab/gemv_streams.py``'s (the contraction rule's schedule for a one-row GEMV over a
panel-packed weight), its weight cycled through copies at least twice the last-level cache so
that every call reads DRAM; the stream is the calibration's ``B[i] = 2 * A[i]`` over 256 MiB.
A GEMV reads one sequential stream per core, and the page size is what limits it; a copy is two
streams, and it hardly moves::

    python lab/gemv_pages.py --k 768 --n 3072 --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import tvm
from tvm import relax

sys.path.insert(0, os.path.dirname(__file__))
from gemv_streams import PANEL, _cycled, gemv

from tvm_costfuse import huge_pages
from tvm_costfuse.measurement.calibrate import DRAM_STREAM_BYTES, stream_timer
from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import interleave
from tvm_costfuse.targets import host_target, isa, resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    target = host_target(args.threads)
    thread_pool(args.threads)
    desc = resolve(target).desc
    rng = np.random.default_rng(0)
    x = tvm.runtime.tensor(rng.standard_normal(args.k, dtype=np.float32))
    w = rng.standard_normal((args.n // PANEL, args.k, PANEL), dtype=np.float32)
    copies = max(1, -(-2 * (desc.l3_bytes or desc.l2_bytes) // w.nbytes))
    vm = relax.VirtualMachine(tvm.compile(_cycled(gemv(args.k, args.n, 1), copies, args),
                                          target=target), tvm.cpu())
    timer = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=1)
    lanes = isa.vector_bits(target) // 32
    small = [tvm.runtime.tensor(w) for _ in range(copies)]
    moved, stream_small = stream_timer(DRAM_STREAM_BYTES, lanes, args.threads, target)
    stream_small(1, 20)
    keep = frozenset(huge_pages.resident_chunks())  # the 4 KiB side stays as it is
    huge = [tvm.runtime.tensor(w) for _ in range(copies)]
    _, stream_huge = stream_timer(DRAM_STREAM_BYTES, lanes, args.threads, target)
    stream_huge(1, 20)
    print(huge_pages.collapse(keep=keep).describe())
    out = [o.numpy() for o in vm["main"](x, *huge)]
    ref = [o.numpy() for o in vm["main"](x, *small)]
    np.testing.assert_array_equal(out[0], ref[0])
    got = interleave({"gemv 4k": lambda: timer(x, *small).mean / copies,
                      "gemv 2m": lambda: timer(x, *huge).mean / copies,
                      "stream 4k": lambda: stream_small(1, 20),
                      "stream 2m": lambda: stream_huge(1, 20)}, args.repeat)
    sec = {k: float(np.median(v)) for k, v in got.items()}
    print(f"GEMV {args.k} x {args.n} ({w.nbytes / 2**20:.1f} MiB, {copies} copies cycled), "
          f"{args.threads} thread(s)")
    for pages in ("4k", "2m"):
        g, s = sec[f"gemv {pages}"], sec[f"stream {pages}"]
        print(f"  {pages}: GEMV {g * 1e6:7.1f} us {w.nbytes / g / 1e9:5.1f} GB/s; stream "
              f"{moved / s / 1e9:5.1f} GB/s (read + written); GEMV / stream "
              f"{w.nbytes / g / (moved / s):.2f}")
    print(f"  2 MiB pages: GEMV {sec['gemv 4k'] / sec['gemv 2m']:.2f}x, stream "
          f"{sec['stream 4k'] / sec['stream 2m']:.2f}x")


if __name__ == "__main__":
    main()
