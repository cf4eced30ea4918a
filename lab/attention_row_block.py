"""The fused attention kernel at several row-block budgets (``attention.ROW_BLOCK_BYTES``,
and ``_MAX_SUBTILES``), against the split kernels, interleaved in one process.

Each variant is ``KIB[:SUBTILES]``: the rule is rebuilt with its buffers sized to KIB KiB
(``1``: one query row per block at every key length; ``32``: the L1-sized blocks the rule
had before). The outputs are checked against the split kernels'.

    python lab/attention_row_block.py --threads 1 32,256,1024 1,8,4096,64,plain
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import tvm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
from bench_attention import _builds
from tvm_costfuse.schedules import attention

from tvm_costfuse.measurement.timing import interleave, run, vm_sampler
from tvm_costfuse.targets import host_target
from tvm_costfuse.testing import attention_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", help="KIB[:SUBTILES],...")
    parser.add_argument("cases", nargs="+", help="B,H,S,D,FORM")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    target = host_target(args.threads)
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    for case in args.cases:
        *dims, form = case.split(",")
        mod, inputs = attention_program(*map(int, dims), form)
        samplers, want = {}, None
        for variant in args.variants.split(","):
            kib, _, subtiles = variant.partition(":")
            attention.ROW_BLOCK_BYTES = int(kib) * 1024
            attention._MAX_SUBTILES = int(subtiles or 4)
            fused, split = _builds(mod, target)
            if want is None:
                want = run(split, inputs)[0]
                samplers["split"] = vm_sampler(split, inputs)
            np.testing.assert_allclose(run(fused, inputs)[0], want, rtol=1e-4, atol=1e-5)
            samplers[f"{variant}K"] = vm_sampler(fused, inputs)
        med = {k: float(np.median(x)) * 1e3 for k, x in interleave(samplers, args.repeat).items()}
        print(f"{case} threads={args.threads} "
              + " ".join(f"{k}={v:.2f}ms" for k, v in med.items()), flush=True)


if __name__ == "__main__":
    main()
