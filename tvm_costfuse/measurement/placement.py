"""Whether this process's CPUs sat near each other while a multi-thread sample was taken.

On a cloud host the hypervisor may place two vCPUs on cores that share a last-level cache or
on cores that do not, and move them within a run. On the 2-vCPU EPYC of
docs/log/2026-12-07c.md the round trip of a cache line between them went from 52-75 ns to
333-351 ns for stretches of seconds to minutes, and models of many small parallel kernels ran
1.7-2.5x slower at 2 threads meanwhile; the FMA peak and one-thread runs do not see it.
Interleaved rounds cancel such a stretch only where it covers every column alike.

Python cannot time a cache-line round trip, but TVM's thread pool pays it on every parallel
launch (waking the workers and joining them): a chain of tiny parallel kernels took 0.91-0.94
us per launch with the CPUs near and 1.74-1.92 us with them apart (means per minute), and a
launch over 1.25 us agreed with a 2-thread model sample over 6 ms in all but 4 of 1550 rounds
(same host). :class:`LaunchProbe` times that chain (a few ms a call); a sample is read as
taken *apart* where the probe just before it took more than :data:`APART_RATIO` times the
fastest probe of the rows read together at that thread count (:func:`apart`). A run spent
entirely apart has no near probe to compare with and is not flagged.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..targets import host_target
from .calibrate import chain_module
from .timing import thread_pool

__all__ = ["APART_RATIO", "LaunchProbe", "apart", "launch_probe", "near_rounds", "probed"]

#: A probe this much slower than the fastest one reads "apart" (the two placements'
#: means 1.9x apart; near launches 0.89 us at the fastest, far ones 1.58 us at the fastest).
APART_RATIO = 1.4
_KERNELS = 64


class LaunchProbe:
    """Seconds per launch of a parallel tiny kernel on ``threads`` threads: the fastest of 5
    batches of 20 chains of 64 launches, as the monitor that set :data:`APART_RATIO` took it."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        dev = tvm.cpu()
        target = host_target(threads)
        self._x = tvm.runtime.tensor(np.zeros((threads, 16), "float32"), dev)
        self._vm = relax.VirtualMachine(
            tvm.compile(chain_module(_KERNELS, True, threads), target=target), dev)
        self._timer = self._vm.time_evaluator("main", dev, number=20, repeat=5)
        self()  # the first call pays the pool's start-up

    def __call__(self) -> float:
        thread_pool(self.threads)
        return min(self._timer(self._x).results) / _KERNELS


_PROBES: dict[int, LaunchProbe] = {}


def launch_probe(threads: int) -> LaunchProbe:
    """This process's :class:`LaunchProbe` at ``threads`` threads, built once: a build costs
    about a second, and ``costfuse regret`` and ``bench`` time several sets at one count."""
    if threads not in _PROBES:
        _PROBES[threads] = LaunchProbe(threads)
    return _PROBES[threads]


def probed(sample, probe: LaunchProbe, log: list[float]):
    """``sample`` with ``probe`` timed right before each call, its seconds appended to ``log``."""

    def timed() -> float:
        log.append(probe())
        return sample()

    return timed


def apart(probes: list[float], fastest: float) -> int:
    """How many of ``probes`` read as taken with the CPUs apart, against the ``fastest`` probe
    at that thread count."""
    return sum(p > APART_RATIO * fastest for p in probes)


def _far_rounds(probes: dict[str, list[float]]) -> set[int]:
    """The interleaved rounds (indices) in which any of ``probes`` (per key, one per round)
    read apart against the fastest of them all; none where nothing was probed."""
    if not any(probes.values()):
        return set()
    fastest = min(min(p) for p in probes.values() if p)
    return {r for p in probes.values() for r, t in enumerate(p) if t > APART_RATIO * fastest}


def near_rounds(samples: dict[str, list[float]], probes: dict[str, list[float]]
                ) -> tuple[dict[str, list[float]], int]:
    """``samples`` (per key, one per interleaved round) without the rounds in which any probe
    read apart against the fastest of all ``probes`` (each key's probes in its samples'
    order), and how many samples were left out. Whole rounds go, so every key keeps the same
    rounds; where every round read apart, or nothing was probed, all are kept."""
    for key, p in probes.items():
        if len(p) != len(samples[key]):
            raise ValueError(f"{key}: {len(p)} probes for {len(samples[key])} samples")
    rounds = len(next(iter(samples.values()), []))
    far = _far_rounds(probes)
    keep = [r for r in range(rounds) if r not in far]
    if not keep or len(keep) == rounds:
        return samples, 0
    return ({k: [xs[r] for r in keep] for k, xs in samples.items()},
            (rounds - len(keep)) * len(samples))
