"""Transposes that move the innermost axis: the tiled rule (``schedules/transpose.py``) against
the fallback's vectorized output row, one process, interleaved; outputs checked exactly::

    python lab/transpose_ab.py [THREADS]
"""
import sys

import numpy as np
import tvm
from tvm import relax
from tvm_costfuse.schedules import transpose as TP

from tvm_costfuse import host_target, tir_pipeline
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.strategies import strategy_pipeline

tg = host_target(int(sys.argv[1]) if len(sys.argv) > 1 else 1); tvm.get_global_func("runtime.config_threadpool")(1, int(sys.argv[1]) if len(sys.argv) > 1 else 1)
cases = [((1,16384,32),(0,2,1)), ((1,32,16384),(0,2,1)), ((1,1024,160),(0,2,1)), ((1,160,1024),(0,2,1)), ((1,32,128,128),(0,2,3,1)), ((1,56,56,128),(0,3,1,2)), ((1,128,56,56),(0,2,3,1)), ((1,3136,64),(0,2,1)), ((1,64,3136),(0,2,1)), ((2,12,197,64),(0,2,1,3)), ((1,7,5,9),(0,3,1,2)), ((8,16),(1,0))]
S={}
for shape, perm in cases:
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main",[x]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.permute_dims(x, perm))
        bb.emit_func_output(gv)
    mod = bb.get()
    data = {"x": np.random.rand(*shape).astype("float32")}
    for tag, on in (("old", False), ("new", True)):
        orig = TP._transposed
        if not on: TP._transposed = lambda *a: None
        try:
            ex = tvm.compile(mod, tg, relax_pipeline=strategy_pipeline("tvm", tg), tir_pipeline=tir_pipeline())
        finally:
            TP._transposed = orig
        np.testing.assert_array_equal(run(ex, data)[0], data["x"].transpose(perm))
        S[(shape, perm, tag)] = vm_sampler(ex, data)
R = interleave(S, 3)
for shape, perm in cases:
    a = np.median(R[(shape,perm,"old")]); b = np.median(R[(shape,perm,"new")])
    print(shape, perm, f"old {a*1e6:.1f} us new {b*1e6:.1f} us  {a/b:.2f}x")
