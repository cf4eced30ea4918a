"""A/B: fused groups whose kernels three scheduling choices change, with the choices ("new")
and without them, undone in-process ("old"), every kernel timed interleaved.

The choices (``schedules/_loops.py``, ``_common.py``, ``reduction.py``):
- broadcast axes run right above the vector loop (``_loops._broadcast_loops``);
- the fallback keeps a producer of several tensors out of a transpose that reads it
  (``inline_spatial(materialize_transposed=True)``);
- a concat read more than once is not inlined, and a row reduction computes it once per row
  in partitioned vectors (``_common.load_selections``, ``reduction.selects_loads``).

Each pair is ``MODEL:LEFT/RIGHT`` (comma-separated members of a corpus model); its union, left
and right kernels are built from the model as the feedback loop builds them, for each variant,
outputs of the two variants' union kernels compared, and all six timed in interleaved rounds
at one thread::

    python lab/injective_ab.py falcon:lv60,lv66,lv67/lv70 \\
        llama:lv72,lv78,lv79/lv73,lv76,lv77 swin_t:lv220/lv221
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager

os.environ.setdefault("TVM_COSTFUSE_CALIBRATION", "none")

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from tvm_costfuse import build_graph, host_target  # noqa: E402
from tvm_costfuse.measurement.timing import interleave  # noqa: E402
from tvm_costfuse.models import corpus  # noqa: E402
from tvm_costfuse.pipelines import prepare  # noqa: E402
from tvm_costfuse.schedules import _common, _loops, cpu, reduction, schedule_pass  # noqa: E402
from tvm_costfuse.tuning.feedback import group_kernel_and_outputs  # noqa: E402


@contextmanager
def old_choices():
    """The three choices undone: no broadcast reorder, producers inlined into transposes,
    concats inlined into every reader."""
    saved = (_loops._broadcast_loops, cpu.inline_spatial, _common.load_selections,
             reduction.selects_loads)
    _loops._broadcast_loops = lambda sch, block, loops: []
    cpu.inline_spatial = lambda sch, protect=None, materialize_transposed=False: saved[1](sch)
    _common.load_selections = lambda node: (False, False)
    reduction.selects_loads = lambda node, both=False: False
    try:
        yield
    finally:
        (_loops._broadcast_loops, cpu.inline_spatial, _common.load_selections,
         reduction.selects_loads) = saved


def _kernel(prep, graph, members, target):
    """(time sampler, output array after one call) of one group's kernel on random inputs."""
    func, n_out = group_kernel_and_outputs(prep, graph, members)
    with target:
        mod = schedule_pass(target)(tvm.IRModule({"main": func.with_attr("global_symbol",
                                                                          "main")}))
    rt = tvm.compile(mod, target=target).mod
    dev, rng = tvm.cpu(), np.random.default_rng(0)
    args = []
    for buf in mod["main"].params:
        shape = [int(d) for d in buf.shape]
        data = (rng.uniform(-1, 1, shape) if "float" in str(buf.dtype) else np.zeros(shape))
        args.append(tvm.runtime.tensor(data.astype(str(buf.dtype)), dev))
    rt["main"](*args)
    timer = rt.time_evaluator("main", dev, number=5, repeat=1, min_repeat_ms=20)
    return (lambda: timer(*args).mean), args[-1].numpy().copy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", metavar="MODEL:LEFT/RIGHT")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    target = host_target(1)
    tvm.get_global_func("runtime.config_threadpool")(1, 1)
    loaded = {}
    for spec in args.pairs:
        model, parts = spec.split(":")
        left, right = (p.split(",") for p in parts.split("/"))
        if model not in loaded:
            mod, _, _ = corpus.load(model)
            prep = prepare(mod, target)
            loaded = {model: (prep, build_graph(prep))}
        prep, graph = loaded[model]
        samplers, outs = {}, {}
        for variant in ("old", "new"):
            for part, members in (("union", left + right), ("left", left), ("right", right)):
                if variant == "old":
                    with old_choices():
                        sampler, out = _kernel(prep, graph, members, target)
                else:
                    sampler, out = _kernel(prep, graph, members, target)
                samplers[f"{variant} {part}"] = sampler
                outs[f"{variant} {part}"] = out
        diff = float(np.abs(outs["old union"] - outs["new union"]).max())
        med = {k: float(np.median(v)) * 1e6 for k, v in interleave(samplers, args.rounds).items()}
        print(f"{spec}  (max |old - new| of the union's output: {diff:.1e})")
        for variant in ("old", "new"):
            u, lt, rt = (med[f"{variant} {p}"] for p in ("union", "left", "right"))
            print(f"  {variant}: union {u:8.1f} us, left {lt:8.1f} + right {rt:8.1f} us, "
                  f"fusion gain {(lt + rt - u) / (lt + rt):+.2f}")


if __name__ == "__main__":
    main()
