"""Where a corpus model's time goes: per-kernel seconds of one strategy's build, largest first.

Each kernel's time is taken around its VM call (``vm.set_instrument``), less the instrument's
own cost per call (``fusion_bound._kernel_seconds``), median over ``--runs`` runs; the
kernels' sum is printed against the uninstrumented wall time. Kernels are grouped by name
with the trailing copy number dropped (TVM names the PrimFuncs of one op chain
``fused_conv1d_gelu``, ``fused_conv1d_gelu1``, ..: one line per op chain, with how many
distinct kernels it has), e.g.::

    python lab/kernel_profile.py wav2vec2 --threads 1 --top 15
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

import tvm

sys.path.insert(0, os.path.dirname(__file__))
from fusion_bound import _kernel_seconds, _wall

from tvm_costfuse.models import corpus
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--strategy", default="costfuse")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()

    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    mod, inputs, _ = corpus.load(args.model, small=args.small)
    ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline(args.strategy, target),
                     tir_pipeline=tir_pipeline(args.strategy))
    per_symbol = _kernel_seconds(ex, inputs, args.runs)
    kinds: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for symbol, seconds in per_symbol.items():
        kind = re.sub(r"\d+$", "", symbol).rstrip("_")
        kinds[kind] += seconds
        count[kind] += 1
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    wall = _wall(vm, [tvm.runtime.tensor(v, tvm.cpu()) for v in inputs.values()], args.runs)
    total = sum(kinds.values())
    print(f"{args.model} ({'small' if args.small else 'full'}), {args.strategy}, "
          f"{args.threads} thread(s), load average {os.getloadavg()[0]:.2f}: "
          f"wall {wall * 1e3:.2f} ms, kernels {total * 1e3:.2f} ms")
    for kind, seconds in kinds.most_common(args.top):
        print(f"  {seconds * 1e3:8.3f} ms {seconds / total:6.1%}  x{count[kind]:<3d} {kind}")


if __name__ == "__main__":
    main()
