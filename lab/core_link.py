"""Whether 2-thread timings on this host follow how far apart its two CPUs are: the round trip
of one cache line between CPU 0 and CPU 1, taken before each 2-thread sample of some models.

On a 2-vCPU cloud host the hypervisor may place the two vCPUs on cores that share a last-level
cache or on cores that do not (another CCD of an EPYC), and move them while a run goes on. A
TVM kernel split over both threads then hands each kernel's output to the other core through
the fabric instead of a shared cache, and models of many small parallel kernels run 1.7-2.5x
slower than a moment before (docs/log/2026-12-07c.md). Python cannot time a cache-line round
trip, so a 20-line C program does (built with the host's ``cc``; none is needed elsewhere)::

    python3 lab/core_link.py squeezenet1_1 shufflenet_v2_x1_0 mnasnet1_0 --rounds 25

``--launch`` also times, in each round, the parallel-launch probe that ``costfuse bench``
reads the placement from (``measurement.placement.LaunchProbe``): the check that it tells
the two placements apart as the round trip does.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import tvm

from tvm_costfuse import models
from tvm_costfuse.measurement.peers import thread_pool, with_threads
from tvm_costfuse.measurement.placement import LaunchProbe
from tvm_costfuse.measurement.timing import vm_sampler
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target

# One thread on CPU 0 and one on CPU 1 pass a flag back and forth N times.
PING_PONG = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
static _Atomic int flag __attribute__((aligned(64)));
enum { N = 200000 };
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void *other(void *a) { pin(1); for (int i = 0; i < N; i++) {
    while (atomic_load_explicit(&flag, memory_order_acquire) != 1) {}
    atomic_store_explicit(&flag, 0, memory_order_release); } return a; }
int main(void) { pin(0); pthread_t t; pthread_create(&t, 0, other, 0);
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < N; i++) { atomic_store_explicit(&flag, 1, memory_order_release);
        while (atomic_load_explicit(&flag, memory_order_acquire) != 0) {} }
    clock_gettime(CLOCK_MONOTONIC, &b); pthread_join(t, 0);
    printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / N); return 0; }
"""


def round_trip_timer(workdir: Path):
    """A callable returning the CPU 0 <-> CPU 1 cache-line round trip in ns."""
    src, exe = workdir / "ping_pong.c", workdir / "ping_pong"
    src.write_text(PING_PONG)
    subprocess.run(["cc", "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    return lambda: float(subprocess.run([str(exe)], capture_output=True, text=True,
                                        check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--strategy", default="tvm")
    ap.add_argument("--launch", action="store_true", help="time the launch probe too")
    args = ap.parse_args()
    target = host_target(2)
    thread_pool(2)
    samplers = {}
    for name in args.models:
        mod, inputs = models.load(name)
        ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline(args.strategy, target),
                         tir_pipeline=tir_pipeline(args.strategy))
        samplers[name] = with_threads(vm_sampler(ex, inputs), 2)
    with tempfile.TemporaryDirectory() as tmp:
        round_trip = round_trip_timer(Path(tmp))
        probe = LaunchProbe(2) if args.launch else None
        print("round trip ns  " + ("launch us  " if probe else "")
              + "  ".join(f"{n} ms @2" for n in samplers))
        for _ in range(args.rounds):
            ns = round_trip()
            launch = f"{probe() * 1e6:9.2f}  " if probe else ""
            print(f"{ns:13.0f}  {launch}" + "  ".join(f"{s() * 1e3:.2f}"
                                                   for s in samplers.values()), flush=True)


if __name__ == "__main__":
    main()
