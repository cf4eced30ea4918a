"""The depthwise kernels' shares of the FMA peak on this host, one per layout and stride.

A depthwise convolution has no tile search that the cost model could count cycles of
(``schedules/efficiency.py``): its price is the FMA peak times a fitted share. The share is a
property of the host more than of the shape: the NCHW kernel (``schedules/depthwise.py``,
vectorized along image rows, a deinterleaving pass at stride 2) reached 0.70 / 0.32 of the peak
over the K term on a znver4 core and 0.30 / 0.10 on a rocketlake one, while the channels-last
kernel (``depthwise_nhwc.py``) reached 0.82 / 0.44 on the latter. Priced with one host's
shares, the other host's layout decision (``layouts.py``) compared a mispriced NCHW plan with
a rightly priced NHWC one. So the calibration builds both kernels with our schedules on two
shapes per stride (an early inverted-residual block: a large image of few channels; a late
one: a small image of many) and measures their share here, with the calibration's own cores
and FMA peak; ``efficiency.fraction_of_peak`` prices with them where a record has them.

Each share is ``FLOPs / seconds / peak / (K / (K + K0))``, geomean over the shapes: the form
``efficiency.E_DEPTHWISE`` and ``E_CHANNELS_LAST`` were fitted in. Kernels are built with
FuseOps' grouping (a conv and its pad in one kernel) and timed as PrimFuncs, without the VM.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..targets.machine import SHARE_FIGURES
from .kernel_time import kernel_seconds, one_kernel

#: (channels, image side, kernel side) of the shapes timed, by stride.
SHAPES = {1: ((144, 56, 3), (480, 14, 5)), 2: ((96, 112, 3), (192, 28, 3))}
#: The record's figure names, in the order of ``TargetDesc.depthwise_shares``.
FIGURES = SHARE_FIGURES


def program(channels: int, size: int, kernel: int, stride: int, layout: str) -> tvm.IRModule:
    """One depthwise convolution with zero padding ``kernel // 2``, as ``layouts.py`` leaves
    one: NCHW with OIHW weights, or NHWC with HWOI weights (the channel contiguous)."""
    nchw = layout == "NCHW"
    shape = (1, channels, size, size) if nchw else (1, size, size, channels)
    weight_shape = (channels, 1, kernel, kernel) if nchw else (kernel, kernel, channels, 1)
    weight = np.random.default_rng(0).standard_normal(weight_shape).astype("float32")
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(
                x, relax.const(weight), strides=stride, padding=kernel // 2, groups=channels,
                data_layout=layout, kernel_layout="OIHW" if nchw else "HWOI"))
        bb.emit_func_output(out)
    return bb.get()


def seconds(channels: int, size: int, kernel: int, stride: int, layout: str,
            target: tvm.target.Target, repeat: int, min_repeat_ms: int) -> float:
    """Median seconds of one call of the kernel, its operands resident after a warm-up."""
    built = one_kernel(program(channels, size, kernel, stride, layout), target)
    return kernel_seconds(built, repeat, min_repeat_ms)


def measure(target: tvm.target.Target, peak: float, repeat: int, min_repeat_ms: int) -> dict:
    """The four figures of :data:`FIGURES`: each kernel's share of ``peak`` (the FMA chain's
    FLOP/s on the same cores) over the K term, geomean over :data:`SHAPES`."""
    from ..schedules.efficiency import K0

    figures = {}
    for layout, prefix in (("NCHW", "depthwise"), ("NHWC", "channels_last")):
        for stride, shapes in SHAPES.items():
            shares = []
            for channels, size, kernel in shapes:
                out = (size + 2 * (kernel // 2) - kernel) // stride + 1
                taps = kernel * kernel
                flops = 2.0 * channels * taps * out * out
                t = seconds(channels, size, kernel, stride, layout, target, repeat,
                            min_repeat_ms)
                shares.append(flops / t / peak / (taps / (taps + K0)))
            figures[f"{prefix}_s{stride}"] = math.exp(np.mean(np.log(shares)))
    return figures
