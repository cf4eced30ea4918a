"""Sibling matmuls on one input, alone: apart (one kernel each) against one matmul of the
concatenated weights (``tvm_costfuse.siblings``), interleaved at the given thread count.

``one`` returns the combined output itself (the slices read in place by their consumers),
``one+copies`` each sibling's slice as its own output (the slices left as copy kernels): the
two bounds of what a model sees. Outputs are checked against ``apart``. Cases are
``M,K,N1+N2[+N3...][,bias]``::

    python3 lab/siblings_kernel_ab.py --threads 1 1,768,768+768+768 128,768,3072+3072
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax

from tvm_costfuse import strategy_pipeline, tir_pipeline
from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.siblings import combine_siblings
from tvm_costfuse.targets import host_target


def program(m: int, k: int, widths: list[int], bias: bool, combined: bool, seed: int = 0):
    """``x @ W_i (+ b_i)`` for each width, as the torch frontend writes a linear layer; with
    ``combined``, one matmul by the weights concatenated, its whole output returned."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal((n, k)).astype("float32") / np.sqrt(k) for n in widths]
    biases = [rng.standard_normal(n).astype("float32") for n in widths]
    if combined:
        weights, biases = [np.concatenate(weights)], [np.concatenate(biases)]
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for w, b in zip(weights, biases):
                y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w)))))
                if bias:
                    y = bb.emit(relax.op.add(relax.const(b), y))
                outs.append(y)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    inputs = {"x": rng.standard_normal((m, k)).astype("float32")}
    return bb.get(), inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="M,K,N1+N2[+...][,bias]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    target = host_target(args.threads)
    thread_pool(args.threads)
    for case in args.cases:
        m, k, widths, *flags = case.split(",")
        widths = [int(n) for n in widths.split("+")]
        bias = "bias" in flags
        builds, outs = {}, {}
        for label in ("apart", "one", "one+copies"):
            mod, inputs = program(int(m), int(k), widths, bias, label == "one")
            if label == "one+copies":
                mod, found = combine_siblings(mod)
                assert len(found) == 1 and found[0].combine, found
            ex = tvm.compile(mod, target=target,
                             relax_pipeline=strategy_pipeline("costfuse", target),
                             tir_pipeline=tir_pipeline())
            calls: list = []
            outs[label] = run(ex, inputs, calls=calls)
            builds[label] = (ex, len(calls))
        want = np.concatenate(outs["apart"], axis=-1)
        for label in ("one", "one+copies"):
            got = np.concatenate(outs[label], axis=-1)
            assert np.array_equal(got, want), f"{case} {label}: outputs differ"
        samples = interleave({k: vm_sampler(ex, inputs) for k, (ex, _) in builds.items()},
                             args.repeat)
        us = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
        print(f"{case} threads={args.threads} kernels="
              + "/".join(str(n) for _, n in builds.values()) + " "
              + " ".join(f"{k}={v:.1f}us" for k, v in us.items())
              + f" apart/one={us['apart'] / us['one']:.3f}"
              f" apart/one+copies={us['apart'] / us['one+copies']:.3f}", flush=True)


if __name__ == "__main__":
    main()
