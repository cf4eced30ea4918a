"""A channels-last to NCHW transpose (1 x 56 x 56 x 128) scheduled as the fallback does (the
output row vectorized: each vector gathers 16 channels' values 512 bytes apart) against a
tiled transpose (a t x t block of pixels x channels read into registers as vectors along the
channels, written back as vectors along the pixels), 1 thread, interleaved; a probe for the
transposes the layout step places around the convolutions it leaves NCHW::

    python lab/transpose_tile_probe.py
"""
import numpy as np
import tvm
from tvm import s_tir, te

from tvm_costfuse import host_target
from tvm_costfuse.measurement.timing import call_sampler, interleave

tg = host_target(1)
H=W=56; C=128
X = te.placeholder((1,H,W,C), name="x")
T = te.compute((1,C,H,W), lambda n,c,h,w: X[n,h,w,c], name="T")
def base():
    sch = s_tir.Schedule(te.create_prim_func([X,T]))
    b = sch.get_sblock("T"); n,c,h,w = sch.get_loops(b)
    _wo, wi = sch.split(w, [None, 8]); f = sch.fuse(n,c,h); sch.parallel(f); sch.vectorize(wi)
    return sch.mod["main"]
def tiled(t=16):
    sch = s_tir.Schedule(te.create_prim_func([X,T]))
    b = sch.get_sblock("T"); n,c,h,w = sch.get_loops(b)
    p = sch.fuse(h, w)
    co, ci = sch.split(c, [None, t]); po, pi = sch.split(p, [None, t])
    sch.reorder(n, po, co, ci, pi)
    loc = sch.cache_read(b, 0, "local")
    sch.compute_at(loc, co)
    ll = sch.get_loops(loc)
    sch.vectorize(ll[-1]); sch.unroll(ll[-2])
    sch.unroll(ci); sch.vectorize(pi)
    f = sch.fuse(n, po); sch.parallel(f)
    return sch.mod["main"]
x = np.random.rand(1,H,W,C).astype("float32")
want = x.transpose(0,3,1,2)
dev = tvm.cpu(); S = {}
for name, fn in (("base", base()), ("tiled16", tiled(16)), ("tiled8", tiled(8))):
    lib = tvm.compile(fn, tg)
    a = tvm.runtime.tensor(x, dev); o = tvm.runtime.empty((1,C,H,W), "float32", dev)
    lib(a, o); np.testing.assert_array_equal(o.numpy(), want)
    S[name] = call_sampler(lambda l=lib, a=a, o=o: l(a, o))
R = interleave(S, 5)
for k, v in R.items(): print(k, f"{np.median(v)*1e6:.1f} us", f"{2*x.nbytes/np.median(v)/1e9:.1f} GB/s")
