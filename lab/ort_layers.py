"""Where ONNX Runtime is faster, kernel by kernel: a corpus model's per-call kernel times in
our build beside ONNX Runtime's per-node times, both taken inside the whole model run.

Our kernels are timed around their VM calls (``vm.set_instrument``), ONNX Runtime's nodes by
its own profiler (``SessionOptions.enable_profiling``). The two runs do not split the graph
the same way (ORT fuses conv + activation; CostFuse fuses more, FuseOps' groups, ``--strategy
tvm``, about as much), so rows are matched by output shape, in order: each of our kernels with the ORT nodes from the last match up to the first
node whose output has the kernel's output shape. Prints the largest gaps first, e.g.::

    python lab/ort_layers.py mobilenet_v2 --threads 1 --top 20
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

import numpy as np
import tvm
from tvm import relax

from tvm_costfuse.report.bench import workload
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target


def our_calls(ex, inputs, runs: int) -> list[tuple[str, tuple, float]]:
    """(symbol, output shape, median seconds) per kernel call of ``main``, in call order."""
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(v, dev) for v in inputs.values()]
    vm = relax.VirtualMachine(ex, dev)
    trace: list[tuple[str, tuple, float]] = []
    start = [0.0]

    def instrument(_func, symbol, before_run, _ret, *call_args) -> int:
        if symbol.startswith("vm."):
            return 0
        if before_run:
            start[0] = time.perf_counter()
        else:
            trace.append((symbol, tuple(call_args[-1].shape), time.perf_counter() - start[0]))
        return 0

    vm.set_instrument(instrument)
    runs_out = []
    for _ in range(runs + 2):
        trace.clear()
        vm["main"](*args)
        runs_out.append(list(trace))
    runs_out = runs_out[2:]
    return [(s, shape, float(np.median([r[i][2] for r in runs_out])))
            for i, (s, shape, _) in enumerate(runs_out[0])]


def ort_nodes(path: str, inputs, threads: int, runs: int) -> list[tuple[str, str, tuple, float]]:
    """(node name, op type, output shape, median seconds) per ORT node, in run order."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(os.path.dirname(path), "ort_prof")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {i.name: v for i, v in zip(sess.get_inputs(), inputs.values())}
    for _ in range(runs + 2):
        sess.run(None, feed)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    per_node: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, tuple[str, tuple]] = {}
    order: list[str] = []
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in meta:
            order.append(name)
            shapes = e["args"].get("output_type_shape", [{}])
            shape = tuple(next(iter(shapes[0].values()), ())) if shapes else ()
            meta[name] = (e["args"].get("op_name", "?"), shape)
        per_node[name].append(e["dur"] * 1e-6)
    return [(n, meta[n][0], meta[n][1], float(np.median(per_node[n][2:] or per_node[n])))
            for n in order]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--strategy", default="costfuse")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    w = workload(args.model)
    target = host_target(args.threads)
    ex = tvm.compile(w.mod, target, relax_pipeline=strategy_pipeline(args.strategy, target),
                     tir_pipeline=tir_pipeline(args.strategy))
    ours = our_calls(ex, w.inputs, args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        w.onnx(path)
        theirs = ort_nodes(path, w.inputs, args.threads, args.runs)
    rows, j = [], 0
    for symbol, shape, sec in ours:
        k = j
        while k < len(theirs) and theirs[k][2] != shape:
            k += 1
        if k == len(theirs):
            rows.append((symbol, shape, sec, [], 0.0))
            continue
        group = theirs[j:k + 1]
        rows.append((symbol, shape, sec, [g[1] for g in group], sum(g[3] for g in group)))
        j = k + 1
    total_ours = sum(r[2] for r in rows)
    total_theirs = sum(t[3] for t in theirs)
    print(f"{args.model} @{args.threads}: our kernels {total_ours * 1e3:.2f} ms, "
          f"ORT nodes {total_theirs * 1e3:.2f} ms (unmatched ORT nodes "
          f"{sum(t[3] for t in theirs[j:]) * 1e3:.2f} ms)")
    rows.sort(key=lambda r: (r[4] - r[2]) if r[3] else 0.0)
    for symbol, shape, sec, ops, ort_sec in rows[: args.top]:
        print(f"  ours {sec * 1e6:8.1f} us  ORT {ort_sec * 1e6:8.1f} us  {shape!s:22s} "
              f"{symbol[:40]:40s} {'+'.join(ops)[:40]}")


if __name__ == "__main__":
    main()
