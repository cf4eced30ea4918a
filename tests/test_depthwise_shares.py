"""The calibration's depthwise kernels (``measurement/depthwise_shares.py``): what it times is
the kernel our rules build for a depthwise convolution of each layout, and it computes one."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_costfuse.measurement import depthwise_shares
from tvm_costfuse.measurement.kernel_time import one_kernel


def _reference(x, w, stride):
    """Depthwise convolution of NCHW ``x`` by ``(C, 1, k, k)`` ``w``, zero padding k // 2."""
    k = w.shape[-1]
    pad = np.pad(x, ((0, 0), (0, 0), (k // 2,) * 2, (k // 2,) * 2))
    out = (x.shape[2] + 2 * (k // 2) - k) // stride + 1
    y = np.zeros((1, x.shape[1], out, out), "float64")
    for i in range(k):
        for j in range(k):
            window = pad[:, :, i:i + stride * out:stride, j:j + stride * out:stride]
            y += window * w[None, :, 0, i, j, None, None]
    return y


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_timed_kernel_is_the_depthwise_convolution(layout, stride):
    channels, size, kernel = 24, 11, 3
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    mod = depthwise_shares.program(channels, size, kernel, stride, layout)
    kernel = one_kernel(mod, target)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for s in kernel.shapes]
    x, w = args[0], args[1]
    tensors = [tvm.runtime.tensor(a) for a in args]
    kernel.module[kernel.name](*tensors)
    got = tensors[-1].numpy()
    if layout == "NHWC":  # HWOI weights, NHWC images
        x, w, got = x.transpose(0, 3, 1, 2), w.transpose(2, 3, 0, 1), got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, _reference(x, w, stride), rtol=1e-4, atol=1e-4)


def test_the_shares_are_the_fitted_form(monkeypatch):
    """Each share is FLOPs / seconds / peak over the K term; a kernel that ran at exactly the
    peak gives ``(K + K0) / K``."""
    from tvm_costfuse.schedules.efficiency import K0

    calls = []

    def at_peak(channels, size, kernel, stride, layout, target, repeat, ms):
        calls.append((layout, stride))
        out = (size + 2 * (kernel // 2) - kernel) // stride + 1
        return 2.0 * channels * kernel * kernel * out * out / 1e11

    monkeypatch.setattr(depthwise_shares, "seconds", at_peak)
    figures = depthwise_shares.measure(None, 1e11, 1, 1)
    assert sorted(figures) == sorted(depthwise_shares.FIGURES)
    kernels = {s: [k for _c, _n, k in shapes] for s, shapes in depthwise_shares.SHAPES.items()}
    for name, value in figures.items():
        taps = [k * k for k in kernels[int(name[-1])]]
        expect = np.exp(np.mean([np.log((t + K0) / t) for t in taps]))
        assert value == pytest.approx(expect), name
    assert len(calls) == 2 * sum(len(v) for v in depthwise_shares.SHAPES.values())


def test_the_records_figures_are_the_ones_the_host_reads():
    from tvm_costfuse.targets import machine

    assert depthwise_shares.FIGURES == machine.SHARE_FIGURES
