"""One kernel of our schedules, built and timed alone: what the calibration's kernel figures
(``depthwise_shares``, ``gather``) measure.

A Relax program of one operator (or of two that FuseOps makes one kernel of) goes through
FuseOps' pipeline with our schedules (so the kernel is the one a model gets for it), and its
one PrimFunc is compiled and timed without the VM: a VM call adds microseconds of dispatch
that a share of the peak must not count.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

_log = logging.getLogger(__name__)


class Kernel(NamedTuple):
    """A compiled PrimFunc, its name and its buffers' shapes (inputs, then the output)."""

    module: object
    name: str
    shapes: list[list[int]]


def one_kernel(mod: tvm.IRModule, target: tvm.target.Target) -> Kernel:
    """The scheduled PrimFunc FuseOps' pipeline builds for ``mod``, compiled alone; an error
    where the program builds as more kernels than one."""
    from ..pipelines import scheduled_pipeline  # the schedules import the cost side
    from ..schedules.lowering import TIR_PIPELINE

    with target:
        lowered = scheduled_pipeline(target, relax.transform.FuseOps(), fold=False)(mod)
    funcs = [(gv.name_hint, f) for gv, f in lowered.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    if len(funcs) != 1:
        raise RuntimeError(f"a one-operator program built as {len(funcs)} kernels, not one")
    name, func = funcs[0]
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]  # BufferType parameters
    built = tvm.compile(tvm.IRModule({name: func.with_attr("global_symbol", name)}),
                        target=target, tir_pipeline=TIR_PIPELINE)
    return Kernel(built.mod, name, shapes)


def kernel_seconds(kernel: Kernel, repeat: int, min_repeat_ms: int) -> float:
    """Median seconds of one call, its operands resident after a warm-up call."""
    rng = np.random.default_rng(1)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in kernel.shapes]
    kernel.module[kernel.name](*args)
    timer = kernel.module.time_evaluator(kernel.name, tvm.cpu(), number=1, repeat=repeat,
                                         min_repeat_ms=min_repeat_ms)
    return float(np.median(timer(*args).results))


def optional_figures(name: str, measure, *args) -> dict:
    """``measure(*args)``'s figures, or none where building or timing its kernels fails (a TVM
    that lowers them otherwise, a target the schedules decline): the host then prices those
    kernels with the fitted defaults, and the rest of the calibration record stands. A notice
    names what failed."""
    try:
        return measure(*args)
    except Exception as err:  # noqa: BLE001 -- any failure leaves the figure to its default
        _log.warning("calibration: %s not measured (%s: %s); its default prices it", name,
                     type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return {}
