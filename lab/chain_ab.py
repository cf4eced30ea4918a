"""A/B of ``schedules/chain.py``: a 1x1 conv (+ bias + ReLU6) feeding a depthwise conv (+ bias +
ReLU6) as one kernel against the two kernels FuseOps' grouping gives, on the MobileNetV2 / V3
and EfficientNet shapes, interleaved, numerics checked between them::

    python3 lab/chain_ab.py --threads 1 --repeat 7
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import tvm
from tvm import relax

from tvm_costfuse.graph import build_graph
from tvm_costfuse.partition import apply_partition
from tvm_costfuse.pipelines import scheduled_pipeline
from tvm_costfuse.strategies import tir_pipeline
from tvm_costfuse.targets import host_target

# (input channels, expanded channels, image, kernel, stride)
CASES = [(16, 96, 112, 3, 2), (24, 144, 56, 3, 1), (24, 144, 56, 3, 2), (32, 192, 28, 3, 1),
         (32, 192, 28, 3, 2), (64, 384, 14, 3, 1), (96, 576, 14, 3, 1), (96, 576, 14, 3, 2),
         (160, 960, 7, 3, 1), (40, 240, 28, 5, 1), (80, 480, 14, 5, 1), (112, 672, 14, 5, 2),
         (192, 1152, 7, 5, 1)]


def activation(x, act):
    """ReLU6 (MobileNetV2) or SiLU (EfficientNet: a sigmoid per element in both kernels)."""
    if act == "silu":
        return relax.op.multiply(x, relax.op.sigmoid(x))
    return relax.op.clip(x, 0.0, 6.0)


def block(ic, cm, size, k, stride, rng, act="relu6"):
    """The pair as Relax (constant weights), and an input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, ic, size, size), "float32"))

    def const(*shape, scale=1.0):
        return relax.const((rng.standard_normal(shape) * scale).astype(np.float32))

    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.nn.conv2d(x, const(cm, ic, 1, 1, scale=ic ** -0.5)))
            e = bb.emit(activation(relax.op.add(e, const(1, cm, 1, 1)), act))
            d = bb.emit(relax.op.nn.conv2d(e, const(cm, 1, k, k, scale=1.0 / k),
                                           strides=stride, padding=k // 2, groups=cm))
            d = bb.emit(activation(relax.op.add(d, const(1, cm, 1, 1)), act))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, ic, size, size)).astype(np.float32)


def groups_pass(split: bool):
    """Fuse the first six bindings as one group, or as FuseOps does (conv + epilogue each)."""

    @tvm.transform.module_pass(opt_level=0, name="ForcedGroups")
    def forced(mod, _ctx):
        names = [n.name for n in build_graph(mod, "main").nodes][:-1]
        half = len(names) // 2
        return apply_partition(mod, [names[:half], names[half:]] if split else [names])

    return forced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cases", nargs="*", default=None,
                    help="cases as IC,CM,SIZE,K,STRIDE (default: the built-in list)")
    ap.add_argument("--act", choices=("relu6", "silu"), default="relu6")
    args = ap.parse_args()
    cases = [tuple(int(v) for v in c.split(",")) for c in args.cases] if args.cases else CASES
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    rng = np.random.default_rng(0)
    print(f"{target}  load {os.getloadavg()[0]:.2f}")
    ratios = []
    for ic, cm, size, k, stride in cases:
        mod, x = block(ic, cm, size, k, stride, rng, args.act)
        vms = {}
        for name, split in (("split", True), ("chain", False)):
            ex = tvm.compile(mod, target, relax_pipeline=scheduled_pipeline(
                target, groups_pass(split)), tir_pipeline=tir_pipeline())
            vms[name] = relax.VirtualMachine(ex, tvm.cpu())
        xt = tvm.runtime.tensor(x)
        outs = {k_: vm["main"](xt).numpy() for k_, vm in vms.items()}
        err = np.abs(outs["chain"] - outs["split"]).max() / np.abs(outs["split"]).max()
        times = {k_: [] for k_ in vms}
        for _ in range(args.repeat):
            for k_, vm in vms.items():
                times[k_].append(vm.time_evaluator("main", tvm.cpu(), number=20)(xt).mean)
        med = {k_: float(np.median(v)) for k_, v in times.items()}
        ratios.append(med["split"] / med["chain"])
        print(f"{ic:4d}->{cm:4d} {size:3d}x{size:<3d} k{k} s{stride}: split "
              f"{med['split'] * 1e3:7.3f} ms  chain {med['chain'] * 1e3:7.3f} ms  "
              f"split/chain {ratios[-1]:5.2f}  err {err:.1e}", flush=True)
    print(f"geomean split/chain {float(np.exp(np.mean(np.log(ratios)))):.3f}  "
          f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
