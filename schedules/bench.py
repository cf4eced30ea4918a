"""Build a Relax model three ways and compare outputs and time (used by scripts/bench_cpu.py).

Variants, all for the same LLVM target:

* ``stock``   -- ``relax.get_default_pipeline(target)``: FuseOps + FuseTIR, no schedule at all.
* ``fuseops`` -- :func:`cpu_pipeline` with FuseOps and our CPU schedule rules.
* ``nofuse``  -- :func:`cpu_pipeline` with no fusion pass (one kernel per op) and our rules.

All three are measured in one process, side by side, because the shared 2-core machine drifts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from . import cpu_pipeline


@tvm.transform.module_pass(opt_level=0, name="NoFusion")
def no_fusion(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """A fusion pass that groups nothing: FuseTIR then finds no Primitive function."""
    return mod


# Runs shorter than this are re-warmed before each timed sample (see interleaved_medians).
_REWARM_BELOW_S = 0.2

VARIANTS: dict[str, Callable[[tvm.target.Target], tvm.transform.Pass]] = {
    "stock": relax.get_default_pipeline,
    "fuseops": lambda t: cpu_pipeline(t),
    "nofuse": lambda t: cpu_pipeline(t, fusion_pass=no_fusion),
}


@dataclass(frozen=True)
class Built:
    """A compiled variant: its VM and how long compilation took."""

    vm: relax.VirtualMachine
    compile_s: float


def build(mod: tvm.IRModule, target: tvm.target.Target, variant: str) -> Built:
    """Compile ``mod`` with the named variant's pipeline into a VM on the CPU."""
    start = time.perf_counter()
    ex = tvm.compile(mod, target=target, relax_pipeline=VARIANTS[variant](target))
    return Built(relax.VirtualMachine(ex, tvm.cpu()), time.perf_counter() - start)


def _args(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> list:
    names = [p.name for p in mod["main"].params]
    return [tvm.runtime.tensor(inputs[n]) for n in names]


def _flatten(out) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [a for item in out for a in _flatten(item)]


def run(built: Built, mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``main`` once; every output (tuples flattened) as numpy."""
    return _flatten(built.vm["main"](*_args(mod, inputs)))


def interleaved_medians(
    built: dict[str, Built], mod: tvm.IRModule, inputs: dict[str, np.ndarray], repeat: int = 7
) -> dict[str, float]:
    """Median seconds per variant; rounds alternate between variants so drift hits all alike.

    Each round takes one ``vm.time_evaluator`` sample per variant (>= 50 ms of back-to-back
    calls, averaged). A variant faster than ``_REWARM_BELOW_S`` gets one untimed call before
    each sample: otherwise whichever variant follows a long (stock) run pays for the caches
    that run flushed -- seen as a steady 9% penalty on the variant timed right after stock.
    """
    args = _args(mod, inputs)
    timers = {
        v: b.vm.time_evaluator("main", tvm.cpu(), number=1, repeat=1, min_repeat_ms=50)
        for v, b in built.items()
    }
    rewarm = {}
    for v, b in built.items():
        start = time.perf_counter()
        b.vm["main"](*args)
        rewarm[v] = time.perf_counter() - start < _REWARM_BELOW_S
    samples: dict[str, list[float]] = {v: [] for v in built}
    for _ in range(repeat):
        for v, timer in timers.items():
            if rewarm[v]:
                built[v].vm["main"](*args)
            samples[v].append(float(timer(*args).mean))
    return {v: float(np.median(x)) for v, x in samples.items()}


def max_mismatch(ref: list[np.ndarray], got: list[np.ndarray], rtol: float, atol: float) -> float:
    """Largest |got - ref| / (atol + rtol |ref|) over all outputs; <= 1 means allclose."""
    worst = 0.0
    for r, g in zip(ref, got, strict=True):
        if r.shape != g.shape:
            return math.inf
        worst = max(worst, float(np.max(np.abs(g - r) / (atol + rtol * np.abs(r)), initial=0.0)))
    return worst


def geomean(values: list[float]) -> float:
    """Geometric mean (the figure of merit across models)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan
