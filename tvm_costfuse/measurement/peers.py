"""Timing the peers a user compares with, at a given thread count: PyTorch eager,
``torch.compile`` and ONNX Runtime, and our own VM under a sized thread pool.

Every sampler returns the seconds of one sample (``timing.interleave`` takes them), so that
our columns and the peers' are sampled in the same rounds. Equal threads is the rule of every
comparison: TVM's pool, ``torch.set_num_threads`` and ORT's ``intra_op_num_threads`` are each
set to the same count right before their sample (TVM's pool and torch's are process-wide).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .placement import launch_probe, near_rounds, probed
from .quiet import OtherLoad
from .timing import call_sampler, interleave, thread_pool, vm_sampler

__all__ = ["SAMPLE_MS", "SETTLE_S", "compiled_call", "eager_sampler", "first_output",
           "ort_session", "thread_pool", "with_threads"]

#: One sample lasts at least this long (back-to-back calls, averaged).
SAMPLE_MS = 50

#: Pause before each sample when columns of different runtimes alternate. Each runtime's
#: pool (ONNX Runtime's, PyTorch's OpenMP, TVM's) spins for a while after a call; at 2 threads
#: on 2 cores the column sampled next then shares its cores with the spinning threads. Without
#: the pause ONNX Runtime's 2-thread decode steps read 2.2-3.3x slower than with it (qwen2
#: 128 past 6.33 against 2.16 ms, gpt2 1024 8.03 against 2.42; znver4, 2026-12-06), slower
#: than at 1 thread; 0.3 s lets every pool park.
SETTLE_S = 0.3


def with_threads(sample: Callable[[], float], threads: int) -> Callable[[], float]:
    """A TVM sampler run with the thread pool sized ``threads``."""

    def timed() -> float:
        thread_pool(threads)
        return sample()

    return timed


def time_builds(builds: dict[str, list], inputs, threads: int, repeat: int,
                dropped: list[int] | None = None) -> tuple[dict[str, list[float]], float]:
    """Every build of every variant (``{variant: [executable, ...]}``) timed in the same
    interleaved rounds at ``threads`` threads: per variant, each build's median (ms), and the
    cores other processes used meanwhile. Builds of one plan differ (where each library lands
    in memory), so a variant's time is read over its builds, not from one.

    At 2+ threads a launch probe (``placement``) runs before each sample, and the rounds in
    which any sample was taken with the CPUs apart are left out: a stretch apart slows plans of
    many small kernels more than others, so it does not cancel across a round's columns.
    ``dropped`` (where given) gets how many samples were left out. A run apart throughout
    keeps every round (no near probe to tell it)."""
    thread_pool(threads)
    samplers = {f"{k}#{b}": with_threads(vm_sampler(ex, inputs), threads)
                for k, exs in builds.items() for b, ex in enumerate(exs)}
    probes: dict[str, list[float]] = {}
    if threads >= 2:
        probe = launch_probe(threads)
        samplers = {key: probed(s, probe, probes.setdefault(key, []))
                    for key, s in samplers.items()}
    with OtherLoad() as load:
        got = interleave(samplers, repeat)
    got, left_out = near_rounds(got, probes)
    if dropped is not None:
        dropped.append(left_out)
    return ({k: [float(np.median(got[f"{k}#{b}"])) * 1e3 for b in range(len(exs))]
             for k, exs in builds.items()}, load.cores)


def eager_sampler(call: Callable[[], object], threads: int) -> Callable[[], float]:
    """One sample: the mean of back-to-back PyTorch calls over :data:`SAMPLE_MS` at
    ``threads`` threads, in inference mode."""
    import torch

    calls = call_sampler(call, SAMPLE_MS)

    def sample() -> float:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            return calls()

    return sample


def compiled_call(module, args: tuple, threads: int) -> Callable[[], object]:
    """``torch.compile`` (Inductor, CPU) of ``module`` called on ``args``, compiled at
    ``threads`` threads: Inductor's CPU kernels take the thread count at compile time, so each
    thread count gets its own compilation (``torch._dynamo.reset`` drops the previous one).
    Compiled here, by a first call, so that no timed sample pays for it."""
    import torch

    torch.set_num_threads(threads)
    torch._dynamo.reset()
    fn = torch.compile(module)
    with torch.inference_mode():
        fn(*args)
    return lambda: fn(*args)


def ort_session(path: str, threads: int):
    """An ONNX Runtime CPU session on the file at ``path`` with ``threads`` intra-op threads
    (and one inter-op thread: the graph's ops run one after another, as ours do)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def first_output(out) -> np.ndarray:
    """The first tensor of a model's output (nested tuples and lists), as NumPy."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out.detach().numpy() if hasattr(out, "detach") else np.asarray(out)
