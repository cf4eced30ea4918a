"""Build, run and time Relax modules on the VM: the ground truth every claim rests on.

One place decides how outputs are flattened and compared and how time is taken, so that tests,
the demo and benchmark scripts measure the same way (warm-up, repeats, median).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .passes import build_pipeline


def build(
    mod: tvm.IRModule,
    target: tvm.target.Target | str = "llvm",
    fusion: tvm.transform.Pass | None = None,
    schedule: tvm.transform.Pass | None = None,
) -> tvm.runtime.Executable:
    """Compile ``mod`` with TVM's pipeline, ``fusion`` in place of FuseOps (None: no fusion)."""
    target = tvm.target.Target(target)
    return tvm.compile(mod, target=target, relax_pipeline=build_pipeline(target, fusion, schedule))


def _flatten(value) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, Sequence | tvm_ffi.Array):
        return [a for v in value for a in _flatten(v)]
    raise TypeError(f"unexpected VM output of type {type(value).__name__}")


def run(
    ex: tvm.runtime.Executable, inputs: Mapping[str, np.ndarray], device=None
) -> list[np.ndarray]:
    """Run ``main`` once; returns every output tensor as NumPy, tuples flattened in order."""
    device = device or tvm.cpu()
    vm = relax.VirtualMachine(ex, device)
    args = [tvm.runtime.tensor(v, device) for v in inputs.values()]
    return _flatten(vm["main"](*args))


def count_kernels(mod: tvm.IRModule) -> int:
    """Number of PrimFuncs (kernels) in an IRModule, e.g. after FuseTIR."""
    return sum(1 for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc))


def median_seconds(
    ex: tvm.runtime.Executable,
    inputs: Mapping[str, np.ndarray],
    device=None,
    repeat: int = 5,
    min_repeat_ms: int = 100,
) -> float:
    """Median wall time of one ``main`` call: one warm-up, then ``repeat`` timed batches each
    long enough (``min_repeat_ms``) to swamp timer resolution."""
    device = device or tvm.cpu()
    vm = relax.VirtualMachine(ex, device)
    args = [tvm.runtime.tensor(v, device) for v in inputs.values()]
    vm["main"](*args)
    timer = vm.time_evaluator("main", device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return float(np.median(timer(*args).results))


def assert_close(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    """Outputs must agree within float reassociation tolerance, output by output."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            raise AssertionError(f"output {i}: shape {g.shape}, expected {w.shape}")
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")
