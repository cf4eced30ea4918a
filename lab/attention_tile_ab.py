"""The attention kernel's scores tile as ``attention.key_tile_vectors`` picks it against the
rule of before (the widest tile the budget allows), fused kernels only, with the split kernels
beside them, interleaved at one thread; outputs compared. Cases as ``bench_attention.py``'s::

    python3 lab/attention_tile_ab.py 1,1,49,32,plain,3136 1,1,49,64,plain,3136
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from bench_attention import _builds
from tvm_costfuse.schedules import attention

from tvm_costfuse.measurement.peers import thread_pool
from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.targets import host_target
from tvm_costfuse.testing import attention_program


def _widest(keys: int, lanes: int, rows: int, budget: int) -> int:
    """The rule before: double the width while the budget and the key row allow."""
    vectors = 1
    while vectors < 4 and 2 * vectors * rows <= budget and 2 * vectors * lanes <= keys:
        vectors *= 2
    return vectors


def main() -> None:
    target = host_target(1)
    thread_pool(1)
    new = attention.key_tile_vectors
    for case in sys.argv[1:]:
        b, h, s, d, form, rows = case.split(",")
        mod, inputs = attention_program(int(b), int(h), int(s), int(d), form, rows=int(rows))
        attention.key_tile_vectors = _widest
        try:
            old, _ = _builds(mod, target)
        finally:
            attention.key_tile_vectors = new
        fused, split = _builds(mod, target)
        np.testing.assert_allclose(run(fused, inputs)[0], run(old, inputs)[0],
                                   rtol=1e-4, atol=1e-5)
        samples = interleave({"old": vm_sampler(old, inputs), "new": vm_sampler(fused, inputs),
                              "split": vm_sampler(split, inputs)}, 7)
        us = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
        print(case, " ".join(f"{k}={v:.1f}us" for k, v in us.items()),
              f"old/new={us['old'] / us['new']:.2f}", flush=True)


if __name__ == "__main__":
    main()
