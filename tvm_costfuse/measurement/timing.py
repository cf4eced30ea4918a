"""Build, run and time Relax modules on the VM: the ground truth every claim rests on.

One place decides how outputs are flattened and compared and how time is taken, so that tests,
the demo and benchmark scripts measure the same way (warm-up, repeats, median).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..pipelines import build_pipeline
from ..schedules.lowering import TIR_PIPELINE


def build(
    mod: tvm.IRModule,
    target: tvm.target.Target | str = "llvm",
    fusion: tvm.transform.Pass | None = None,
    schedule: tvm.transform.Pass | None = None,
    fold: bool = True,
    tir: str = TIR_PIPELINE,
) -> tvm.runtime.Executable:
    """Compile ``mod`` with TVM's pipeline, ``fusion`` in place of FuseOps (None: no fusion),
    weight-only work folded first unless ``fold=False``; ``tir``: the TIR pipeline (ours,
    ``schedules/lowering.py``, or TVM's ``"default"`` for a reference build)."""
    target = tvm.target.Target(target)
    return tvm.compile(mod, target=target,
                       relax_pipeline=build_pipeline(target, fusion, schedule, fold),
                       tir_pipeline=tir)


def _flatten(value) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, Sequence | tvm_ffi.Array):
        return [a for v in value for a in _flatten(v)]
    raise TypeError(f"unexpected VM output of type {type(value).__name__}")


def run(
    ex: tvm.runtime.Executable, inputs: Mapping[str, np.ndarray], device=None,
    calls: list[str] | None = None,
) -> list[np.ndarray]:
    """Run ``main`` once; returns every output tensor as NumPy, tuples flattened in order.

    ``calls``: a list that receives, in order, the kernels this run launches -- read from the
    built executable (VM call instructions other than the VM's own ``vm.*`` builtins), not
    from a plan. A library call (``call_dps_packed``: no zoo model has one) would count too.
    """
    device = device or tvm.cpu()
    vm = relax.VirtualMachine(ex, device)
    if calls is not None:

        def instrument(_func, symbol, before_run, _ret, *_args) -> int:
            if before_run and not symbol.startswith("vm."):
                calls.append(symbol)
            return 0  # VMInstrumentReturnKind.kNoOp: run the call as usual

        vm.set_instrument(instrument)
    args = [tvm.runtime.tensor(v, device) for v in inputs.values()]
    return _flatten(vm["main"](*args))


def kernel_calls(
    ex: tvm.runtime.Executable, inputs: Mapping[str, np.ndarray], device=None
) -> list[str]:
    """The kernels one run of ``main`` launches, in order (see :func:`run`)."""
    calls: list[str] = []
    run(ex, inputs, device, calls)
    return calls


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


# Runs shorter than this are re-warmed before each timed sample (see interleaved_medians).
_REWARM_BELOW_S = 0.2


def interleaved_medians(
    executables: Mapping[str, tvm.runtime.Executable],
    inputs: Mapping[str, np.ndarray],
    repeat: int = 7,
    device=None,
) -> dict[str, float]:
    """Median seconds per variant of :func:`interleaved_samples`."""
    samples = interleaved_samples(executables, inputs, repeat, device)
    return {k: float(np.median(x)) for k, x in samples.items()}


Sampler = Callable[[], float]


def thread_pool(threads: int) -> None:
    """Size TVM's CPU thread pool (mode 1 = "big" cores: all of them on a symmetric CPU)."""
    tvm.get_global_func("runtime.config_threadpool")(1, threads)


def vm_sampler(ex: tvm.runtime.Executable, inputs: Mapping[str, np.ndarray], device=None,
               min_ms: int = 50) -> Sampler:
    """A callable taking one timing sample (seconds per call) of ``ex``'s ``main``: one
    ``time_evaluator`` batch of >= ``min_ms`` ms of back-to-back calls, averaged.

    A variant faster than ``_REWARM_BELOW_S`` gets one untimed call before each sample:
    otherwise the variant timed right after a long one pays for the caches that run flushed
    (seen as a steady 9% penalty).
    """
    device = device or tvm.cpu()
    vm = relax.VirtualMachine(ex, device)
    args = [tvm.runtime.tensor(v, device) for v in inputs.values()]
    timer = vm.time_evaluator("main", device, number=1, repeat=1, min_repeat_ms=min_ms)
    start = time.perf_counter()
    vm["main"](*args)
    rewarm = time.perf_counter() - start < _REWARM_BELOW_S

    def sample() -> float:
        if rewarm:
            vm["main"](*args)
        return float(timer(*args).mean)

    return sample


def call_sampler(fn: Callable[[], object], min_ms: int = 50) -> Sampler:
    """A sampler for any callable (PyTorch, ONNX Runtime...): one sample is the mean of
    back-to-back calls over >= ``min_ms`` ms, after one untimed call that re-warms the caches
    the previously sampled variant flushed."""

    def sample() -> float:
        fn()
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed * 1e3 >= min_ms:
                return elapsed / calls

    return sample


def interleave(samplers: Mapping[str, Sampler | Sequence[Sampler]], repeat: int,
               settle_s: float = 0.0, runtime: Callable[[str], str] | None = None
               ) -> dict[str, list[float]]:
    """``repeat`` rounds; each round samples every sampler of every variant once, so the drift
    of a shared machine hits all variants alike. A variant may have several samplers (builds,
    or peers such as PyTorch); all their samples are its. Where ``runtime(variant)`` names
    the runtime a variant runs in, the machine idles ``settle_s`` before the first sample and
    before each sample that follows another runtime's (that runtime's pool may still spin:
    ``measurement.peers.SETTLE_S``)."""
    groups = {k: list(v) if isinstance(v, Sequence) else [v] for k, v in samplers.items()}
    samples: dict[str, list[float]] = {k: [] for k in groups}
    last = None
    for _ in range(repeat):
        for k, group in groups.items():
            now = runtime(k) if runtime is not None else None
            for sample in group:
                if now != last:
                    time.sleep(settle_s)
                last = now
                samples[k].append(sample())
    return samples


def interleaved_samples(
    executables: Mapping[str, tvm.runtime.Executable],
    inputs: Mapping[str, np.ndarray],
    repeat: int = 7,
    device=None,
) -> dict[str, list[float]]:
    """``repeat`` samples (seconds) per executable, measured side by side (:func:`interleave`
    of :func:`vm_sampler`)."""
    return interleave({k: vm_sampler(ex, inputs, device) for k, ex in executables.items()},
                      repeat)


def max_mismatch(
    want: Sequence[np.ndarray], got: Sequence[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> float:
    """Largest |got - want| / (atol + rtol |want|) over all outputs; <= 1 means allclose."""
    if len(want) != len(got):
        return math.inf
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        if w.shape != g.shape:
            return math.inf
        worst = max(worst, float(np.max(np.abs(g - w) / (atol + rtol * np.abs(w)), initial=0.0)))
    return worst


#: Largest :func:`scaled_error` that counts as the same result: float reassociation across
#: fusions and the polynomial exp/erf/tanh stay well under it; a wrong kernel is off by O(1).
SCALED_TOLERANCE = 1e-4


def scaled_error(got: np.ndarray, want: np.ndarray, floor: float = 1e-30) -> float:
    """max |got - want| relative to the largest |want|, or to ``floor`` where that is larger:
    the outputs of deep random-weight models are O(0.01)-O(1), and a per-element rtol would
    judge rounding noise near zero. ``floor`` is for outputs that cancel to (nearly) zero,
    such as ``mean(mean(x)) - mean(x)``: against an exact 0 any other rounding (a fused
    multiply-add where the reference rounds the product) is an infinite relative error."""
    if not want.size:
        return 0.0
    if (np.isnan(got) != np.isnan(want)).any():
        return math.inf  # a NaN on one side only: max() would drop it
    same = (got == want) | np.isnan(want)  # equal infinities and NaNs on both sides agree
    with np.errstate(invalid="ignore"):  # inf - inf where ``same`` already holds
        diff = np.where(same, 0.0, np.abs(got - want))
    return float(diff.max()) / max(float(np.nanmax(np.abs(want), initial=0.0)), floor)


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: the figure of merit across models."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan
